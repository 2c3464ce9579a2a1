-- runfleet canonical schema: what applying every migration must yield (tests compare).
-- All times are epoch milliseconds from the database clock (runfleet.now_ms()).

CREATE SCHEMA IF NOT EXISTS runfleet;

CREATE OR REPLACE FUNCTION runfleet.now_ms() RETURNS bigint
    LANGUAGE sql VOLATILE AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE runfleet.runs (
    id                      text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    flow                    text NOT NULL CHECK (length(flow) BETWEEN 1 AND 255),
    queue                   text NOT NULL CHECK (length(queue) BETWEEN 1 AND 255),
    status                  text NOT NULL CHECK (status IN
                                ('pending', 'running', 'suspended', 'completed', 'failed', 'cancelled')),
    state                   jsonb NOT NULL DEFAULT '{}'::jsonb,
    owner_host              text,
    owner_pid               integer,
    owner_nonce             text,
    epoch                   bigint NOT NULL DEFAULT 0,
    heartbeat_at_ms         bigint,
    claim_host              text,
    claim_pid               integer,
    claim_nonce             text,
    claimed_at_ms           bigint,
    cancel_requested_at_ms  bigint,
    lineage_id              text NOT NULL,
    round_ordinal           integer NOT NULL DEFAULT 0,
    parent_run_id           text,
    created_at_ms           bigint NOT NULL,
    updated_at_ms           bigint NOT NULL,
    waiting_reason          text,
    waiting_wake_at_ms      bigint,
    waiting_token           text,
    waiting_request         jsonb,
    waiting_deferred        text,
    result                  json,  -- canonical text of a completed run's result (store/values.py)
    payload                 json,  -- canonical text of the run's arguments (store/values.py)
    CHECK ((owner_host IS NULL) = (owner_nonce IS NULL)),
    CHECK ((claim_host IS NULL) = (claimed_at_ms IS NULL)),
    CHECK (status <> 'running' OR owner_host IS NOT NULL)
);

CREATE UNIQUE INDEX runs_lineage_round_idx ON runfleet.runs (lineage_id, round_ordinal);
CREATE INDEX runs_stale_running_idx ON runfleet.runs (heartbeat_at_ms, id)
    WHERE status = 'running';
CREATE INDEX runs_waiting_idx ON runfleet.runs (waiting_reason, waiting_wake_at_ms)
    WHERE waiting_reason IS NOT NULL;
CREATE INDEX runs_pending_idx ON runfleet.runs (created_at_ms, id)
    WHERE status = 'pending';
CREATE INDEX runs_pending_flow_idx ON runfleet.runs (flow, created_at_ms, id)
    WHERE status = 'pending';
CREATE INDEX runs_cancel_pending_idx ON runfleet.runs (created_at_ms, id)
    WHERE cancel_requested_at_ms IS NOT NULL AND status IN ('pending', 'suspended');
CREATE INDEX runs_runnable_suspended_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status = 'suspended' AND waiting_reason IS NULL;
CREATE INDEX runs_owner_idx ON runfleet.runs (owner_host, owner_pid, owner_nonce)
    WHERE status = 'running';
CREATE INDEX runs_status_created_idx ON runfleet.runs (status, created_at_ms);

CREATE TABLE runfleet.journal (
    seq         bigserial PRIMARY KEY,
    run_id      text NOT NULL,
    kind        text NOT NULL,
    source_id   text NOT NULL,
    source_seq  bigint NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    digest      text NOT NULL,
    at_ms       bigint NOT NULL,
    UNIQUE (source_id, source_seq)
);
CREATE INDEX journal_run_idx ON runfleet.journal (run_id, seq);

CREATE TABLE runfleet.run_parents (
    child_id    text NOT NULL,
    parent_id   text NOT NULL,
    seq         bigserial NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    CHECK (child_id <> parent_id)
);
CREATE INDEX run_parents_parent_idx ON runfleet.run_parents (parent_id, seq);

CREATE TABLE runfleet.steps (
    run_id          text NOT NULL,
    key             text NOT NULL,
    name            text NOT NULL,
    output          json,  -- canonical text, kept verbatim (store/values.py)
    digest          text NOT NULL,
    epoch           bigint NOT NULL,
    recorded_at_ms  bigint NOT NULL,
    position        integer NOT NULL,
    kind            text NOT NULL,
    compensate      text,
    compensated_at_ms bigint,
    PRIMARY KEY (run_id, key)
);
CREATE UNIQUE INDEX steps_position_idx ON runfleet.steps (run_id, position);

CREATE TABLE runfleet.attempts (
    run_id          text NOT NULL,
    key             text NOT NULL,
    attempt         integer NOT NULL CHECK (attempt >= 1),
    started_at_ms   bigint NOT NULL,
    finished_at_ms  bigint,
    error           text,
    PRIMARY KEY (run_id, key, attempt)
);

CREATE TABLE runfleet.deferreds (
    run_id           text NOT NULL,
    name             text NOT NULL,
    value            json,
    metadata         jsonb,
    completed_at_ms  bigint NOT NULL,
    consumed_at_ms   bigint,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE runfleet.clocks (
    run_id           text NOT NULL,
    name             text NOT NULL,
    deferred_name    text NOT NULL,
    due_at_ms        bigint NOT NULL,
    completed_at_ms  bigint,
    PRIMARY KEY (run_id, name)
);
CREATE INDEX clocks_due_idx ON runfleet.clocks (due_at_ms, run_id, name)
    WHERE completed_at_ms IS NULL;

CREATE TABLE runfleet.flows (
    name            text PRIMARY KEY,
    queue           text NOT NULL,
    signature       text,
    registered_at_ms bigint NOT NULL,
    last_seen_ms    bigint NOT NULL
);


-- Sweeps (0003): a cursor per sweep kind, and an index per sweep read whose predicate is
-- exactly that read's rows (see store/sql/sweeps.sql).
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
CREATE INDEX runs_released_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status = 'suspended' AND waiting_reason = 'released';
CREATE INDEX runs_due_wait_idx ON runfleet.runs (waiting_wake_at_ms, id)
    WHERE waiting_wake_at_ms IS NOT NULL AND waiting_reason IS NOT NULL
      AND waiting_reason <> 'quarantine' AND status IN ('pending', 'suspended');
CREATE INDEX runs_runnable_pending_idx ON runfleet.runs (created_at_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL;
CREATE INDEX runs_deadline_idx ON runfleet.runs (((state->>'deadline_ms')::bigint), id)
    WHERE status IN ('pending', 'running', 'suspended') AND cancel_requested_at_ms IS NULL
      AND state ? 'deadline_ms' AND state->>'deadline_ms' IS NOT NULL;

-- Row-level security (0005): scopes enforced by Postgres; see the migration for why.
DO $$
DECLARE
    wanted text;
BEGIN
    FOREACH wanted IN ARRAY ARRAY['runfleet_migrator', 'runfleet_worker',
                                  'runfleet_producer', 'runfleet_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = wanted) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', wanted);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$$;

CREATE TABLE runfleet.grants (
    role            regrole NOT NULL,
    scope           text NOT NULL CHECK (length(scope) BETWEEN 1 AND 255),
    granted_at_ms   bigint NOT NULL,
    PRIMARY KEY (role, scope)
);

-- The caller's scopes as a jsonb array: its own grants and those of every role it is a
-- member of. Policies call it as `(SELECT runfleet.granted_scopes())`, an InitPlan run
-- once per statement, not once per row. PL/pgSQL, not SQL: an aggregate keeps an SQL
-- function from being inlined, and then its body is planned again at every statement,
-- while PL/pgSQL keeps the plan for the session.
CREATE OR REPLACE FUNCTION runfleet.granted_scopes() RETURNS jsonb
    LANGUAGE plpgsql STABLE AS
$$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(DISTINCT g.scope), '[]'::jsonb)
              FROM runfleet.grants g
             WHERE pg_has_role(current_user, g.role::oid, 'MEMBER'));
END
$$;

ALTER TABLE runfleet.grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY grants_own ON runfleet.grants
    USING (pg_has_role(current_user, role::oid, 'MEMBER'));

ALTER TABLE runfleet.runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY runs_fleet ON runfleet.runs TO runfleet_worker
    USING (true) WITH CHECK (true);
-- The rule: '*' covers every run; otherwise the run must record at least one scope and
-- every one must be granted (jsonb array containment). Written out here rather than as a
-- function: a function taking the granted scopes as a subquery argument used twice is
-- never inlined, and calling it per row made a scan of 20,000 runs ~10x slower.
CREATE POLICY runs_scoped ON runfleet.runs TO runfleet_producer, runfleet_operator
    USING ((SELECT runfleet.granted_scopes()) ? '*'
           OR (jsonb_typeof(state->'scopes') = 'array'
               AND jsonb_array_length(state->'scopes') > 0
               AND (SELECT runfleet.granted_scopes()) @> (state->'scopes')));

ALTER TABLE runfleet.journal ENABLE ROW LEVEL SECURITY;
CREATE POLICY journal_fleet ON runfleet.journal TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY journal_scoped ON runfleet.journal TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = journal.run_id));

ALTER TABLE runfleet.steps ENABLE ROW LEVEL SECURITY;
CREATE POLICY steps_fleet ON runfleet.steps TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY steps_scoped ON runfleet.steps TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = steps.run_id));

ALTER TABLE runfleet.attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY attempts_fleet ON runfleet.attempts TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY attempts_scoped ON runfleet.attempts TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = attempts.run_id));

ALTER TABLE runfleet.deferreds ENABLE ROW LEVEL SECURITY;
CREATE POLICY deferreds_fleet ON runfleet.deferreds TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY deferreds_scoped ON runfleet.deferreds TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = deferreds.run_id));

ALTER TABLE runfleet.clocks ENABLE ROW LEVEL SECURITY;
CREATE POLICY clocks_fleet ON runfleet.clocks TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY clocks_scoped ON runfleet.clocks TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = clocks.run_id));

-- An edge is visible only if both ends are: a parent's id is not shown to whoever can
-- see only the child, nor a child's to whoever can see only the parent.
ALTER TABLE runfleet.run_parents ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_parents_fleet ON runfleet.run_parents TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_parents_scoped ON runfleet.run_parents TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_parents.child_id)
           AND EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_parents.parent_id));

-- Retention (0006): settled runs in the order a prune walks them.
CREATE INDEX runs_settled_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- Per-run TTLs (0010): rq's result_ttl / failure_ttl, enforced by retention.
-- A settled run's own expiry (rq's result_ttl / failure_ttl, kept in its state by
-- broker/admission.py): settlement time + the TTL of its status. NULL when the run has
-- none (the fleet-wide RUNFLEET_RETENTION applies), the largest bigint when the TTL is
-- negative (rq's -1: kept forever). Only a JSON number counts and it is clamped to a
-- century, so no state a run can carry makes this index expression fail a write.
CREATE FUNCTION runfleet.run_expires_at_ms(status text, state jsonb, settled_at_ms bigint)
    RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN ttl IS NULL THEN NULL
               WHEN ttl < 0 THEN 9223372036854775807
               ELSE settled_at_ms + (least(ttl, 3153600000) * 1000)::bigint END
     FROM (SELECT CASE WHEN jsonb_typeof(t) = 'number' THEN (t #>> '{}')::numeric END AS ttl
             FROM (SELECT CASE status WHEN 'completed' THEN state->'result_ttl'
                                      WHEN 'failed' THEN state->'failure_ttl' END AS t) s) v $$;

-- The TTL pass of retention walks runs by their own expiry; only runs that carry a TTL
-- are in this index, so with none it is empty and the pass is one empty index probe.
CREATE INDEX runs_expiry_idx
    ON runfleet.runs (runfleet.run_expires_at_ms(status, state, updated_at_ms), id)
    WHERE runfleet.run_expires_at_ms(status, state, updated_at_ms) IS NOT NULL;

-- Schedules (0008): periodic runs; firing a tick admits its run and advances next_tick_ms
-- in one transaction (store/sql/schedules.sql).
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
