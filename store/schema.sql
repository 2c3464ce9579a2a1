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
CREATE INDEX runs_stranded_claim_idx ON runfleet.runs (claimed_at_ms, id)
    WHERE claim_host IS NOT NULL;

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

-- What a producer may admit (broker/trust.py says the same first): never a derived id. A
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

-- Wake marks (0015): per queue, the Postgres time before which every admission's wake
-- has been delivered or destroyed; the lost-pending sweep reads it (docs/backlog.md).
CREATE TABLE runfleet.wake_marks (
    queue                text PRIMARY KEY,
    delivered_through_ms bigint NOT NULL,
    updated_at_ms        bigint NOT NULL
);
