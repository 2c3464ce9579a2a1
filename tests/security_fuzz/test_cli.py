"""The CLI under hostile arguments: a result or a one-line error, never a traceback."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.ops.conftest import Cli, CliResult
from tests.security_fuzz.strategies import odd_text

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
