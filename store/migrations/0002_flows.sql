-- runfleet schema v2: durable flow calls (replay positions, compensations), the flow
-- registry producers check names against, and run deadlines.

ALTER TABLE runfleet.steps ADD COLUMN position integer NOT NULL DEFAULT 0;
ALTER TABLE runfleet.steps ADD COLUMN kind text NOT NULL DEFAULT 'step';
ALTER TABLE runfleet.steps ADD COLUMN compensate text;
ALTER TABLE runfleet.steps ADD COLUMN compensated_at_ms bigint;
ALTER TABLE runfleet.steps ALTER COLUMN position DROP DEFAULT;
ALTER TABLE runfleet.steps ALTER COLUMN kind DROP DEFAULT;
CREATE UNIQUE INDEX steps_position_idx ON runfleet.steps (run_id, position);

CREATE TABLE runfleet.flows (
    name            text PRIMARY KEY,
    queue           text NOT NULL,
    signature       text,
    registered_at_ms bigint NOT NULL,
    last_seen_ms    bigint NOT NULL
);

CREATE INDEX runs_deadline_idx ON runfleet.runs (((state->>'deadline_ms')::bigint))
    WHERE status IN ('pending', 'running', 'suspended') AND state ? 'deadline_ms'
      AND state->>'deadline_ms' IS NOT NULL;
