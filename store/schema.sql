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
    recoveries              integer NOT NULL DEFAULT 0 CHECK (recoveries >= 0),
        -- takeovers in a row after a lost process (migration 0012; parked `dead` past the max)
    priority                integer NOT NULL CHECK (priority BETWEEN -1000000 AND 1000000),
        -- higher starts first; an admission naming none gets its queue's (docs/how-to/queues.md)
    dedup_key               text CHECK (length(dedup_key) BETWEEN 1 AND 255),
        -- at most one open run per (queue, dedup_key): runs_open_dedup_idx
    rank_ms                 bigint GENERATED ALWAYS AS (created_at_ms - priority::bigint * 60000) STORED,
        -- effective priority with aging: one priority point is worth a minute of waiting
    CHECK ((owner_host IS NULL) = (owner_nonce IS NULL)),
    CHECK ((claim_host IS NULL) = (claimed_at_ms IS NULL)),
    CHECK (status <> 'running' OR owner_host IS NOT NULL)
);

CREATE UNIQUE INDEX runs_lineage_round_idx ON runfleet.runs (lineage_id, round_ordinal);
CREATE INDEX runs_stale_running_idx ON runfleet.runs (heartbeat_at_ms, id)
    WHERE status = 'running';
CREATE INDEX runs_waiting_idx ON runfleet.runs (waiting_reason, waiting_wake_at_ms)
    WHERE waiting_reason IS NOT NULL;
CREATE INDEX runs_pending_flow_idx ON runfleet.runs (flow, created_at_ms, id)
    WHERE status = 'pending';
CREATE INDEX runs_cancel_pending_idx ON runfleet.runs (created_at_ms, id)
    WHERE cancel_requested_at_ms IS NOT NULL AND status IN ('pending', 'suspended');
CREATE INDEX runs_runnable_suspended_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status = 'suspended' AND waiting_reason IS NULL;
CREATE INDEX runs_owner_idx ON runfleet.runs (owner_host, owner_pid, owner_nonce)
    WHERE status = 'running';
CREATE INDEX runs_status_created_idx ON runfleet.runs (status, created_at_ms);
CREATE INDEX runs_stranded_claim_idx ON runfleet.runs (claimed_at_ms, id)
    WHERE claim_host IS NOT NULL;
CREATE INDEX runs_ready_priority_idx ON runfleet.runs (queue, priority DESC, rank_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND owner_host IS NULL
      AND claim_host IS NULL;
CREATE UNIQUE INDEX runs_open_dedup_idx ON runfleet.runs (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'suspended');

-- Per-queue settings (docs/how-to/queues.md), changed live by `runfleet queue set`.
CREATE TABLE runfleet.queues (
    name              text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 255),
    default_priority  integer NOT NULL DEFAULT 0
                          CHECK (default_priority BETWEEN -1000000 AND 1000000),
    concurrency       integer CHECK (concurrency >= 1),  -- fleet-wide; NULL: unlimited
    rate_per_s        double precision CHECK (rate_per_s > 0),  -- starts/s fleet-wide; NULL: none
    rate_tokens       double precision,  -- the token bucket (capacity: one second's starts, >= 1)
    rate_at_ms        bigint,            -- when rate_tokens was last refilled
    updated_at_ms     bigint NOT NULL,
    updated_by        text NOT NULL
);
-- Every change of a queue's settings, with who made it (append-only, like the journal).
CREATE TABLE runfleet.queue_changes (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text NOT NULL,
    change     jsonb NOT NULL,
    note       text,
    changed_by text NOT NULL,
    at_ms      bigint NOT NULL
);
CREATE INDEX queue_changes_queue_idx ON runfleet.queue_changes (queue, seq);

-- runfleet.queue_free_slots(text, integer): defined with the concurrency keys (0019) below.
CREATE INDEX runs_running_queue_idx ON runfleet.runs (queue) WHERE status = 'running';

CREATE FUNCTION runfleet.queue_default_priority() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    NEW.priority := coalesce(
        (SELECT q.default_priority FROM runfleet.queues q WHERE q.name = NEW.queue), 0);
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_default_priority BEFORE INSERT ON runfleet.runs
    FOR EACH ROW WHEN (NEW.priority IS NULL)
    EXECUTE FUNCTION runfleet.queue_default_priority();

-- seq is always generated and a record's address is its writer's (0013): see there.
CREATE TABLE runfleet.journal (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text NOT NULL,
    kind        text NOT NULL,
    source_id   text NOT NULL,
    source_seq  bigint NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    digest      text NOT NULL,
    at_ms       bigint NOT NULL,
    writer      regrole NOT NULL DEFAULT quote_ident(session_user)::regrole,
    CONSTRAINT journal_address_key UNIQUE (source_id, source_seq, writer)
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
    digest           text,  -- runfleet.value_digest(value) (0014); NULL on older rows
    PRIMARY KEY (run_id, name)
);

-- The digest of a stored value's exact text (0014), as store/values.py text_digest.
CREATE FUNCTION runfleet.value_digest(p_value json) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS
$$ SELECT left(encode(sha256(convert_to(p_value::text, 'UTF8')), 'hex'), 32) $$;

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
-- producer/admission.py): settlement time + the TTL of its status. NULL when the run has
-- none (the fleet-wide RUNFLEET_RETENTION applies), the largest bigint when the TTL is
-- negative (rq's -1: kept forever). Only a JSON number counts and it is clamped to a
-- century, so no state a run can carry makes this index expression fail a write. One
-- expression, no subquery (0021): Postgres inlines it, where a body it must plan ran for
-- every written row.
CREATE FUNCTION runfleet.run_expires_at_ms(status text, state jsonb, settled_at_ms bigint)
    RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE
      WHEN status = 'completed' AND jsonb_typeof(state->'result_ttl') = 'number' THEN
        CASE WHEN (state->>'result_ttl')::numeric < 0 THEN 9223372036854775807
             ELSE settled_at_ms
                  + (least((state->>'result_ttl')::numeric, 3153600000) * 1000)::bigint END
      WHEN status = 'failed' AND jsonb_typeof(state->'failure_ttl') = 'number' THEN
        CASE WHEN (state->>'failure_ttl')::numeric < 0 THEN 9223372036854775807
             ELSE settled_at_ms
                  + (least((state->>'failure_ttl')::numeric, 3153600000) * 1000)::bigint END
   END $$;

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

-- Tenant limits (0013): what producers are held to through any client; see the migration.
-- The limits producers are held to, kept in the database because raw SQL never sees a
-- process's settings. `runfleet roles --apply` writes them from its RUNFLEET_* settings;
-- these are the defaults. Fleet bookkeeping: readable by every role, written by the owner.
CREATE TABLE runfleet.limits (
    name            text PRIMARY KEY CHECK (name IN ('max_payload_bytes', 'max_answers_per_run')),
    value           bigint NOT NULL CHECK (value > 0),
    updated_at_ms   bigint NOT NULL
);
INSERT INTO runfleet.limits (name, value, updated_at_ms)
VALUES ('max_payload_bytes', 1000000, runfleet.now_ms()),
       ('max_answers_per_run', 1000, runfleet.now_ms());

-- A refusal the policies below raise from the branch of a check that failed, so a raw
-- statement meets a message naming the field, not only the policy's name. VOLATILE: the
-- planner must never evaluate it ahead of time.
CREATE FUNCTION runfleet.refuse(p_field text, p_problem text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
    RAISE EXCEPTION 'runfleet refuses %: %', p_field, p_problem
        USING ERRCODE = 'check_violation', COLUMN = p_field;
END
$$;

-- What a producer may keep in a run's state: meta, description and a result each within
-- the payload cap, and the whole state within four times it (room for the rest of what
-- admission records, and a meta saved later), measured as Postgres renders the jsonb
-- (jsonb::text: what a reader of the row receives). store/validate.py checks the same
-- first, so the API raises a typed error before the database is asked.
CREATE FUNCTION runfleet.producer_state_ok(p_state jsonb, p_max_bytes bigint)
    RETURNS boolean LANGUAGE plpgsql STABLE AS
$$
DECLARE
    v_key text;
    v_size bigint;
BEGIN
    FOREACH v_key IN ARRAY ARRAY['meta', 'description', 'result'] LOOP
        v_size := octet_length((p_state -> v_key)::text);
        IF v_size > p_max_bytes THEN
            RETURN runfleet.refuse(v_key, format(
                'is %s bytes as stored, producers may store %s (runfleet.limits max_payload_bytes)',
                v_size, p_max_bytes));
        END IF;
    END LOOP;
    v_size := octet_length(p_state::text);
    IF v_size > 4 * p_max_bytes THEN
        RETURN runfleet.refuse('state', format(
            'is %s bytes as stored, producers may store %s (4 x runfleet.limits max_payload_bytes)',
            v_size, 4 * p_max_bytes));
    END IF;
    RETURN true;
END
$$;

-- What a producer may admit (producer/trust.py says the same first): never a derived id. A
-- child is `<parent>/child:<flow>#<n>` (`/spawn:` detached) and only workers create them;
-- a first round is its own lineage and never ends in `@<number>`; a later round
-- `<lineage>@<n>` only as the requeue of a failed round of that lineage the producer can
-- see (this runs with the caller's row-level security) and with the same scopes (rq's
-- failed registry: store/jobs.py). The payload within the cap, the times the database's.
CREATE FUNCTION runfleet.producer_run_ok(
    p_id text, p_lineage_id text, p_round_ordinal integer, p_previous_round_id text,
    p_payload json, p_state jsonb, p_created_at_ms bigint, p_updated_at_ms bigint,
    p_max_bytes bigint
) RETURNS boolean LANGUAGE plpgsql STABLE AS
$$
DECLARE
    v_size bigint;
    v_now bigint := runfleet.now_ms();
BEGIN
    IF strpos(p_id, '/child:') > 0 OR strpos(p_id, '/spawn:') > 0 THEN
        RETURN runfleet.refuse('run_id', format(
            '%s is reserved for derived ids: it names a run''s children', quote_literal(p_id)));
    END IF;
    IF p_round_ordinal = 0 THEN
        IF p_id ~ '@[0-9]+$' THEN
            RETURN runfleet.refuse('run_id', format(
                '%s is reserved for derived ids: an ''@<number>'' suffix names a round of a lineage',
                quote_literal(p_id)));
        END IF;
        IF p_lineage_id IS DISTINCT FROM p_id OR p_previous_round_id IS NOT NULL THEN
            RETURN runfleet.refuse('lineage_id', format(
                'run %s: a first round starts its own lineage (lineage_id = id, no previous round)',
                quote_literal(p_id)));
        END IF;
    ELSIF p_round_ordinal < 0 OR p_id IS DISTINCT FROM p_lineage_id || '@' || p_round_ordinal
          OR NOT EXISTS (SELECT FROM runfleet.runs p
                          WHERE p.id = p_previous_round_id AND p.lineage_id = p_lineage_id
                            AND p.round_ordinal < p_round_ordinal AND p.status = 'failed'
                            AND p.state -> 'scopes' = p_state -> 'scopes') THEN
        RETURN runfleet.refuse('run_id', format(
            'run %s: a producer admits a later round only as the requeue of a failed round of'
            ' its lineage, with the same scopes', quote_literal(p_id)));
    END IF;
    v_size := octet_length(p_payload::text);
    IF v_size > p_max_bytes THEN
        RETURN runfleet.refuse('payload', format(
            'is %s bytes, producers may store %s (runfleet.limits max_payload_bytes)',
            v_size, p_max_bytes));
    END IF;
    IF p_created_at_ms NOT BETWEEN v_now - 60000 AND v_now + 1000
       OR p_updated_at_ms NOT BETWEEN v_now - 60000 AND v_now + 1000 THEN
        RETURN runfleet.refuse('created_at_ms',
            'an admission carries the database''s time (runfleet.now_ms()), not the caller''s');
    END IF;
    RETURN runfleet.producer_state_ok(p_state, p_max_bytes);
END
$$;

-- The policies: restrictive (every one must hold, besides the scope policies), for the
-- producer group only. Workers create derived ids and write results: their policies stay
-- `true`, and their own settings bound what they store. The cap is read once per
-- statement (an InitPlan).
CREATE POLICY runs_producer_admits ON runfleet.runs AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (runfleet.producer_run_ok(
        id, lineage_id, round_ordinal, parent_run_id, payload, state, created_at_ms,
        updated_at_ms,
        (SELECT l.value FROM runfleet.limits l WHERE l.name = 'max_payload_bytes')));
CREATE POLICY runs_producer_updates ON runfleet.runs AS RESTRICTIVE FOR UPDATE
    TO runfleet_producer
    USING (true)
    WITH CHECK (runfleet.producer_state_ok(
        state, (SELECT l.value FROM runfleet.limits l WHERE l.name = 'max_payload_bytes')));
CREATE POLICY journal_producer_appends ON runfleet.journal AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (CASE
        WHEN octet_length(payload::text)
             > (SELECT l.value FROM runfleet.limits l WHERE l.name = 'max_payload_bytes')
            THEN runfleet.refuse('payload', 'a journal record larger than runfleet.limits'
                                            ' max_payload_bytes')
        WHEN length(kind) > 255 OR length(source_id) > 255 OR length(digest) > 255
            THEN runfleet.refuse('kind', 'a journal record''s kind, source_id and digest are'
                                         ' at most 255 characters')
        ELSE true END);

-- Answers (0009): an answer from outside is written only by runfleet.answer (SECURITY
-- DEFINER, checks and journal under the row lock); producers hold no INSERT on deferreds.
-- It holds the limits of 0013 (runfleet.limits) whoever calls it.
-- Since 0014 it writes and journals the answer's digest (runfleet.value_digest).
CREATE FUNCTION runfleet.answer(
    p_run_id text, p_name text, p_token text, p_approved boolean, p_value json,
    p_note text, p_reason text, p_max_answers integer, p_source_id text, p_source_seq bigint
) RETURNS TABLE (outcome text, why text, deferred_name text, woke boolean)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_who name := session_user;
    v_scopes jsonb;
    v_granted jsonb;
    v_run record;
    v_target text := p_name;
    v_value json := p_value;
    v_parked boolean;
    v_answers bigint;
    v_woke boolean;
    v_hash text;
    v_payload jsonb;
    v_max_bytes bigint;
    v_max_answers bigint;
BEGIN
    SELECT l.value INTO v_max_bytes FROM runfleet.limits l WHERE l.name = 'max_payload_bytes';
    SELECT least(p_max_answers, l.value) INTO v_max_answers
      FROM runfleet.limits l WHERE l.name = 'max_answers_per_run';
    v_max_answers := coalesce(v_max_answers, p_max_answers);
    IF octet_length(p_value::text) > v_max_bytes THEN
        PERFORM runfleet.refuse('value', format(
            'the answer is %s bytes, the limit is %s (runfleet.limits max_payload_bytes)',
            octet_length(p_value::text), v_max_bytes));
    END IF;
    IF octet_length(p_reason) > v_max_bytes THEN
        PERFORM runfleet.refuse('reason', format(
            'is %s bytes, the limit is %s', octet_length(p_reason), v_max_bytes));
    END IF;
    IF length(p_name) > 255 OR length(p_note) > 255 OR length(p_token) > 255
       OR length(p_source_id) > 255 THEN
        PERFORM runfleet.refuse('name', 'names, notes, tokens and source ids are at most'
                                        ' 255 characters');
    END IF;

    -- Visibility first, without a lock: an invisible run is never locked or waited on.
    SELECT r.state -> 'scopes' INTO v_scopes FROM runfleet.runs r WHERE r.id = p_run_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::text, NULL::text, false;
        RETURN;
    END IF;
    IF NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = v_who AND (rolsuper OR rolbypassrls))
            OR pg_has_role(v_who, 'runfleet_migrator', 'MEMBER')
            OR pg_has_role(v_who, 'runfleet_worker', 'MEMBER')) THEN
        SELECT coalesce(jsonb_agg(DISTINCT g.scope), '[]'::jsonb) INTO v_granted
          FROM runfleet.grants g WHERE pg_has_role(v_who, g.role::oid, 'MEMBER');
        IF NOT (v_granted ? '*'
                OR (jsonb_typeof(v_scopes) = 'array' AND jsonb_array_length(v_scopes) > 0
                    AND v_granted @> v_scopes)) THEN
            RETURN QUERY SELECT 'not_found'::text, NULL::text, NULL::text, false;
            RETURN;
        END IF;
    END IF;

    SELECT r.status, r.waiting_reason, r.waiting_deferred, r.waiting_token INTO v_run
      FROM runfleet.runs r WHERE r.id = p_run_id FOR UPDATE;
    SELECT count(*) INTO v_answers FROM runfleet.deferreds d
     WHERE d.run_id = p_run_id AND d.metadata ? 'answered_by';

    IF p_token IS NOT NULL THEN
        v_hash := 'sha256:' || encode(sha256(convert_to(p_token, 'UTF8')), 'hex');
        IF v_run.waiting_reason IS DISTINCT FROM 'approval' OR v_run.waiting_deferred IS NULL
           OR coalesce(v_run.waiting_token, '') = ''
           OR v_run.waiting_token <> (CASE WHEN starts_with(v_run.waiting_token, 'sha256:')
                                           THEN v_hash ELSE p_token END) THEN
            RETURN QUERY SELECT 'no_match'::text, NULL::text, NULL::text, false;
            RETURN;
        END IF;
        IF v_answers >= v_max_answers THEN
            RETURN QUERY SELECT 'limit'::text, NULL::text, NULL::text, false;
            RETURN;
        END IF;
        v_target := v_run.waiting_deferred;
        v_value := json_build_object('approved', p_approved, 'value', p_value,
                                     'actor', v_who::text, 'reason', p_reason);
    END IF;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN QUERY SELECT 'terminal'::text, NULL::text, NULL::text, false;
        RETURN;
    END IF;
    IF p_token IS NULL THEN
        -- Only what the run declared with ctx.wait_for: the event wait it is parked on, or
        -- a recorded `event` step; a name an approval, a child or a timer of the run
        -- completes through is never answerable, even if also declared.
        v_parked := v_run.waiting_deferred IS NOT DISTINCT FROM v_target;
        IF v_parked AND v_run.waiting_reason IS DISTINCT FROM 'event' THEN
            RETURN QUERY SELECT 'not_answerable'::text, v_run.waiting_reason::text, v_target,
                                false;
            RETURN;
        END IF;
        IF EXISTS (SELECT FROM runfleet.clocks k
                    WHERE k.run_id = p_run_id AND k.deferred_name = v_target)
           OR EXISTS (SELECT FROM runfleet.steps s
                       WHERE s.run_id = p_run_id
                         AND ((s.kind = 'approval' AND 'approval:' || s.name = v_target)
                              OR (s.kind IN ('child', 'spawn')
                                  AND 'child:' || (s.output ->> 'run_id') = v_target))) THEN
            RETURN QUERY SELECT 'not_answerable'::text,
                CASE WHEN starts_with(v_target, 'approval:') THEN 'approval' ELSE 'runfleet' END,
                v_target, false;
            RETURN;
        END IF;
        IF NOT v_parked AND NOT EXISTS (
               SELECT FROM runfleet.steps s
                WHERE s.run_id = p_run_id AND s.kind = 'event' AND s.name = v_target)
           AND v_target ~ '^(approval|child|spawn|sleep|step|quota):' THEN
            RETURN QUERY SELECT 'not_answerable'::text,
                CASE WHEN starts_with(v_target, 'approval:') THEN 'approval' ELSE 'runfleet' END,
                v_target, false;
            RETURN;
        END IF;
        -- An event already completed is 'existing' before the cap is counted: a retry
        -- whose first try committed unseen learns its value stands (0014), not 'limit'.
        IF EXISTS (SELECT FROM runfleet.deferreds d
                    WHERE d.run_id = p_run_id AND d.name = v_target) THEN
            RETURN QUERY SELECT 'existing'::text, NULL::text, v_target, false;
            RETURN;
        END IF;
        IF v_answers >= v_max_answers THEN
            RETURN QUERY SELECT 'limit'::text, NULL::text, v_target, false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO runfleet.deferreds (run_id, name, value, metadata, completed_at_ms, digest)
    VALUES (p_run_id, v_target, v_value,
            jsonb_build_object('answered_by', v_who::text, 'note', p_note), runfleet.now_ms(),
            runfleet.value_digest(v_value))
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'existing'::text, NULL::text, v_target, false;
        RETURN;
    END IF;
    UPDATE runfleet.runs AS r SET
        waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
        waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
     WHERE r.id = p_run_id AND r.waiting_deferred = v_target
       AND r.waiting_reason <> 'quarantine';
    v_woke := FOUND;

    -- The journal, in the same transaction: digests are of the jsonb text here.
    v_payload := jsonb_build_object('name', v_target, 'woke', v_woke,
                                    'answered_by', v_who::text, 'note', p_note,
                                    'digest', runfleet.value_digest(v_value));
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    VALUES (p_run_id, 'deferred-completed', p_source_id, p_source_seq, v_payload,
            left(encode(sha256(convert_to(v_payload::text, 'UTF8')), 'hex'), 32),
            runfleet.now_ms());
    IF p_token IS NOT NULL THEN
        v_payload := jsonb_build_object('token', v_hash, 'actor', v_who::text,
                                        'note', p_note, 'reason', p_reason);
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        VALUES (p_run_id, CASE WHEN p_approved THEN 'approval-approved' ELSE 'approval-denied' END,
                p_source_id, p_source_seq + 1, v_payload,
                left(encode(sha256(convert_to(v_payload::text, 'UTF8')), 'hex'), 32),
                runfleet.now_ms());
    END IF;
    RETURN QUERY SELECT 'answered'::text, NULL::text, v_target, v_woke;
END
$$;
REVOKE ALL ON FUNCTION runfleet.answer(text, text, text, boolean, json, text, text, integer,
                                       text, bigint) FROM PUBLIC;

-- ---- events and messages (0016, docs/explanation/lifecycle.md) ----
-- Events a flow publishes (ctx.set_event): one row per (run, key), the latest value wins.
-- Written only by the run's owner, in the transaction that records the set_event call
-- (store/events.py), so a replay never writes an older value over a newer one.
CREATE TABLE runfleet.run_events (
    run_id          text NOT NULL,
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    value           json NOT NULL,
    digest          text NOT NULL,
    version         integer NOT NULL CHECK (version >= 1),
    set_at_ms       bigint NOT NULL,
    PRIMARY KEY (run_id, key)
);

-- Messages sent to a run (send / ctx.recv): kept in the order they were sent (seq), each
-- consumed once, by the recv whose step record is written in the same transaction.
-- message_id (the sender's idempotency key) makes a retried send a no-op.
CREATE TABLE runfleet.run_messages (
    run_id          text NOT NULL,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    topic           text NOT NULL CHECK (length(topic) BETWEEN 1 AND 255),
    message_id      text CHECK (length(message_id) BETWEEN 1 AND 255),
    value           json NOT NULL,
    digest          text NOT NULL,
    sent_at_ms      bigint NOT NULL,
    consumed_key    text,
    consumed_at_ms  bigint,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, message_id)
);
CREATE INDEX run_messages_pending ON runfleet.run_messages (run_id, topic, seq)
    WHERE consumed_at_ms IS NULL;

ALTER TABLE runfleet.run_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_events_fleet ON runfleet.run_events TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_events_scoped ON runfleet.run_events TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_events.run_id));

ALTER TABLE runfleet.run_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_messages_fleet ON runfleet.run_messages TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_messages_scoped ON runfleet.run_messages TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_messages.run_id));
-- A producer's message is held to the payload cap through any client (as 0013's are),
-- and is never written as already consumed.
CREATE POLICY run_messages_producer_sends ON runfleet.run_messages AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (consumed_key IS NULL AND consumed_at_ms IS NULL
                AND octet_length(value::text) <= coalesce(
                    (SELECT l.value FROM runfleet.limits l WHERE l.name = 'max_payload_bytes'),
                    0));
-- Parentless admission in one statement (0017): see there for why SECURITY INVOKER; its
-- answer by primary key and per-key dedup probes (0021), never a scan of the open runs;
-- linear in the batch's size (0023); sequential scans off (0034); the queue's default
-- priority read in its own INSERT, not by runs_default_priority (0035).
CREATE FUNCTION runfleet.admit(p_runs jsonb, p_records jsonb, p_kind text, p_source_id text)
    RETURNS TABLE (inserted boolean, run runfleet.runs)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off AS
$$
DECLARE
    v_ids text[];                -- the batch's ids, in batch order
    v_new runfleet.runs[];       -- the rows this call inserted, as its INSERT returned them
    v_inserted jsonb;            -- their ids, and below each set of ids, as the keys of a
    v_joined runfleet.runs[];    -- jsonb object: `?` is a binary search, where `= ANY` of
    v_visible text[];            -- an array variable in a generic plan is a linear one, per
    v_visible_set jsonb;         -- row (a batch of n did n * n comparisons, docs/producer.md)
    v_recorded jsonb;
    v_batch jsonb;
BEGIN
    SELECT coalesce(array_agg(b.id), '{}') INTO v_ids
      FROM jsonb_to_recordset(p_records) AS b(id text);

    -- No conflict target: every unique index is an arbiter (see runs.insert for why). A
    -- row whose id or (lineage_id, round_ordinal) is taken is skipped, and its caller
    -- joins or is refused. RETURNING applies the runs' SELECT policies to each new row.
    WITH ins AS (
        INSERT INTO runfleet.runs AS r (
            id, flow, queue, status, state, payload, lineage_id, round_ordinal, parent_run_id,
            created_at_ms, updated_at_ms, waiting_reason, waiting_wake_at_ms,
            priority, dedup_key)
        SELECT b.id, b.flow, b.queue, 'pending',
            b.state || CASE WHEN b.timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
                       ELSE jsonb_build_object('deadline_ms', LEAST(t.now_ms + b.timeout_ms,
                                                  (b.state->>'deadline_ms')::bigint))
                       END,
            b.payload::json,  -- canonical text, kept verbatim (store/values.py)
            b.lineage_id, b.round_ordinal, b.previous_round_id, t.now_ms, t.now_ms,
            CASE WHEN b.delay_until_ms IS NOT NULL THEN 'timer' END, b.delay_until_ms,
            -- NULL: the queue's default, read here rather than by runs_default_priority
            coalesce(b.priority, (SELECT q.default_priority FROM runfleet.queues q
                                   WHERE q.name = b.queue), 0),
            b.dedup_key
          FROM (SELECT runfleet.now_ms() AS now_ms) AS t,  -- one admission instant per batch
               ROWS FROM (jsonb_to_recordset(p_runs)
                          AS (id text, flow text, queue text, state jsonb, payload text,
                              lineage_id text, round_ordinal integer, previous_round_id text,
                              delay_until_ms bigint, timeout_ms bigint, priority integer,
                              dedup_key text))
                   WITH ORDINALITY AS b(id, flow, queue, state, payload, lineage_id,
                                        round_ordinal, previous_round_id, delay_until_ms,
                                        timeout_ms, priority, dedup_key, n)
         ORDER BY b.n
        ON CONFLICT DO NOTHING
        RETURNING r
    )
    SELECT coalesce(array_agg(ins.r), '{}'), coalesce(jsonb_object_agg((ins.r).id, true), '{}')
      INTO v_new, v_inserted FROM ins;

    -- The batch runs that were there already (a re-admission joins them, committed by
    -- anyone before this statement) and this role can see: a primary-key probe per id,
    -- made only for the ids this call did not insert.
    SELECT coalesce(array_agg(x.r), '{}') INTO v_joined
      FROM (SELECT DISTINCT m.id FROM unnest(v_ids) AS m(id) WHERE NOT v_inserted ? m.id) AS m
     CROSS JOIN LATERAL (SELECT r FROM runfleet.runs r WHERE r.id = m.id) AS x(r);

    -- The records, for the batch runs that have none: exactly the rows just inserted,
    -- since every other run got its record in the transaction that admitted it (retention
    -- deletes a run's records only with the run). A run this role cannot see gets none.
    -- No ON CONFLICT on the journal: an address collision fails the whole admission.
    SELECT coalesce(array_agg(v.id), '{}'), coalesce(jsonb_object_agg(v.id, true), '{}')
      INTO v_visible, v_visible_set
      FROM (SELECT (v_new[i]).id FROM generate_subscripts(v_new, 1) AS i
            UNION ALL SELECT (v_joined[i]).id FROM generate_subscripts(v_joined, 1) AS i) AS v(id);
    SELECT coalesce(jsonb_object_agg(j.run_id, true), '{}') INTO v_recorded
      FROM runfleet.journal j WHERE j.run_id = ANY (v_visible) AND j.kind = p_kind;
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT b.id, p_kind, p_source_id, b.source_seq, b.record, b.digest, runfleet.now_ms()
      FROM jsonb_to_recordset(p_records) AS b(id text, source_seq bigint, record jsonb,
                                               digest text)
     WHERE v_visible_set ? b.id AND NOT v_recorded ? b.id;

    -- Every batch run this role can see: the new rows as inserted (nothing else can have
    -- changed them: they are not committed), and the joined ones as read above.
    RETURN QUERY SELECT true, v_new[i] FROM generate_subscripts(v_new, 1) AS i;
    RETURN QUERY SELECT false, v_joined[i] FROM generate_subscripts(v_joined, 1) AS i;
    -- And the open run holding a batch run's dedup_key (docs/how-to/queues.md): the caller whose
    -- insert that key's index skipped is answered with it, or refused. A probe of
    -- runs_open_dedup_idx per key (its predicate spelt out so the planner may use it),
    -- and none at all for a batch without keys: one OR'd with the id lookup read every
    -- open run (a bitmap scan of the status index), so an admission cost grew with the
    -- backlog.
    IF jsonb_path_exists(p_runs, '$[*] ? (@.dedup_key != null)') THEN
        SELECT coalesce(jsonb_object_agg(m.id, true), '{}') INTO v_batch
          FROM unnest(v_ids) AS m(id) WHERE m.id IS NOT NULL;
        RETURN QUERY
        SELECT false, h.r
          FROM (SELECT DISTINCT b.queue, b.dedup_key
                  FROM jsonb_to_recordset(p_runs) AS b(queue text, dedup_key text)
                 WHERE b.dedup_key IS NOT NULL) AS k
         CROSS JOIN LATERAL (  -- LIMIT 1: a probe per key, never a scan of the open runs
                SELECT r FROM runfleet.runs r
                 WHERE r.queue = k.queue AND r.dedup_key = k.dedup_key
                   AND r.status IN ('pending', 'running', 'suspended')
                 LIMIT 1) AS h(r)
         WHERE NOT v_batch ? (h.r).id;
    END IF;
END
$$;
-- One run's admission (0022): runfleet.admit's rules with scalar parameters, what a single
-- enqueue calls; admit itself always takes its generic plans (0022).
CREATE FUNCTION runfleet.admit_one(
    p_id text, p_flow text, p_queue text, p_state jsonb, p_payload text, p_lineage_id text,
    p_round_ordinal integer, p_previous_round_id text, p_delay_until_ms bigint,
    p_timeout_ms bigint, p_priority integer, p_dedup_key text,
    p_source_seq bigint, p_record jsonb, p_digest text, p_kind text, p_source_id text)
    RETURNS TABLE (inserted boolean, run runfleet.runs)
    LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS
$$
DECLARE
    v_now bigint := runfleet.now_ms();  -- the admission instant
    v_row runfleet.runs;
    v_inserted boolean;
BEGIN
    -- No conflict target: every unique index is an arbiter, as in runfleet.admit.
    -- RETURNING applies the runs' SELECT policies to the new row, as the batch's does.
    INSERT INTO runfleet.runs AS r (
        id, flow, queue, status, state, payload, lineage_id, round_ordinal, parent_run_id,
        created_at_ms, updated_at_ms, waiting_reason, waiting_wake_at_ms,
        priority, dedup_key)
    VALUES (p_id, p_flow, p_queue, 'pending',
        p_state || CASE WHEN p_timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
                   ELSE jsonb_build_object('deadline_ms', LEAST(v_now + p_timeout_ms,
                                              (p_state->>'deadline_ms')::bigint))
                   END,
        p_payload::json,  -- canonical text, kept verbatim (store/values.py)
        p_lineage_id, p_round_ordinal, p_previous_round_id, v_now, v_now,
        CASE WHEN p_delay_until_ms IS NOT NULL THEN 'timer' END, p_delay_until_ms,
        coalesce(p_priority, (SELECT q.default_priority FROM runfleet.queues q  -- as admit
                               WHERE q.name = p_queue), 0),
        p_dedup_key)
    ON CONFLICT DO NOTHING
    RETURNING r.* INTO v_row;
    v_inserted := FOUND;
    IF NOT v_inserted THEN  -- the id or round is taken: the run by id, if this role sees it
        SELECT r.* INTO v_row FROM runfleet.runs r WHERE r.id = p_id;
    END IF;
    IF v_row.id IS NOT NULL THEN
        -- Its record if it has none (runfleet.admit's rule); an address collision fails
        -- the admission.
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        SELECT p_id, p_kind, p_source_id, p_source_seq, p_record, p_digest, runfleet.now_ms()
         WHERE NOT EXISTS (SELECT FROM runfleet.journal j
                            WHERE j.run_id = p_id AND j.kind = p_kind);
        inserted := v_inserted;
        run := v_row;
        RETURN NEXT;
    END IF;
    -- Not written and keyed: the open run holding the key (one probe of
    -- runs_open_dedup_idx), for the caller to answer with or refuse. A run this call
    -- wrote holds its own key (the index is unique), so it needs no probe.
    IF NOT v_inserted AND p_dedup_key IS NOT NULL THEN
        RETURN QUERY
        SELECT false, r FROM runfleet.runs r
         WHERE r.queue = p_queue AND r.dedup_key = p_dedup_key
           AND r.status IN ('pending', 'running', 'suspended') AND r.id <> p_id
         LIMIT 1;
    END IF;
END
$$;
-- Wake marks (0018): per queue, the Postgres time before which every admission's wake
-- has been delivered or destroyed; the lost-pending sweep reads it (docs/backlog.md).
CREATE TABLE runfleet.wake_marks (
    queue                text PRIMARY KEY,
    delivered_through_ms bigint NOT NULL,
    updated_at_ms        bigint NOT NULL
);

-- Concurrency keys (0019): see there.
ALTER TABLE runfleet.runs
    ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 255);

-- Per-queue key limits, set by `runfleet queue set Q --key-concurrency K --key-rate R/s`.
-- keyed: the queue shares its slots across keys (a `--key FLOW=EXPR` named it); its
-- claims take the queue row's lock even without a queue-wide limit.
ALTER TABLE runfleet.queues
    ADD COLUMN keyed boolean NOT NULL DEFAULT false,
    ADD COLUMN key_concurrency integer CHECK (key_concurrency >= 1),  -- per key; NULL: none
    ADD COLUMN key_rate_per_s double precision CHECK (key_rate_per_s > 0);  -- per key

-- A flow's key expression: 'scope' (the run's first scope, its tenant), 'kwargs.NAME' or
-- 'args.N' (a field of the payload). Fleet bookkeeping written by `runfleet queue set`.
CREATE TABLE runfleet.flow_keys (
    flow          text PRIMARY KEY CHECK (length(flow) BETWEEN 1 AND 255),
    expression    text NOT NULL CHECK (expression = 'scope'
                                       OR expression ~ '^kwargs\.[A-Za-z_][A-Za-z0-9_]{0,99}$'
                                       OR expression ~ '^args\.[0-9]{1,3}$'),
    updated_at_ms bigint NOT NULL,
    updated_by    text NOT NULL
);

-- The keys of a keyed queue: the round-robin order (the key whose last start is oldest
-- goes first) and each key's token bucket. A row is made when a run with the key is
-- admitted (runs_key_seen below) and pruned by retention once no run of it is open
-- (retention.prune_keys); an idle key is moved to the back of the order when a claim
-- finds it has nothing to start.
CREATE TABLE runfleet.queue_keys (
    queue          text NOT NULL,
    key            text NOT NULL,
    last_start_ms  bigint NOT NULL DEFAULT 0,
    rate_tokens    double precision,
    rate_at_ms     bigint,
    PRIMARY KEY (queue, key)
);
CREATE INDEX queue_keys_order_idx ON runfleet.queue_keys (queue, last_start_ms, key);

-- A key is a value of its runs' payload or scope (a tenant's name): a scoped reader sees
-- a key beside an open run it may read (the runs' own policies decide which), a fleet-wide
-- role ('*') every key; workers read them all (their claims decide by them).
ALTER TABLE runfleet.queue_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_keys_fleet ON runfleet.queue_keys TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY queue_keys_scoped ON runfleet.queue_keys FOR SELECT
    TO runfleet_producer, runfleet_operator
    USING ((SELECT runfleet.granted_scopes()) ? '*'
           OR EXISTS (SELECT FROM runfleet.runs r
                       WHERE r.queue = queue_keys.queue AND r.concurrency_key = queue_keys.key
                         AND r.status IN ('pending', 'running', 'suspended')));

-- A key's executing runs (its slots) and its fresh admissions in FIFO order.
CREATE INDEX runs_running_key_idx ON runfleet.runs (queue, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX runs_ready_key_idx ON runfleet.runs (queue, concurrency_key, rank_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND owner_host IS NULL
      AND claim_host IS NULL AND concurrency_key IS NOT NULL;
-- Retention prunes a key's row once no run of it is open and its bucket is full again
-- (retention.prune_keys; docs/how-to/queues.md). A key's open runs, whatever their state:
CREATE INDEX runs_open_key_idx ON runfleet.runs (queue, concurrency_key)
    WHERE status IN ('pending', 'running', 'suspended') AND concurrency_key IS NOT NULL;

-- Every unsettled run a final settlement or a cancel of each of p_ids' lineages reaches:
-- from any round of the lineage, through attached edges, every round of each attached
-- child's own lineage, transitively, as (root, descendant) pairs; a root's own lineage
-- is not listed (its rounds are the caller's). The policy read is the one the edge's
-- child (the round its parent created) recorded. UNION deduplicates, so a diamond is
-- visited once and the walk ends on the finite edge set with no depth cap (cycles are
-- refused at insert). Usually empty: a run without children costs one probe of
-- run_parents by parent per round of its lineage.
--
-- Every lookup, in the seeds and in the recursive step alike, is a LATERAL subquery with
-- an ORDER BY (never flattened into a join), so each stays an index probe whatever the
-- statistics say: as plain joins the recursive step, planned from a run_parents never
-- analyzed, read every row of runs on every settlement (docs/producer.md, "The
-- settlement's descendant walk"). Generic plans: with the ids' values visible a custom
-- plan looked cheaper, so every settlement planned the walk again (~1 ms, ten times its
-- execution); here it is planned once per connection. JIT off: a recursive CTE's row
-- estimate multiplies at every level, so the walk's estimated cost passes
-- jit_above_cost although it reads a handful of rows, and a connection through PgBouncer
-- (which refuses the connection's own `-c jit=off`) compiled it at every call: 0.5-2 s a
-- settlement, a sixteen-process fleet test twice as slow. SECURITY INVOKER: the caller's
-- row security.
CREATE FUNCTION runfleet.attached_descendants(p_ids text[])
    RETURNS TABLE (root text, id text)
    LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE seeds AS (
        SELECT l.id AS root, l.lineage_id AS root_lineage
          FROM unnest(p_ids) AS s(id)
         CROSS JOIN LATERAL (SELECT r.id, r.lineage_id FROM runfleet.runs r
                              WHERE r.id = s.id ORDER BY r.id) l
    ), tree(root, root_lineage, id) AS (
        SELECT s.root, s.root_lineage, r.id FROM seeds s
         CROSS JOIN LATERAL (SELECT x.id FROM runfleet.runs x
                              WHERE x.lineage_id = s.root_lineage ORDER BY x.round_ordinal) r
        UNION
        SELECT t.root, t.root_lineage, m.id FROM tree t
         CROSS JOIN LATERAL (SELECT e.child_id FROM runfleet.run_parents e
                              WHERE e.parent_id = t.id ORDER BY e.seq) e
         CROSS JOIN LATERAL (SELECT c.lineage_id FROM runfleet.runs c
                              WHERE c.id = e.child_id
                                AND coalesce(c.state->>'on_parent_exit', 'cancel') = 'cancel'
                              ORDER BY c.id) c
         CROSS JOIN LATERAL (SELECT x.id FROM runfleet.runs x
                              WHERE x.lineage_id = c.lineage_id ORDER BY x.round_ordinal) m
    )
    SELECT DISTINCT tree.root, d.id FROM tree
     CROSS JOIN LATERAL (SELECT y.id FROM runfleet.runs y
                          WHERE y.id = tree.id
                            AND y.status NOT IN ('completed', 'failed', 'cancelled')
                            AND y.lineage_id <> tree.root_lineage ORDER BY y.id) d
     ORDER BY tree.root, d.id;
END
$$;

-- The key of an admission: its flow's expression, evaluated on the row. SECURITY DEFINER
-- so a producer needs no privilege on flow_keys; one primary-key probe per row.
CREATE FUNCTION runfleet.run_concurrency_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_expr text;
    v_key text;
BEGIN
    SELECT f.expression INTO v_expr FROM runfleet.flow_keys f WHERE f.flow = NEW.flow;
    IF v_expr IS NULL THEN
        RETURN NEW;
    ELSIF v_expr = 'scope' THEN
        v_key := NEW.state -> 'scopes' ->> 0;
    ELSIF v_expr LIKE 'kwargs.%' THEN
        v_key := NEW.payload::jsonb -> 'kwargs' ->> substr(v_expr, 8);
    ELSE
        v_key := NEW.payload::jsonb -> 'args' ->> substr(v_expr, 6)::integer;
    END IF;
    NEW.concurrency_key := left(nullif(v_key, ''), 255);
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_concurrency_key BEFORE INSERT ON runfleet.runs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NULL)
    EXECUTE FUNCTION runfleet.run_concurrency_key();

-- Every admitted key has its queue_keys row when the admission commits. The row is made
-- if missing and then held FOR KEY SHARE until the admission commits (a claim's UPDATE of
-- the turn or bucket does not wait for it; retention's DELETE skips it), so retention
-- cannot delete a key between this statement's insert and its commit, while its runs are
-- not yet visible. A row deleted meanwhile is made again.
CREATE FUNCTION runfleet.runs_key_seen() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_keys integer;
    v_held integer;
BEGIN
    SELECT count(*) INTO v_keys
      FROM (SELECT DISTINCT n.queue, n.concurrency_key FROM admitted n
             WHERE n.concurrency_key IS NOT NULL) AS d;
    WHILE v_keys > 0 LOOP
        INSERT INTO runfleet.queue_keys (queue, key)
        SELECT DISTINCT n.queue, n.concurrency_key FROM admitted n
         WHERE n.concurrency_key IS NOT NULL
         ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
        SELECT count(*) INTO v_held FROM (
            SELECT FROM runfleet.queue_keys k
             WHERE (k.queue, k.key) IN (SELECT n.queue, n.concurrency_key FROM admitted n)
             ORDER BY k.queue, k.key FOR KEY SHARE) AS h;
        EXIT WHEN v_held >= v_keys;
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_key_seen AFTER INSERT ON runfleet.runs
    REFERENCING NEW TABLE AS admitted FOR EACH STATEMENT
    EXECUTE FUNCTION runfleet.runs_key_seen();

-- queue_free_slots (0015), now also NOT NULL for a keyed queue: its claims take the queue
-- row's lock (runfleet.key_pick decides under it) and count as limited, so a worker
-- ending one of its executions opens its gate.
CREATE OR REPLACE FUNCTION runfleet.queue_free_slots(p_queue text, p_want integer DEFAULT 1)
    RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_limit integer;
    v_rate double precision;
    v_keyed boolean;
    v_tokens double precision;
    v_at bigint;
    v_now bigint;
    v_free integer := greatest(p_want, 0);
    v_running integer;
BEGIN
    SELECT q.concurrency, q.rate_per_s, q.keyed INTO v_limit, v_rate, v_keyed
      FROM runfleet.queues q WHERE q.name = p_queue;
    IF v_limit IS NULL AND v_rate IS NULL AND NOT coalesce(v_keyed, false) THEN
        RETURN NULL;
    END IF;
    SELECT q.concurrency, q.rate_per_s, q.keyed, q.rate_tokens, q.rate_at_ms
      INTO v_limit, v_rate, v_keyed, v_tokens, v_at
      FROM runfleet.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_limit IS NULL AND v_rate IS NULL AND NOT v_keyed THEN  -- lifted meanwhile
        RETURN NULL;
    END IF;
    IF v_limit IS NOT NULL THEN
        SELECT count(*) INTO v_running FROM runfleet.runs r
         WHERE r.queue = p_queue AND r.status = 'running';
        v_free := least(v_free, greatest(v_limit - v_running, 0));
    END IF;
    IF v_rate IS NOT NULL THEN
        -- The token bucket: refilled at v_rate per second up to one second's starts (at
        -- least one), and the starts granted here taken from it under the same lock.
        v_now := runfleet.now_ms();
        v_tokens := least(greatest(v_rate, 1),
                          coalesce(v_tokens, greatest(v_rate, 1))
                          + greatest(v_now - coalesce(v_at, v_now), 0) * v_rate / 1000.0);
        v_free := least(v_free, floor(v_tokens)::integer);
        UPDATE runfleet.queues SET rate_tokens = v_tokens - v_free, rate_at_ms = v_now
         WHERE name = p_queue;
    END IF;
    RETURN v_free;
END
$$;

-- A rate's tokens a claim took but started no run with (a concurrent claim of the same run
-- committed first, a row skipped locked), handed back in the same statement (0032).
CREATE FUNCTION runfleet.rate_refund(p_queue text, p_unused integer)
    RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF p_unused IS NULL OR p_unused <= 0 THEN
        RETURN 0;
    END IF;
    -- The bucket as queue_free_slots left it (rate_at_ms is that call's instant): the tokens
    -- go back on top, still at most one second's starts.
    UPDATE runfleet.queues q
       SET rate_tokens = least(greatest(q.rate_per_s, 1), coalesce(q.rate_tokens, 0) + p_unused)
     WHERE q.name = p_queue AND q.rate_per_s IS NOT NULL;
    RETURN p_unused;
END
$$;

-- A token bucket's tokens at ``p_now``: refilled at ``p_rate`` per second up to one
-- second's starts (at least one); a bucket never drawn from is full.
CREATE FUNCTION runfleet.bucket_tokens(p_rate double precision, p_tokens double precision,
                                       p_at bigint, p_now bigint)
    RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$
    SELECT least(greatest(p_rate, 1),
                 coalesce(p_tokens, greatest(p_rate, 1))
                 + greatest(p_now - coalesce(p_at, p_now), 0) * p_rate / 1000.0)
$$;

-- Which runs start in the slots a claim of the named runs ``p_ids`` (all of ``p_queue``,
-- best slot first) was granted: one row per slot used, ``named_id`` the slot's delivered
-- run and ``pick_id`` the run that starts in it. A named run with no key, or on a queue
-- that is not keyed, is its own pick. For the keyed ones, under the queue row's lock (the
-- claim already holds it; taken again here), the keys are visited in round-robin order
-- (oldest last start first), in passes that give each key at most one start: a key below
-- its concurrency (K running, counting this call's picks) with a token of its rate starts
-- its best fresh admission of a flow in ``p_flows`` (the smallest rank_ms: the highest
-- priority, aged, then FIFO; a named run is one of them), SKIP LOCKED. Keys at their limit
-- or out of tokens are not visited; a key with nothing fresh at all goes to the back; at
-- most 64 visits find nothing (flows the caller does not run). A pick that is a named run
-- takes its own slot; the others take the named runs left, in order (those stay pending:
-- the caller re-publishes their wakes). Slots no pick used give their queue tokens back.
-- ``p_flows`` NULL: only the named runs may start (a path that cannot run another run).
-- Each picked key's turn and token are taken here, in the claim's transaction: a claim
-- that then loses its race wastes them (slow, never fast).
CREATE FUNCTION runfleet.key_pick_many(p_queue text, p_ids text[], p_flows text[])
    RETURNS TABLE (named_id text, pick_id text)
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_keyed boolean;
    v_k integer;
    v_rate double precision;
    v_qrate double precision;
    v_now bigint := runfleet.now_ms();
    v_stamp bigint;
    v_named text[];
    v_named_keys text[];
    v_picked text[] := '{}';
    v_running jsonb := '{}';
    v_cand record;
    v_run text;
    v_fruitless integer := 0;
    v_progress boolean;
BEGIN
    SELECT q.keyed INTO v_keyed FROM runfleet.queues q WHERE q.name = p_queue;
    RETURN QUERY
        SELECT u.id, u.id FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
          JOIN runfleet.runs r ON r.id = u.id
         WHERE r.concurrency_key IS NULL OR NOT coalesce(v_keyed, false) OR r.queue <> p_queue
         ORDER BY u.n;
    SELECT array_agg(u.id ORDER BY u.n), array_agg(DISTINCT r.concurrency_key)
      INTO v_named, v_named_keys
      FROM unnest(p_ids) WITH ORDINALITY AS u(id, n) JOIN runfleet.runs r ON r.id = u.id
     WHERE r.concurrency_key IS NOT NULL AND coalesce(v_keyed, false) AND r.queue = p_queue;
    IF v_named IS NULL THEN
        RETURN;
    END IF;
    SELECT q.keyed, q.key_concurrency, q.key_rate_per_s, q.rate_per_s
      INTO v_keyed, v_k, v_rate, v_qrate
      FROM runfleet.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_k IS NOT NULL THEN  -- each key's executing runs (its slots), read after the lock
        SELECT coalesce(jsonb_object_agg(b.key, b.n), '{}') INTO v_running
          FROM (SELECT r.concurrency_key AS key, count(*) AS n FROM runfleet.runs r
                 WHERE r.queue = p_queue AND r.status = 'running'
                   AND r.concurrency_key IS NOT NULL
                 GROUP BY r.concurrency_key) AS b;
    END IF;
    -- Turns are stamped strictly after every key's last start, so a picked key goes to
    -- the back even among the keys this call picks.
    SELECT greatest(v_now, coalesce(max(k.last_start_ms), 0)) INTO v_stamp
      FROM runfleet.queue_keys k WHERE k.queue = p_queue;
    <<passes>>
    LOOP
        v_progress := false;
        FOR v_cand IN
            SELECT k.key, k.rate_tokens, k.rate_at_ms FROM runfleet.queue_keys k
             WHERE k.queue = p_queue AND (p_flows IS NOT NULL OR k.key = ANY(v_named_keys))
               AND (v_k IS NULL OR coalesce((v_running ->> k.key)::integer, 0) < v_k)
               AND (v_rate IS NULL
                    OR runfleet.bucket_tokens(v_rate, k.rate_tokens, k.rate_at_ms, v_now) >= 1)
             ORDER BY k.last_start_ms, k.key
        LOOP
            EXIT passes WHEN cardinality(v_picked) >= cardinality(v_named);
            IF p_flows IS NULL THEN
                SELECT c.id INTO v_run FROM runfleet.runs c
                 WHERE c.id = ANY(v_named) AND c.id <> ALL(v_picked)
                   AND c.concurrency_key = v_cand.key
                 ORDER BY c.rank_ms, c.id LIMIT 1;
            ELSE
                SELECT c.id INTO v_run FROM runfleet.runs c
                 WHERE c.queue = p_queue AND c.concurrency_key = v_cand.key
                   AND c.status = 'pending' AND c.waiting_reason IS NULL AND c.owner_host IS NULL
                   AND c.claim_host IS NULL AND c.heartbeat_at_ms IS NULL
                   AND c.cancel_requested_at_ms IS NULL
                   AND (c.flow = ANY(p_flows) OR c.id = ANY(v_named))
                   AND c.id <> ALL(v_picked)
                 ORDER BY c.rank_ms, c.id LIMIT 1 FOR UPDATE SKIP LOCKED;
            END IF;
            IF v_run IS NULL THEN
                IF p_flows IS NOT NULL
                   AND NOT EXISTS (SELECT FROM runfleet.runs c
                                    WHERE c.queue = p_queue AND c.concurrency_key = v_cand.key
                                      AND c.status = 'pending' AND c.waiting_reason IS NULL
                                      AND c.owner_host IS NULL AND c.claim_host IS NULL) THEN
                    v_stamp := v_stamp + 1;
                    UPDATE runfleet.queue_keys SET last_start_ms = v_stamp  -- idle: to the back
                     WHERE queue = p_queue AND key = v_cand.key;
                ELSE
                    v_fruitless := v_fruitless + 1;
                    EXIT passes WHEN v_fruitless >= 64;
                END IF;
                CONTINUE;
            END IF;
            v_picked := v_picked || v_run;
            v_progress := true;
            v_stamp := v_stamp + 1;
            v_running := jsonb_set(v_running, ARRAY[v_cand.key],
                                   to_jsonb(coalesce((v_running ->> v_cand.key)::integer, 0) + 1));
            UPDATE runfleet.queue_keys SET last_start_ms = v_stamp,
                   rate_tokens = CASE WHEN v_rate IS NOT NULL THEN runfleet.bucket_tokens(
                                     v_rate, v_cand.rate_tokens, v_cand.rate_at_ms, v_now) - 1 END,
                   rate_at_ms = CASE WHEN v_rate IS NOT NULL THEN v_now END
             WHERE queue = p_queue AND key = v_cand.key;
        END LOOP;
        EXIT WHEN NOT v_progress OR cardinality(v_picked) >= cardinality(v_named);
    END LOOP;
    IF v_qrate IS NOT NULL AND cardinality(v_picked) < cardinality(v_named) THEN
        -- the queue's tokens granted for these slots, unused
        UPDATE runfleet.queues
           SET rate_tokens = least(greatest(rate_per_s, 1),
                                   rate_tokens + cardinality(v_named) - cardinality(v_picked))
         WHERE name = p_queue;
    END IF;
    RETURN QUERY
        WITH own AS (
            SELECT n.id, n.o FROM unnest(v_named) WITH ORDINALITY AS n(id, o)
             WHERE n.id = ANY(v_picked)
        ), spare AS (
            SELECT n.id, row_number() OVER (ORDER BY n.o) AS k
              FROM unnest(v_named) WITH ORDINALITY AS n(id, o) WHERE n.id <> ALL(v_picked)
        ), other AS (
            SELECT p.id, row_number() OVER (ORDER BY p.o) AS k
              FROM unnest(v_picked) WITH ORDINALITY AS p(id, o) WHERE p.id <> ALL(v_named)
        )
        SELECT o.id, o.id FROM own o
        UNION ALL
        SELECT s.id, x.id FROM other x JOIN spare s ON s.k = x.k;
END
$$;

-- The single claims' turn (claim_if_fresh, and start_grant for claim_and_activate and
-- activate): key_pick_many for one named run. NULL: its slot starts nothing.
CREATE FUNCTION runfleet.key_pick(p_id text, p_flows text[])
    RETURNS text LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
    SELECT t.pick_id FROM runfleet.runs r,
           LATERAL runfleet.key_pick_many(r.queue, ARRAY[p_id], p_flows) AS t
     WHERE r.id = p_id
$$;

-- claim_and_activate and activate (one named run, no look-ahead): a slot of the queue,
-- then of the run's key, in that order (store/sql/runs.sql).
CREATE FUNCTION runfleet.start_grant(p_id text)
    RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_queue text;
BEGIN
    SELECT r.queue INTO v_queue FROM runfleet.runs r WHERE r.id = p_id;
    IF coalesce(runfleet.queue_free_slots(v_queue), 1) <= 0 THEN
        RETURN false;
    END IF;
    RETURN runfleet.key_pick(p_id, NULL) IS NOT NULL;
END
$$;

-- Plans made on a young table do not outlive its growth (0025): runfleet.analyze_grown
-- analyzes a runfleet table whose committed rows at least doubled (plus 200) since
-- Postgres last counted them, which invalidates every plan cached on it. A worker's
-- connections prepare their statements in the fleet's first seconds, when runs and the
-- journal hold a handful of rows; a plan made then reads a one-page table by a
-- sequential scan, and Postgres keeps it until the table's statistics change, which
-- autovacuum does only once a minute at best: a settlement beside 8,000 runs read them
-- all twice (1.5-2 ms a statement, growing with the table; docs/producer.md, "Plans
-- made on a young table"). Every worker's sweeper calls this every tick (Settings.
-- refresh_statistics); a doubling rule costs one ANALYZE per table per doubling, so it
-- matters while a table is young and is nearly free once it is large, where
-- autovacuum's own rule (10 % changed) is the finer one.
-- - Committed rows (the statistics collector's live count), not pages: pages also grow
--   under a bulk insert still in flight, and an ANALYZE then finds no live row in them
--   and records an empty table of many pages, which the planner reads as "no rows, ever":
--   every join of runs to itself became a nested loop of whole-index scans (seen: a
--   settlement running past a minute beside 1,000 runs admitted in one transaction).
-- - One table a call, the most grown first: ANALYZE writes the counts in place (they
--   survive a rollback) and the statistics transactionally, so nothing may fail after it
--   in the same call, or the table would look counted with its plans unchanged.
-- - A table a VACUUM holds (autovacuum's) is skipped after 100 ms, not waited for: the
--   VACUUM counts the table itself, and waiting would stall the sweeper's tick and, past
--   deadlock_timeout, cancel that autovacuum.
-- - Calls do not overlap (a try-lock: the loser skips).
-- SECURITY DEFINER: ANALYZE needs the tables' owner; it takes no input, and only the
-- worker role may call it. Answers the table it analyzed, if any.
CREATE FUNCTION runfleet.analyze_grown()
    RETURNS TABLE (table_name text, rows_counted bigint, rows_now bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms' AS
$$
DECLARE
    v record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(732013, 1) THEN
        RETURN;
    END IF;
    FOR v IN
        SELECT g.rel, g.relname, g.counted, g.live
          FROM (SELECT c.oid::regclass AS rel, c.relname::text AS relname,
                       greatest(c.reltuples, 0)::bigint AS counted,
                       pg_stat_get_live_tuples(c.oid) AS live
                  FROM pg_class c
                 WHERE c.relnamespace = 'runfleet'::regnamespace AND c.relkind = 'r'
                OFFSET 0) AS g  -- every count read before any ANALYZE
         WHERE g.live >= 2 * g.counted + 200
         ORDER BY g.live::float8 / greatest(g.counted, 1) DESC, g.relname
    LOOP
        BEGIN
            EXECUTE format('ANALYZE %s', v.rel);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        table_name := v.relname;
        rows_counted := v.counted;
        rows_now := v.live;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION runfleet.analyze_grown() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runfleet.analyze_grown() TO runfleet_worker;

-- A settlement batch and the parents' hand-over, each planned once per connection (0025):
-- runfleet.settle_owned and runfleet.notify_parents hold the statements store/sql/runs.sql
-- (settle_many) and store/sql/waits.sql (notify_parents) sent as they were, with generic
-- plans. Sent as statements with their arrays' values visible, a custom plan looked
-- cheaper than the generic one on every call (an array parameter is estimated at ten
-- elements, a value at its own), so every settlement planned both again: 0.8 and 1.0 ms
-- of planning a call against 0.36 and 0.04 ms of execution, once the tables' statistics
-- were current (pg_stat_statements in the user's loop; docs/producer.md, "Plans made on a
-- young table"). A generic plan is made from the statistics runfleet.analyze_grown keeps
-- current, and made again whenever it refreshes them. JIT off, as for the walk (0024).
-- SECURITY INVOKER: the caller's privileges and row security, as the statements had.

-- transition_owned for a batch of terminal settlements (completed or failed) of one
-- owner: each row keeps its own fence (owner and the epoch it was activated at) and its
-- own cancel guard, its own record and its clocks closed. Rows are locked in id order
-- first (see runs.heartbeat). A row missing from the answer lost its fence or its guard:
-- the caller reads it to learn which.
CREATE FUNCTION runfleet.settle_owned(
    p_ids text[], p_epochs bigint[], p_statuses text[], p_patches jsonb[], p_results text[],
    p_guards boolean[], p_kinds text[], p_seqs bigint[], p_payloads jsonb[],
    p_digests text[], p_source_id text, p_host text, p_pid integer, p_nonce text)
    RETURNS TABLE (run runfleet.runs, now_ms bigint)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT * FROM unnest(p_ids, p_epochs, p_statuses, p_patches, p_results, p_guards,
                             p_kinds, p_seqs, p_payloads, p_digests)
            AS w(id, epoch, to_status, patch, result, guard, kind, seq, payload, digest)
    ), locked AS MATERIALIZED (
        SELECT r.id FROM runfleet.runs r
         WHERE r.id = ANY(p_ids) ORDER BY r.id FOR UPDATE
    ), moved AS (
        UPDATE runfleet.runs AS r SET
            status = w.to_status, state = r.state || w.patch,
            result = coalesce(w.result::json, r.result),
            owner_host = NULL, owner_pid = NULL, owner_nonce = NULL, heartbeat_at_ms = NULL,
            recoveries = 0,
            waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
            waiting_request = NULL, waiting_deferred = NULL,
            updated_at_ms = runfleet.now_ms()
          FROM wanted w JOIN locked l ON l.id = w.id
         WHERE r.id = w.id AND r.status = 'running'
           AND w.to_status IN ('completed', 'failed', 'cancelled')
           AND r.owner_host = p_host AND r.owner_pid = p_pid AND r.owner_nonce = p_nonce
           AND r.epoch = w.epoch
           AND (NOT w.guard OR r.cancel_requested_at_ms IS NULL)
        RETURNING r AS run, runfleet.now_ms() AS now_ms, r.id, w.kind AS journal_kind,
                  w.seq AS journal_seq, w.payload AS journal_payload,
                  w.digest AS journal_digest
    ), journaled AS (
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,
                                      at_ms)
        SELECT m.id, m.journal_kind, p_source_id, m.journal_seq, m.journal_payload,
               m.journal_digest, m.now_ms
          FROM moved m
    ), closed AS (
        UPDATE runfleet.clocks AS c SET completed_at_ms = runfleet.now_ms()
          FROM moved m
         WHERE c.run_id = m.id AND c.completed_at_ms IS NULL
    )
    SELECT m.run, m.now_ms FROM moved m;
END
$$;

-- Settled children complete the deferred every parent awaits them through (diamond edges
-- included) and clear the wait of each parent parked on one. The parents are those of
-- EVERY round of a child's lineage: a diamond's second parent joined an earlier round and
-- follows the handoff to this one, with no edge of its own here. A parent already settled
-- gets nothing (a settled run takes nothing): no deferred is written onto it.
-- p_only_parent, when set, limits the hand-over to that parent. No row lock is taken
-- first: a parent parking concurrently holds its row lock, so the UPDATE below waits for
-- that park to commit and then sees the wait it must clear. Takes a batch (p_children[i]
-- settled with p_values[i], canonical JSON text); answers the woken parents' rows, each
-- with the child that woke it.
CREATE FUNCTION runfleet.notify_parents(p_children text[], p_values text[],
                                        p_only_parent text)
    RETURNS TABLE (run runfleet.runs, now_ms bigint, woken_by text)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH settled AS (
        SELECT * FROM unnest(p_children, p_values) AS s(child, value)
    ), edges AS (
        -- From the batch outwards, each lookup a LATERAL subquery with an ORDER BY (never
        -- flattened into a join), as in runfleet.attached_descendants: a generic plan made
        -- while the tables were young may read a grown table once per probe, never join
        -- runs to itself (as plain joins, one such plan read runs x runs x runs and a
        -- settlement ran past a minute beside 1,000 runs).
        SELECT DISTINCT s.child, s.value, e.parent_id FROM settled s
         CROSS JOIN LATERAL (SELECT c.lineage_id FROM runfleet.runs c
                              WHERE c.id = s.child ORDER BY c.id) c
         CROSS JOIN LATERAL (SELECT m.id FROM runfleet.runs m
                              WHERE m.lineage_id = c.lineage_id ORDER BY m.id) m
         CROSS JOIN LATERAL (SELECT e.parent_id FROM runfleet.run_parents e
                              WHERE e.child_id = m.id
                                AND (p_only_parent IS NULL OR e.parent_id = p_only_parent)
                              ORDER BY e.parent_id) e
         CROSS JOIN LATERAL (SELECT p.id FROM runfleet.runs p
                              WHERE p.id = e.parent_id
                                AND p.status NOT IN ('completed', 'failed', 'cancelled')
                              ORDER BY p.id) p
    ), completed AS (
        INSERT INTO runfleet.deferreds (run_id, name, value, completed_at_ms, digest)
        SELECT parent_id, 'child:' || child, value::json, runfleet.now_ms(),
               runfleet.value_digest(value::json) FROM edges
        ON CONFLICT (run_id, name) DO NOTHING
        RETURNING run_id
    )
    UPDATE runfleet.runs AS r SET
        waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
        waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
      FROM edges
     WHERE r.id = edges.parent_id
       AND r.waiting_deferred = 'child:' || edges.child
       AND r.status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING r, runfleet.now_ms(), edges.child;
END
$$;
-- runfleet schema v26: a lost execution that made progress starts the recoveries in a row
-- again.
--
-- A run whose executions keep ending in a lost process is parked `dead` after
-- Settings.max_recoveries takeovers in a row (0012). A clean end of an execution (a park,
-- a release, a settlement) starts the count again, and so does progress: counting only
-- clean ends would park as poison a healthy run that keeps recording steps while workers
-- are killed around it (five-step runs under 30 SIGKILLs over three workers are taken
-- over up to four times each: tests/flows/test_crash_ledger.py). The execution the
-- takeover replaces is asked whether it recorded anything (a row of runfleet.steps at its
-- epoch: a step, a clock, a child, an answer). If it did, the losses before it are not in
-- a row with this one: the count starts again, this loss being the first. A poison run
-- re-runs from its records and ends its process before it records anything new, so it
-- still reaches the limit after as many executions as before. The steal and the bury
-- (store/sql/runs.sql) both read the count through this function, under the run's row
-- lock, so they agree on it.
-- Invoker's rights: a worker reads the steps of any run (steps_fleet); one probe of the
-- run's primary key range of runfleet.steps. A SQL function (its subquery keeps the
-- planner from inlining it: planned at each takeover, which is rare).
CREATE FUNCTION runfleet.recoveries_in_a_row(p_run_id text, p_epoch bigint, p_recoveries integer)
    RETURNS integer LANGUAGE sql STABLE AS
$$
    SELECT CASE WHEN EXISTS (SELECT FROM runfleet.steps s
                              WHERE s.run_id = p_run_id AND s.epoch = p_epoch)
                THEN 0 ELSE p_recoveries END
$$;
-- runfleet schema v27: a settlement with nothing to hand over is one statement.
--
-- A batch settlement was a transaction of five round trips: BEGIN, the settlement
-- (runfleet.settle_owned), the walk of attached descendants to cancel
-- (runfleet.attached_descendants), the parents' hand-over (runfleet.notify_parents),
-- COMMIT. For a run that has no parent and no open attached descendant the last two
-- find nothing; in the user's loop of single enqueues they took 245 of the 680 us of
-- server time a run's settlement took, besides the transaction's own two round trips
-- (pg_stat_statements; docs/producer.md, "A settlement with nothing to hand over").
--
-- runfleet.settle_alone settles the batch as settle_owned does, in the caller's single
-- autocommitted statement, and then asks two questions in statements after the row
-- locks were won (a VOLATILE function's statements each take a fresh snapshot, as the
-- separate statements did): does any run of the batch have a parent edge on any round
-- of its lineage (the hand-over's reach), and does the walk find an open attached
-- descendant (the cascade's)? If either does, the settlement is undone (the block's
-- savepoint: no error reaches the client or the server's log) and the answer is one
-- row with `refused` true: nothing of it is written, and the caller settles the batch
-- in the transaction of five. Otherwise the rows it moved, `refused` false.
--
-- A parent joining concurrently is handed the outcome exactly as before: an edge
-- committed before the question is seen (and the batch goes the long way); a joiner
-- not yet committed holds the lineage's rows (store/dag.py, Dag.deliver_settled: FOR
-- SHARE), so the settlement's UPDATE waits for it, and the question then sees its edge;
-- a joiner that comes later waits on the settlement's row locks and then finds the run
-- settled and takes the outcome itself.
--
-- A child run (its parent's edge is there from birth; its state names the parent) is
-- refused before anything is written: one probe of the rows about to be locked, not a
-- settlement undone. The question after the settlement is one statement of index
-- probes (an edge to or from any round of each run's lineage), and only when a round
-- has a child, the walk itself (runfleet.attached_descendants, 0024) for an open one.
-- Generic plans, planned once per connection, as settle_owned's.
CREATE FUNCTION runfleet.settle_alone(
    p_ids text[], p_epochs bigint[], p_statuses text[], p_patches jsonb[], p_results text[],
    p_guards boolean[], p_kinds text[], p_seqs bigint[], p_payloads jsonb[],
    p_digests text[], p_source_id text, p_host text, p_pid integer, p_nonce text)
    RETURNS TABLE (run runfleet.runs, now_ms bigint, refused boolean)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
DECLARE
    v_runs runfleet.runs[];
    v_now bigint[];
    v_parents boolean;
    v_children boolean;
BEGIN
    SELECT EXISTS (SELECT FROM runfleet.runs r
                    WHERE r.id = ANY(p_ids) AND r.state->>'parent' IS NOT NULL)
      INTO v_parents;
    IF v_parents THEN
        RETURN QUERY SELECT NULL::runfleet.runs, NULL::bigint, true;
        RETURN;
    END IF;
    BEGIN
        SELECT array_agg(s.run), array_agg(s.now_ms) INTO v_runs, v_now
          FROM runfleet.settle_owned(p_ids, p_epochs, p_statuses, p_patches, p_results,
                                     p_guards, p_kinds, p_seqs, p_payloads, p_digests,
                                     p_source_id, p_host, p_pid, p_nonce) AS s;
        SELECT coalesce(bool_or(e.parents), false), coalesce(bool_or(e.children), false)
          INTO v_parents, v_children
          FROM unnest(p_ids) AS s(id)
         CROSS JOIN LATERAL (SELECT c.lineage_id FROM runfleet.runs c
                              WHERE c.id = s.id ORDER BY c.id) c
         CROSS JOIN LATERAL (SELECT m.id FROM runfleet.runs m
                              WHERE m.lineage_id = c.lineage_id ORDER BY m.id) m
         CROSS JOIN LATERAL (
             SELECT EXISTS (SELECT FROM runfleet.run_parents p WHERE p.child_id = m.id)
                        AS parents,
                    EXISTS (SELECT FROM runfleet.run_parents k WHERE k.parent_id = m.id)
                        AS children) e;
        IF v_children AND NOT v_parents THEN
            SELECT EXISTS (SELECT FROM runfleet.attached_descendants(p_ids)) INTO v_children;
        END IF;
        IF v_parents OR v_children THEN
            RAISE EXCEPTION USING ERRCODE = 'RF409';  -- caught below: the block is undone
        END IF;
    EXCEPTION WHEN SQLSTATE 'RF409' THEN
        RETURN QUERY SELECT NULL::runfleet.runs, NULL::bigint, true;
        RETURN;
    END;
    RETURN QUERY SELECT v_runs[i], v_now[i], false
                   FROM generate_subscripts(v_runs, 1) AS i ORDER BY i;
END
$$;

-- runfleet schema v28: who sweeps a kind is decided by a row only workers can lock.
--
-- Not an advisory lock: any login of the database may take any advisory lock, so a
-- producer's or the read-only operator's session holding the sweep's would stop every
-- sweep of the fleet (no takeover of a killed worker's runs, no delayed run started) for
-- as long as it liked. A tick locks its kind's row of runfleet.sweep_leases, FOR UPDATE
-- SKIP LOCKED: locking a row in any mode needs UPDATE on its table, and only
-- runfleet_worker (every table but `grants`, store/sql/roles.sql) and the owner have it;
-- producers and operators have no privilege on this table at all. The lock is the
-- tick's transaction's, released when it ends or its session dies; the CAS keeps
-- overlapping sweeps correct.
CREATE TABLE runfleet.sweep_leases (
    kind integer PRIMARY KEY,
    name text NOT NULL UNIQUE
);
INSERT INTO runfleet.sweep_leases (kind, name) VALUES
    (1, 'parked'), (2, 'stale_running'), (3, 'due_clocks'), (4, 'pending_cancellations'),
    (5, 'lost_pending'), (6, 'due_waits'), (7, 'deadline_passed'), (8, 'runnable_suspended');

-- A settlement never waits on a row lock either. runfleet.settle_owned (0025), which
-- runfleet.settle_alone (0027) calls, locked the batch's rows in id order and waited for
-- each: a producer holding its own run's row FOR UPDATE held every other run of the batch
-- (of any tenant) for as long as it liked. It now locks them SKIP LOCKED: a row locked
-- elsewhere is left out of the answer, as a lost fence is, and the caller, reading it
-- still owned at its epoch with no cancel asked, settles that run alone
-- (store/lifecycle.py, RowLocked). Otherwise the function is 0025's.
CREATE OR REPLACE FUNCTION runfleet.settle_owned(
    p_ids text[], p_epochs bigint[], p_statuses text[], p_patches jsonb[], p_results text[],
    p_guards boolean[], p_kinds text[], p_seqs bigint[], p_payloads jsonb[],
    p_digests text[], p_source_id text, p_host text, p_pid integer, p_nonce text)
    RETURNS TABLE (run runfleet.runs, now_ms bigint)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT * FROM unnest(p_ids, p_epochs, p_statuses, p_patches, p_results, p_guards,
                             p_kinds, p_seqs, p_payloads, p_digests)
            AS w(id, epoch, to_status, patch, result, guard, kind, seq, payload, digest)
    ), locked AS MATERIALIZED (
        SELECT r.id FROM runfleet.runs r
         WHERE r.id = ANY(p_ids) ORDER BY r.id FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE runfleet.runs AS r SET
            status = w.to_status, state = r.state || w.patch,
            result = coalesce(w.result::json, r.result),
            owner_host = NULL, owner_pid = NULL, owner_nonce = NULL, heartbeat_at_ms = NULL,
            recoveries = 0,
            waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
            waiting_request = NULL, waiting_deferred = NULL,
            updated_at_ms = runfleet.now_ms()
          FROM wanted w JOIN locked l ON l.id = w.id
         WHERE r.id = w.id AND r.status = 'running'
           AND w.to_status IN ('completed', 'failed', 'cancelled')
           AND r.owner_host = p_host AND r.owner_pid = p_pid AND r.owner_nonce = p_nonce
           AND r.epoch = w.epoch
           AND (NOT w.guard OR r.cancel_requested_at_ms IS NULL)
        RETURNING r AS run, runfleet.now_ms() AS now_ms, r.id, w.kind AS journal_kind,
                  w.seq AS journal_seq, w.payload AS journal_payload,
                  w.digest AS journal_digest
    ), journaled AS (
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,
                                      at_ms)
        SELECT m.id, m.journal_kind, p_source_id, m.journal_seq, m.journal_payload,
               m.journal_digest, m.now_ms
          FROM moved m
    ), closed AS (
        UPDATE runfleet.clocks AS c SET completed_at_ms = runfleet.now_ms()
          FROM moved m
         WHERE c.run_id = m.id AND c.completed_at_ms IS NULL
    )
    SELECT m.run, m.now_ms FROM moved m;
END
$$;

-- v29 (0029_unkeyed_turn.sql): unkeyed runs of a keyed queue share the empty key.
ALTER TABLE runfleet.runs DROP CONSTRAINT runs_concurrency_key_check;
ALTER TABLE runfleet.runs ADD CONSTRAINT runs_concurrency_key_check
    CHECK (length(concurrency_key) <= 255) NOT VALID;

CREATE OR REPLACE FUNCTION runfleet.run_concurrency_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_expr text;
    v_keyed boolean;
    v_key text;
BEGIN
    SELECT f.expression, q.keyed INTO v_expr, v_keyed
      FROM (SELECT) AS one
      LEFT JOIN runfleet.flow_keys f ON f.flow = NEW.flow
      LEFT JOIN runfleet.queues q ON q.name = NEW.queue;
    IF v_expr = 'scope' THEN
        v_key := NEW.state -> 'scopes' ->> 0;
    ELSIF v_expr LIKE 'kwargs.%' THEN
        v_key := NEW.payload::jsonb -> 'kwargs' ->> substr(v_expr, 8);
    ELSIF v_expr IS NOT NULL THEN
        v_key := NEW.payload::jsonb -> 'args' ->> substr(v_expr, 6)::integer;
    END IF;
    NEW.concurrency_key := left(nullif(v_key, ''), 255);
    IF NEW.concurrency_key IS NULL AND v_keyed THEN
        NEW.concurrency_key := '';  -- the no-key bucket: one key for every unkeyed run
    END IF;
    RETURN NEW;
END
$$;

-- Depth cap and a producer's deletes of its own settled runs (0030).
-- Refused when any value sits more than 64 levels below the top (`[[1]]` has its 1 at
-- level 2). The jsonpath walk is in C and stops at level 65; a value too short to nest
-- that deep (130 bytes) is not walked at all.
CREATE FUNCTION runfleet.depth_ok(p_field text, p_value jsonb) RETURNS boolean
    LANGUAGE plpgsql STABLE AS
$$
BEGIN
    IF p_value IS NOT NULL AND jsonb_path_exists(p_value, 'strict $.**{65}') THEN
        RETURN runfleet.refuse(p_field,
            'nested deeper than 64 levels (runfleet holds every stored value to 64)');
    END IF;
    RETURN true;
END
$$;

CREATE POLICY runs_producer_depth ON runfleet.runs AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK ((octet_length(payload::text) < 130 OR runfleet.depth_ok('payload', payload::jsonb))
                AND runfleet.depth_ok('state', state));
CREATE POLICY runs_producer_state_depth ON runfleet.runs AS RESTRICTIVE FOR UPDATE
    TO runfleet_producer
    USING (true)
    WITH CHECK (runfleet.depth_ok('state', state));
CREATE POLICY journal_producer_depth ON runfleet.journal AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (runfleet.depth_ok('payload', payload));

-- Answers and messages are values a worker hands to a flow: held to the same depth. An
-- answer is written only by runfleet.answer (a definer, which row-level security does
-- not hold), so a trigger checks the deferreds it writes (those with `answered_by`);
-- a producer's message, by a policy beside 0015's.
CREATE FUNCTION runfleet.answer_depth_ok() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    IF octet_length(NEW.value::text) >= 130 THEN
        PERFORM runfleet.depth_ok('value', NEW.value::jsonb);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER deferreds_answer_depth BEFORE INSERT ON runfleet.deferreds
    FOR EACH ROW WHEN (NEW.metadata ? 'answered_by')
    EXECUTE FUNCTION runfleet.answer_depth_ok();
CREATE POLICY run_messages_producer_depth ON runfleet.run_messages AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (octet_length(value::text) < 130 OR runfleet.depth_ok('value', value::jsonb));

-- Deleting settled runs and all that is theirs, for whoever may see them: what
-- delete_run (store/forks.py) calls. SECURITY DEFINER, so a producer holds no DELETE on
-- any table (its raw SQL still cannot erase a record or a step of a run it keeps); the
-- rules are checked here instead, with the caller's grants as row-level security reads
-- them: every run named must be visible to the authenticated role and settled, or
-- nothing is deleted. Operators are not granted it (they read, they write nothing).
CREATE FUNCTION runfleet.delete_settled(p_ids text[])
    RETURNS TABLE (deleted_runs bigint, deleted_records bigint, deleted_steps bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_who name := session_user;
    v_granted jsonb;
    v_open text;
BEGIN
    IF NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = v_who AND (rolsuper OR rolbypassrls))
            OR pg_has_role(v_who, 'runfleet_migrator', 'MEMBER')
            OR pg_has_role(v_who, 'runfleet_worker', 'MEMBER')) THEN
        SELECT coalesce(jsonb_agg(DISTINCT g.scope), '[]'::jsonb) INTO v_granted
          FROM runfleet.grants g WHERE pg_has_role(v_who, g.role::oid, 'MEMBER');
        IF EXISTS (SELECT FROM runfleet.runs r
                    WHERE r.id = ANY (p_ids)
                      AND NOT (v_granted ? '*'
                               OR (jsonb_typeof(r.state -> 'scopes') = 'array'
                                   AND jsonb_array_length(r.state -> 'scopes') > 0
                                   AND v_granted @> (r.state -> 'scopes')))) THEN
            RAISE EXCEPTION 'permission denied: % may not delete these runs', v_who
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    SELECT r.id INTO v_open FROM runfleet.runs r
     WHERE r.id = ANY (p_ids) AND r.status NOT IN ('completed', 'failed', 'cancelled')
     LIMIT 1 FOR UPDATE;
    IF FOUND THEN
        PERFORM runfleet.refuse('run_id', format('run %s is not settled', quote_literal(v_open)));
    END IF;
    RETURN QUERY
    WITH doomed AS (SELECT unnest(p_ids) AS id),
    j AS (DELETE FROM runfleet.journal WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    s AS (DELETE FROM runfleet.steps WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    a AS (DELETE FROM runfleet.attempts WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    d AS (DELETE FROM runfleet.deferreds WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    c AS (DELETE FROM runfleet.clocks WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    e AS (DELETE FROM runfleet.run_events WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    m AS (DELETE FROM runfleet.run_messages WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    p AS (DELETE FROM runfleet.run_parents
           WHERE child_id IN (SELECT id FROM doomed) OR parent_id IN (SELECT id FROM doomed)
          RETURNING 1),
    r AS (DELETE FROM runfleet.runs WHERE id IN (SELECT id FROM doomed) RETURNING 1)
    SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM j), (SELECT count(*) FROM s);
END
$$;

-- runfleet schema v31: retention, the statistics refresh and the run DAG's edge inserts
-- are serialized by rows only workers can lock, as the sweeps are (0028).
--
-- Retention's pass took pg_try_advisory_lock(732012, 1), runfleet.analyze_grown (0025)
-- pg_try_advisory_xact_lock(732013, 1) and every parent edge a child's admission records
-- pg_advisory_xact_lock(7320112026): any login of the database may take any advisory
-- lock, so a producer's or the read-only operator's session that held one stopped every
-- retention pass, every statistics refresh or every child admission of the fleet for as
-- long as it liked. All three now use a row of runfleet.sweep_leases, which only
-- runfleet_worker and the owner may lock or write (store/sql/roles.sql grants producers
-- and operators nothing on it):
-- - an edge insert locks the `dag` row FOR UPDATE for its transaction (it waits: two
--   inserts that jointly close a cycle must not both pass their checks; a worker's wait
--   is bounded by its lock_timeout, store/config.py worker_lock_wait_ms);
-- - the statistics refresh locks its row FOR UPDATE SKIP LOCKED for its call (the
--   function runs as the owner), as a sweep tick does;
-- - a retention pass commits batch by batch, so no transaction spans it: it holds its
--   row as a timed lease instead (`holder`, `held_until_ms`, database time), taken when
--   free or expired, renewed after every batch and given back at the end; a process that
--   dies mid-pass holds retention off until its lease expires (store/retention.py).
ALTER TABLE runfleet.sweep_leases ADD COLUMN holder text, ADD COLUMN held_until_ms bigint;
INSERT INTO runfleet.sweep_leases (kind, name) VALUES
    (9, 'retention'), (10, 'statistics'), (11, 'dag');

-- runfleet.analyze_grown as in 0025, but for its lease: calls do not overlap (the
-- statistics row, SKIP LOCKED: the loser skips).
CREATE OR REPLACE FUNCTION runfleet.analyze_grown()
    RETURNS TABLE (table_name text, rows_counted bigint, rows_now bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms' AS
$$
DECLARE
    v record;
BEGIN
    IF NOT EXISTS (SELECT FROM runfleet.sweep_leases l WHERE l.name = 'statistics'
                      FOR UPDATE SKIP LOCKED) THEN
        RETURN;
    END IF;
    FOR v IN
        SELECT g.rel, g.relname, g.counted, g.live
          FROM (SELECT c.oid::regclass AS rel, c.relname::text AS relname,
                       greatest(c.reltuples, 0)::bigint AS counted,
                       pg_stat_get_live_tuples(c.oid) AS live
                  FROM pg_class c
                 WHERE c.relnamespace = 'runfleet'::regnamespace AND c.relkind = 'r'
                OFFSET 0) AS g  -- every count read before any ANALYZE
         WHERE g.live >= 2 * g.counted + 200
         ORDER BY g.live::float8 / greatest(g.counted, 1) DESC, g.relname
    LOOP
        BEGIN
            EXECUTE format('ANALYZE %s', v.rel);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        table_name := v.relname;
        rows_counted := v.counted;
        rows_now := v.live;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

-- runfleet.claim_fresh (0033): a stream delivery's read and claim (runs.claim_if_fresh) with
-- a generic plan, planned once per connection.
CREATE FUNCTION runfleet.claim_fresh(
    p_id text, p_flow text, p_ahead_flows text[], p_serves text[], p_host text,
    p_pid integer, p_nonce text, p_owner_key text, p_journal_kind text, p_source_id text,
    p_source_seq bigint)
    RETURNS TABLE (activated boolean, run runfleet.runs, now_ms bigint, limited boolean)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH seen AS (
        SELECT r.*, r AS whole, runfleet.now_ms() AS now_ms FROM runfleet.runs r
         WHERE r.id = p_id
    ), slots AS MATERIALIZED (
        -- The queue's fleet-wide limit, decided before any run row is locked (a rate's
        -- token is asked only for a fresh admission: the only row it can start).
        SELECT runfleet.queue_free_slots(
                   s.queue, CASE WHEN s.status = 'pending' AND s.owner_host IS NULL
                                  AND s.claim_host IS NULL AND s.waiting_reason IS NULL
                                  AND s.cancel_requested_at_ms IS NULL THEN 1 ELSE 0 END) AS free
          FROM seen s
    ), keyed AS MATERIALIZED (
        -- A keyed queue's turn: the run its round-robin across keys starts in the slot.
        SELECT CASE WHEN s.concurrency_key IS NULL THEN s.id
                    WHEN coalesce(slots.free, 1) > 0 AND s.status = 'pending'
                         AND s.owner_host IS NULL AND s.claim_host IS NULL
                         AND s.waiting_reason IS NULL AND s.cancel_requested_at_ms IS NULL
                         AND s.flow = p_flow
                    THEN runfleet.key_pick(s.id, coalesce(p_ahead_flows, ARRAY[p_flow]))
               END AS id
          FROM seen s, slots
    ), pick AS (
        SELECT c.id FROM seen s, slots, LATERAL (
            SELECT c.id, c.rank_ms FROM runfleet.runs c
             WHERE p_ahead_flows IS NOT NULL AND c.queue = s.queue
               AND c.status = 'pending' AND c.waiting_reason IS NULL AND c.owner_host IS NULL
               AND c.claim_host IS NULL AND c.priority > s.priority
             ORDER BY c.priority DESC, c.rank_ms, c.id LIMIT 1) AS c
         WHERE s.status = 'pending' AND s.flow = p_flow AND s.waiting_reason IS NULL
           AND s.claim_host IS NULL AND s.owner_host IS NULL AND s.heartbeat_at_ms IS NULL
           AND s.cancel_requested_at_ms IS NULL AND c.rank_ms < s.rank_ms
           AND (p_serves IS NULL OR s.queue = ANY(p_serves))
           AND s.concurrency_key IS NULL  -- a keyed run's slot is its keys' turn
    ), ahead AS MATERIALIZED (
        SELECT c.id FROM runfleet.runs c
         WHERE c.id = (SELECT p.id FROM pick p) AND c.status IS NOT DISTINCT FROM 'pending'
           AND c.waiting_reason IS NOT DISTINCT FROM NULL
           AND c.owner_host IS NOT DISTINCT FROM NULL
           AND c.claim_host IS NOT DISTINCT FROM NULL AND c.heartbeat_at_ms IS NULL
           AND c.cancel_requested_at_ms IS NULL AND c.flow = ANY(p_ahead_flows)
           AND c.concurrency_key IS NULL
           FOR UPDATE SKIP LOCKED
    ), activated AS (
        UPDATE runfleet.runs AS r SET
            status = 'running', owner_host = p_host, owner_pid = p_pid,
            owner_nonce = p_nonce, epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
            updated_at_ms = runfleet.now_ms()
         WHERE coalesce((SELECT free FROM slots), 1) > 0
           AND r.id = coalesce((SELECT a.id FROM ahead a), (SELECT k.id FROM keyed k))
           AND (r.flow = p_flow OR r.id IN (SELECT a.id FROM ahead a)
                OR r.id <> p_id)  -- another key's turn: key_pick chose among the flows
           AND r.status IS NOT DISTINCT FROM 'pending'
           AND r.waiting_reason IS NOT DISTINCT FROM NULL
           AND r.claim_host IS NOT DISTINCT FROM NULL AND r.owner_host IS NOT DISTINCT FROM NULL
           AND r.heartbeat_at_ms IS NULL AND r.cancel_requested_at_ms IS NULL
           AND (p_serves IS NULL OR r.queue = ANY(p_serves))
        RETURNING r AS whole, r.id, r.epoch, runfleet.now_ms() AS now_ms,
                  (SELECT free FROM slots) IS NOT NULL AS limited
    ), journaled AS (
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        SELECT a.id, p_journal_kind, p_source_id, p_source_seq, p.payload,
               left(encode(sha256(convert_to(p.payload::text, 'UTF8')), 'hex'), 32), a.now_ms
          FROM activated a,
               LATERAL (SELECT jsonb_build_object('owner', p_owner_key, 'epoch', a.epoch,
                                                  'from', 'pending')
                               || CASE WHEN a.id <> p_id  -- took a lower priority's slot
                                       THEN jsonb_build_object('ahead_of', p_id)
                                       ELSE '{}'::jsonb END AS payload) AS p
    ), refunded AS MATERIALIZED (
        -- A rate's token taken for a run this statement did not start goes back (0032).
        SELECT runfleet.rate_refund(s.queue, 1) AS n FROM seen s, slots
         WHERE slots.free > 0 AND NOT EXISTS (SELECT FROM activated)
    )
    SELECT true, a.whole, a.now_ms, a.limited FROM activated a
    UNION ALL
    SELECT false, s.whole, s.now_ms, (SELECT free FROM slots) IS NOT NULL FROM seen s
     WHERE (SELECT count(*) FROM refunded) >= 0;
END
$$;

-- The hot path reads by key whatever the statistics (0034).
ALTER FUNCTION runfleet.settle_owned(text[], bigint[], text[], jsonb[], text[], boolean[], text[],
                                     bigint[], jsonb[], text[], text, text, integer, text)
    SET enable_seqscan = off;
ALTER FUNCTION runfleet.settle_alone(text[], bigint[], text[], jsonb[], text[], boolean[], text[],
                                     bigint[], jsonb[], text[], text, text, integer, text)
    SET enable_seqscan = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_seqscan = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_hashjoin = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_mergejoin = off;
ALTER FUNCTION runfleet.attached_descendants(text[]) SET enable_seqscan = off;
ALTER FUNCTION runfleet.claim_fresh(text, text, text[], text[], text, integer, text, text, text,
                                    text, bigint)
    SET enable_seqscan = off;
