-- runfleet schema v8: periodic schedules (store/schedules.py, store/sql/schedules.sql). One row
-- per schedule; firing a tick admits its run and advances next_tick_ms in one transaction.

CREATE TABLE runfleet.schedules (
    name            text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    flow            text NOT NULL,
    queue           text NOT NULL,
    cron            text NOT NULL,
    timezone        text NOT NULL,
    payload         json NOT NULL,
    scopes          jsonb NOT NULL DEFAULT '[]',
    catch_up        integer NOT NULL DEFAULT 0 CHECK (catch_up >= 0),
    overlap         text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip')),
    timeout_ms      bigint,
    max_rounds      integer,
    origin          text NOT NULL CHECK (origin IN ('decorator', 'cli')),
    paused          boolean NOT NULL DEFAULT false,
    next_tick_ms    bigint NOT NULL,
    last_tick_ms    bigint,
    last_run_id     text,
    admitted        bigint NOT NULL DEFAULT 0,
    missed          bigint NOT NULL DEFAULT 0,
    overlapped      bigint NOT NULL DEFAULT 0,
    created_at_ms   bigint NOT NULL,
    updated_at_ms   bigint NOT NULL
);
CREATE INDEX schedules_due_idx ON runfleet.schedules (next_tick_ms, name) WHERE NOT paused;

-- A schedule carries run data (the payload and scopes of every run it admits), so it is
-- scoped exactly like the runs it makes: workers see all (policy `true`), producers and
-- operators only schedules whose scopes their grants cover ('*' for an unscoped one).
ALTER TABLE runfleet.schedules ENABLE ROW LEVEL SECURITY;
CREATE POLICY schedules_fleet ON runfleet.schedules TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY schedules_scoped ON runfleet.schedules TO runfleet_producer, runfleet_operator
    USING ((SELECT runfleet.granted_scopes()) ? '*'
           OR (jsonb_typeof(scopes) = 'array'
               AND jsonb_array_length(scopes) > 0
               AND (SELECT runfleet.granted_scopes()) @> scopes));
