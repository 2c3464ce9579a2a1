"""``python -m bench backlog`` runs end to end on tiny backlogs.

Figures are not judged here (a benchmark on a loaded box says nothing a test should
assert); this proves the three sides drain, count and report, so a broken benchmark is
found by CI rather than by the next person to run it.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.__main__ import app
from bench.backlog import WindowStart, steady_rate, steady_window
from runfleet.ops.servers.resolve import Endpoints


def test_the_steady_rate_counts_from_the_tenth_percentile_to_the_last() -> None:
    # Ten completions, one a second after a slow start: 10 % done at t=100 s.
    times = [100_000.0 + 1000 * i for i in range(10)]
    assert steady_rate(times) == pytest.approx(1.0)
    # Eleven: the 10th percentile is the second completion; nine come after it.
    assert steady_rate([*times, 200_000.0]) == pytest.approx(9 / 99)


def test_the_steady_window_waits_for_the_last_worker_process_to_start() -> None:
    # Process a completes one run a second from t=0; b starts late, its first at t=5 s,
    # when 6 of 20 are done: the window starts there, not at the 10th percentile (t=1 s).
    done = [("a", 1000.0 * i) for i in range(10)] + [("b", 5000.0 + 500 * i) for i in range(10)]
    window = steady_window(done)
    assert window.starts is WindowStart.LAST_STARTED
    assert window.processes == 2
    after_b = sorted(t for _, t in done if t >= 5000.0)
    assert window.runs == len(after_b) - 1
    assert window.span_ms == after_b[-1] - 5000.0
    # Both started by 10 % done: the 10 % window, as steady_rate.
    early = [("a", 1000.0 * i) for i in range(10)] + [("b", 1000.0 * i + 1) for i in range(10)]
    assert steady_window(early).starts is WindowStart.TENTH
    assert steady_window(early).per_s == pytest.approx(steady_rate([t for _, t in early]))
    # A process whose first run is the last of all: nothing to wait for, flagged.
    late = [("a", 1000.0 * i) for i in range(10)] + [("b", 20_000.0)]
    assert steady_window(late).starts is WindowStart.TENTH_LATE
    assert steady_window(late).per_s == pytest.approx(steady_rate([t for _, t in late]))


@pytest.mark.timeout(600)
def test_backlog_bench_drains_every_depth_on_every_side(services: Endpoints) -> None:
    urls = ["--database-url", services.database_url, "--redis-url", services.redis_url]
    args = ["backlog", "--depths", "20,40", "--concurrency", "8", *urls, "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{") :])
    drains = {(d["system"], d["depth"]): d for d in out["drains"]}
    assert set(drains) == {(s, n) for s in ("runfleet", "rq", "celery") for n in (20, 40)}
    for (system, _depth), drain in drains.items():
        assert drain["steady_runs_per_s"] > 0, (system, drain)
        assert drain["processes_seen"] >= 1, (system, drain)
    assert out["postgres"]["fsync"] in ("on", "off"), out["postgres"]
    for depth in (20, 40):
        runfleet = drains[("runfleet", depth)]
        assert runfleet["messages_per_run"] == 1.0, runfleet
        assert runfleet["claim_lost"] == 0, runfleet
        assert runfleet["wal_records_per_run"] > 0, runfleet  # the server's counters moved
    assert ">= 2x Celery at 40" in out["targets"]


def test_the_profile_names_each_statement_by_its_sql_block() -> None:
    """``--profile`` reports pg_stat_statements rows by their ``store/sql`` block name: the
    text as psycopg sends it (``%(name)s`` become ``$n``) maps back to the block."""
    import re

    from bench.backlog import statement_name
    from runfleet.store.queries import q

    for name in ("runs.claim_and_activate_many", "runs.settle_many", "waits.notify_parents"):
        parts = re.split(r"%\(\w+\)s", q(name))
        sent = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))
        assert statement_name(sent) == name
    # Not one of ours: its first line of code, whitespace folded.
    assert statement_name("-- hello\nSELECT   1\n  FROM x") == "SELECT 1"


def test_profile_refuses_a_server_without_pg_stat_statements(services: Endpoints) -> None:
    urls = ["--database-url", services.database_url, "--redis-url", services.redis_url]
    args = ["backlog", "--depths", "20", "--systems", "runfleet", "--profile"]
    result = CliRunner().invoke(app, [*args, *urls])
    assert result.exit_code != 0
    assert "pg_stat_statements" in result.output
