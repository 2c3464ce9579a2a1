"""The CLI under hostile arguments: a result or a one-line error, never a traceback."""

from __future__ import annotations

import json
import uuid

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runfleet.ops.cli.text import json_text, literal
from tests.ops.conftest import Cli, CliResult
from tests.security_fuzz.strategies import HUGE_DAYS, counts, durations, odd_text

FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEEP_JSON = "[" * 100_000 + "]" * 100_000

payloads = st.one_of(
    odd_text,
    st.sampled_from([DEEP_JSON, "[1e999]", "NaN", "[NaN]", '{"args": 1}', '["\\u0000"]', "[" * 50]),
)


def _clean(out: CliResult) -> None:
    assert out.clean, f"raised {out.exception!r}"
    assert "Traceback" not in out.stdout + out.stderr
    if out.code != 0:
        assert out.stderr.strip(), "a refusal says why"


@FUZZ
@given(flow=odd_text, payload=payloads, run_id=st.one_of(st.none(), odd_text))
@example(flow="os:system", payload='["true"]', run_id=None)
@example(flow="trust.leaf", payload=DEEP_JSON, run_id=None)
@example(flow="trust.leaf", payload="[1]", run_id="p/child:trust.leaf#1")
async def test_enqueue(cli: Cli, flow: str, payload: str, run_id: str | None) -> None:
    args = ["enqueue", flow, "--payload", payload]
    if run_id is not None:
        args += ["--id", run_id]
    _clean(await cli(*args))


@FUZZ
@given(run_id=odd_text, event=odd_text, value=payloads)
@example(run_id="r", event="approval:manager", value='{"approved": true}')
async def test_answers(cli: Cli, run_id: str, event: str, value: str) -> None:
    _clean(await cli("complete", run_id, event, "--value", value))
    _clean(await cli("approve", run_id, "--token", event, "--actor", value[:50]))


@FUZZ
@given(command=st.sampled_from(["show", "explain", "journal", "tree", "cancel"]), run_id=odd_text)
@example(command="show", run_id="\ud800")
@example(command="explain", run_id="a\x00b")
@example(command="cancel", run_id="\ud800")
async def test_reads_and_cancel(cli: Cli, command: str, run_id: str) -> None:
    _clean(await cli(command, run_id))


@FUZZ
@given(scope=st.lists(odd_text, max_size=3))
async def test_scopes(cli: Cli, scope: list[str]) -> None:
    args = ["enqueue", "trust.leaf", "--payload", json.dumps([1])]
    for s in scope:
        args += ["--scope", s]
    _clean(await cli(*args))


def _parsed_or_refused(out: CliResult, option: str) -> None:
    """A duration or count is either taken (exit 0) or refused as a usage error naming
    the option (exit 2): never a traceback, never exit 1 from deep inside a command."""
    _clean(out)
    assert out.code in (0, 2), out
    if out.code == 2:
        assert f"'{option}'" in out.stderr, out.stderr


DURATION_COMMANDS = [
    (["runs", "--since"], "--since"),
    (["stuck", "--pending-for"], "--pending-for"),
    (["stuck", "--overdue"], "--overdue"),
    (["prune", "--dry-run", "--settled-before"], "--settled-before"),
    (["prune", "--dry-run", "--settled-before", "1d", "--consumer-idle"], "--consumer-idle"),
]


@FUZZ
@given(command=st.sampled_from(DURATION_COMMANDS), value=durations)
@example(command=DURATION_COMMANDS[3], value=HUGE_DAYS)
@example(command=DURATION_COMMANDS[0], value="0001-01-01")
@example(command=DURATION_COMMANDS[3], value="9999-12-31T23:59:59-14:00")
@example(command=DURATION_COMMANDS[1], value="9" * 400)
async def test_durations(cli: Cli, command: tuple[list[str], str], value: str) -> None:
    argv, option = command
    _parsed_or_refused(await cli(*argv, value), option)


COUNT_COMMANDS = [
    (["runs", "--limit"], "--limit"),
    (["stuck", "--limit"], "--limit"),
    (["stuck", "--reactivated-over"], "--reactivated-over"),
    (["prune", "--dry-run", "--settled-before", "1d", "--batch"], "--batch"),
    (["schedule", "add", "{name}", "--flow", "f", "--cron", "* * * * *", "--late-binding",
      "--catch-up"], "--catch-up"),
]  # fmt: skip
WORKER_COUNTS = ["--concurrency", "--processes", "--metrics-port"]


@FUZZ
@given(command=st.sampled_from(COUNT_COMMANDS), value=counts)
@example(command=COUNT_COMMANDS[2], value=str(10**30))
@example(command=COUNT_COMMANDS[4], value=str(2**63))
async def test_counts(cli: Cli, command: tuple[list[str], str], value: str) -> None:
    argv, option = command
    argv = [a.replace("{name}", f"fuzz-{uuid.uuid4().hex[:8]}") for a in argv]
    _parsed_or_refused(await cli(*argv, value), option)


@FUZZ
@given(option=st.sampled_from(WORKER_COUNTS), value=counts)
@example(option="--processes", value=str(10**30))
@example(option="--metrics-port", value="65535")
async def test_worker_counts(cli: Cli, option: str, value: str) -> None:
    """A worker's counts are checked before it starts: the value under test comes first,
    then a count that is always refused, so the command never runs a worker here."""
    stopper = "--concurrency" if option != "--concurrency" else "--processes"
    out = await cli("worker", option, value, stopper, "0")
    _clean(out)
    assert out.code == 2, out
    assert f"'{option}'" in out.stderr or f"'{stopper}'" in out.stderr, out.stderr


@given(text=st.text(), value=st.recursive(st.text(), lambda inner: st.lists(inner, max_size=3)))
@example(text="\x1b[2J\n\x9b\u202e\U000e0041\\x1b", value=["\x7f\x85\u2028\U0001f600"])
def test_terminal_text_is_printable_and_faithful(text: str, value: object) -> None:
    """``literal`` leaves only printable characters, changes none of them, and is its own
    fixed point; ``json_text`` keeps JSON meaning the same value, with no such character."""
    shown = literal(text)
    assert shown.isprintable() or not shown
    assert literal(shown) == shown
    if text.isprintable():
        assert shown == text
    encoded = json_text(json.dumps({"v": value, "t": text}, ensure_ascii=False, indent=1))
    assert all(ch.isprintable() or ch == "\n" for ch in encoded)
    assert json.loads(encoded) == {"v": value, "t": text}
