"""Prometheus metrics of a worker process (served on ``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CLAIM_OUTCOMES = Counter(
    "runfleet_claim_outcomes_total",
    "Decisions of the claim path, by outcome.",
    ["outcome"],
)
SETTLEMENTS = Counter(
    "runfleet_settlements_total", "Runs settled by this process, by final status.", ["status"]
)
STEALS = Counter("runfleet_steals_total", "Runs taken over, by probe evidence.", ["evidence"])
DEAD_LETTERED = Counter(
    "runfleet_dead_lettered_total",
    "Poison runs this process parked dead: stale again after max_recoveries takeovers in a row.",
)
RELEASES = Counter("runfleet_releases_total", "Runs released unsettled, by cause.", ["cause"])
LEASE_LAPSES = Counter("runfleet_lease_lapses_total", "Times this process's lease lapsed.")
LEASE_SKIPS = Counter(
    "runfleet_lease_skips_total",
    "Runs whose renewal skipped their row, locked by another transaction (once per episode).",
)
LEASE_RUN_LAPSES = Counter(
    "runfleet_lease_run_lapses_total",
    "Runs that lapsed alone: their row stayed locked past the lapse margin.",
)
INFRA_ERRORS = Counter(
    "runfleet_infrastructure_errors_total",
    "Database/Redis errors survived with a retry, by component.",
    ["component"],
)
STREAM_REPAIRS = Counter(
    "runfleet_stream_repairs_total",
    "Queue lanes this process found unable to deliver and repaired, by fault.",
    ["fault"],
)
SWEEP_DURATION = Histogram(
    "runfleet_sweep_duration_seconds", "Duration of one sweep of one kind.", ["kind"]
)
SWEEP_BATCH = Histogram(
    "runfleet_sweep_batch_size",
    "Rows one sweep acted on.",
    ["kind"],
    buckets=(0, 1, 2, 4, 8, 16, 32, 64),
)
STREAM_LAG = Gauge("runfleet_stream_lag", "Undelivered + unacknowledged stream entries.", ["queue"])
ENQUEUE_TO_START = Histogram(
    "runfleet_enqueue_to_start_seconds",
    "Database time from admission to first activation.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RUNS_IN_FLIGHT = Gauge("runfleet_runs_in_flight", "Runs this process is executing now.")
RETENTION_DELETED = Counter(
    "runfleet_retention_deleted_total", "Rows the retention loop deleted, by table.", ["table"]
)
RETENTION_LONGEST_BATCH = Histogram(
    "runfleet_retention_longest_batch_seconds",
    "Longest batch of each retention pass (the longest any lock it took was held).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
RETENTION_CONSUMERS_PRUNED = Counter(
    "runfleet_retention_consumers_pruned_total", "Dead stream consumers deleted."
)

SCHEDULE_TICKS = Counter(
    "runfleet_schedule_ticks_total",
    "Schedule ticks this process fired, by outcome (admitted, joined, missed, overlapped).",
    ["outcome"],
)
ABANDONED_STEP_THREADS = Gauge(
    "runfleet_abandoned_step_threads",
    "Sync step threads past their timeout that are still running "
    "(runfleet.worker.authoring.step_timeouts).",
)

# Queues that shape load (docs/how-to/queues.md), read by worker.queue_gauges every 5 s.
QUEUE_LIMIT = Gauge(
    "runfleet_queue_limit",
    "A served queue's configured limit (concurrency, rate_per_s, key_concurrency, "
    "key_rate_per_s); 0: none.",
    ["queue", "limit"],
)
QUEUE_SLOTS_IN_USE = Gauge(
    "runfleet_queue_slots_in_use", "Runs of a served queue executing now, fleet-wide.", ["queue"]
)
QUEUE_KEYS = Gauge(
    "runfleet_queue_keys",
    "Concurrency keys of a keyed served queue with runs executing (running) or waiting "
    "to start (waiting), among its next 100 turns.",
    ["queue", "state"],
)
QUEUE_RATE_WAIT = Gauge(
    "runfleet_queue_rate_wait_seconds",
    "Until a served queue's rate allows its next start (0: a token is there or no rate).",
    ["queue"],
)
