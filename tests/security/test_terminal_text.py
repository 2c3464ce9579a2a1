"""Text a tenant stored reaches the operator's terminal literally (the CLI).

A producer chooses a run id with a C1 control (CSI, ``\\x9b``) and a right-to-left
override; its flow fails with an error whose text carries an OSC 8 hyperlink, a
clear-screen, a carriage return and a newline followed by a forged "next: …" line,
under an exception class whose very name is a control sequence; it denies an approval
with a reason that does the same, under an actor note with a C1 control. An operator
then reads both runs with every read command.
Whatever was stored must arrive as visible escapes (``\\x1b[2J``), never as bytes a
terminal acts on, and ``explain`` must still end with exactly one "next:" line: its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import runfleet.ops.cli
import runfleet.ops.explain
import tests.security.flows as sf
from runfleet.producer import AsyncQueue
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from runfleet.worker import Context, flow
from tests.ops.conftest import cli_env, invoke
from tests.security.conftest import MakeLogin
from tests.support.polling import until

FORGED = "next: nothing to do, the run completed"
HOSTILE = (
    "boom \x1b]8;;https://evil.example/\x07click here\x1b]8;;\x07 \x1b[2J\x1b[H"
    f"\rhidden\n{FORGED}\x9b31m red \u202eevil\u202c [bold]kept[/bold] :warning:"
)
RUN_ID = "tenant\x9b2J\u202e-text"
"""A valid run id (store.validate refuses only C0, DEL and surrogates)."""

Hostile = type("Evil\x1b[2JError", (Exception,), {})


@flow(name="sec.hostile_text")
async def hostile_text(ctx: Context, message: str) -> None:
    raise Hostile(message)


async def _asked(q: AsyncQueue, run_id: str) -> bool:
    row = await q.store.runs.get(run_id)
    waiting = row is not None and row.waiting is not None and row.waiting.reason == "approval"
    return waiting and run_id in sf.TOKENS


def _literal(out: str) -> list[str]:
    """Each printed line holds only printable characters: no ESC, no C1, no CR, no bidi."""
    lines = out.split("\n")
    for line in lines:
        bad = [hex(ord(ch)) for ch in line if not ch.isprintable()]
        assert not bad, f"raw control characters {bad} reached the terminal in {line!r}"
    return lines


@pytest.mark.usefixtures("role_worker")
async def test_stored_text_reaches_the_terminal_escaped(login: MakeLogin) -> None:
    producer = await login(GroupRole.PRODUCER, "s1")
    operator = await login(GroupRole.OPERATOR, "s1")
    async with AsyncQueue("default", settings=producer.settings, scopes=["s1"]) as q:
        failed = await q.enqueue(hostile_text, HOSTILE, run_id=RUN_ID)

        async def settled() -> bool:
            return await failed.get_status() is RunStatus.FAILED

        await until(settled, 15, "the hostile run to fail")
        asking = await q.enqueue("sec.approver", run_id=f"{RUN_ID}-2")
        await until(lambda: _asked(q, asking.id), 15, "the approval to be asked")
        await q.deny(asking.id, sf.TOKENS[asking.id], actor="ops\x9b2J\u202eman", reason=HOSTILE)
        assert await asking.result(timeout=15) == {"approved": False, "actor": producer.name}

    env = cli_env(operator.settings)
    explained = await invoke(env, "explain", RUN_ID)
    assert explained.code == 0 and explained.clean, explained
    lines = _literal(explained.stdout)
    assert [line for line in lines if line.startswith(("next:", "needs a person:"))] == [
        lines[-2]  # the last line printed (the output ends with a newline)
    ], explained.stdout
    error = next(line for line in lines if line.startswith("error:"))
    assert error == (
        r"error: Evil\x1b[2JError: boom \x1b]8;;https://evil.example/\x07click here"
        r"\x1b]8;;\x07 \x1b[2J\x1b[H\rhidden\nnext: nothing to do, the run completed"
        r"\x9b31m red \u202eevil\u202c [bold]kept[/bold] :warning:"
    )
    assert lines[0].startswith(r"run tenant\x9b2J\u202e-text (sec.hostile_text on queue")

    shown_id = r"tenant\x9b2J\u202e-text"
    for argv, expected in (
        (("show", RUN_ID), shown_id),
        (("journal", RUN_ID), r"settled failed"),
        (("tree", RUN_ID), shown_id),
        (("runs",), shown_id),
        (("explain", f"{RUN_ID}-2"), shown_id),
        (("journal", f"{RUN_ID}-2"), r"(note: ops\x9b2J\u202eman)"),
    ):
        seen = await invoke(env, *argv)
        assert seen.code == 0 and seen.clean, (argv, seen)
        _literal(seen.stdout)
        assert expected in seen.stdout, (argv, seen.stdout)
    journal = await invoke(env, "journal", f"{RUN_ID}-2")
    assert FORGED in journal.stdout and r"[H\rhidden\nnext:" in journal.stdout, journal.stdout
    assert "[bold]kept[/bold] :warning:" in journal.stdout, "markup and emoji codes stay text"
    missing = await invoke(env, "show", "no\x9bsuch\u202erun")
    assert missing.stderr.strip() == r"error: no run with id 'no\x9bsuch\u202erun'"


PRINTS = re.compile(
    r"\.print\(|\bprint\(|typer\.echo\(|sys\.std(out|err)|rich\.markup|\btable\.add_row\(|\bText\(|\bTree\("
)


def test_the_cli_prints_only_through_its_one_escaping_helper() -> None:
    """Every line a command prints is built by ``ops.cli.text`` (``say``, ``add_row``,
    ``tree``, ``fail``, ``emit``), so a new command or a new field cannot print stored
    text raw, or through rich markup, by forgetting to escape it."""
    found = []
    folders = (Path(runfleet.ops.cli.__file__).parent, Path(runfleet.ops.explain.__file__).parent)
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            if path.name in ("text.py", "common.py") and path.parent.name == "cli":
                continue
            for n, source in enumerate(path.read_text().splitlines(), 1):
                if PRINTS.search(source):
                    found.append(f"{path.name}:{n}: {source.strip()}")
    assert not found, "printing around runfleet.ops.cli.text:\n" + "\n".join(found)
