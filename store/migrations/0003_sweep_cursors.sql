-- runfleet schema v3: every sweep makes progress past rows it cannot take.
-- A cursor per sweep kind lives in Postgres (whichever worker wins a tick's advisory
-- lock continues where the last one stopped), and every sweep read is an index scan
-- over exactly its rows, so a batch costs a batch whatever sits in front of it.

CREATE TABLE runfleet.sweep_cursors (
    kind             text PRIMARY KEY,
    after_ms         bigint NOT NULL,
    after_id         text NOT NULL,
    after_name       text NOT NULL,
    through_ms       bigint,
    through_id       text,
    cycle_started_ms bigint,
    updated_at_ms    bigint NOT NULL
);

DROP INDEX runfleet.runs_stale_running_idx;
CREATE INDEX runs_stale_running_idx ON runfleet.runs (heartbeat_at_ms, id)
    WHERE status = 'running';
CREATE INDEX runs_released_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status = 'suspended' AND waiting_reason = 'released';
CREATE INDEX runs_due_wait_idx ON runfleet.runs (waiting_wake_at_ms, id)
    WHERE waiting_wake_at_ms IS NOT NULL AND waiting_reason IS NOT NULL
      AND waiting_reason <> 'quarantine' AND status IN ('pending', 'suspended');
CREATE INDEX runs_runnable_pending_idx ON runfleet.runs (created_at_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL;
-- The deadline sweep reads only runs no cancel has reached yet, in (deadline, id) order.
DROP INDEX runfleet.runs_deadline_idx;
CREATE INDEX runs_deadline_idx ON runfleet.runs (((state->>'deadline_ms')::bigint), id)
    WHERE status IN ('pending', 'running', 'suspended') AND cancel_requested_at_ms IS NULL
      AND state ? 'deadline_ms' AND state->>'deadline_ms' IS NOT NULL;
