-- runfleet schema v13: the database holds every tenant to its limits through any client.
-- Until now a producer's raw SQL could choose what only runfleet should: a journal seq
-- ahead of the sequence (the next appends anywhere in the fleet then failed with a unique
-- violation), a worker's journal address, a derived run id (another run's child or next
-- round), or a 3 MB payload, meta or answer. The Python checks stay the first line (typed
-- errors); these are the second, for whoever holds a producer's credentials.
-- Column privileges (which columns a producer may write at all) are in store/sql/roles.sql.

-- The journal's order is the database's: seq is an identity column, always generated (a
-- producer's column privileges do not include it, so no INSERT can name it, and an
-- identity needs no USAGE on its sequence, which producers no longer hold).
DO $$
DECLARE
    v_next bigint;
BEGIN
    v_next := greatest(nextval('runfleet.journal_seq_seq'),
                       coalesce((SELECT max(seq) FROM runfleet.journal), 0) + 1);
    ALTER TABLE runfleet.journal ALTER COLUMN seq DROP DEFAULT;
    DROP SEQUENCE runfleet.journal_seq_seq;
    ALTER TABLE runfleet.journal ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
    PERFORM setval(pg_get_serial_sequence('runfleet.journal', 'seq'), v_next, false);
END
$$;

-- A record's address is (source_id, source_seq) *of its writer*: the authenticated role
-- (session_user, filled in by the database; nobody may write the column). A producer that
-- reads a worker's source id off its own runs can no longer take that worker's next
-- addresses and make its appends (for every tenant's runs) collide. Rows written before
-- this migration count as the migrator's.
ALTER TABLE runfleet.journal
    ADD COLUMN writer regrole NOT NULL DEFAULT quote_ident(session_user)::regrole;
ALTER TABLE runfleet.journal DROP CONSTRAINT journal_source_id_source_seq_key;
ALTER TABLE runfleet.journal
    ADD CONSTRAINT journal_address_key UNIQUE (source_id, source_seq, writer);

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

-- runfleet.answer (0009) holds the same limits whoever calls it: an answer within the
-- payload cap, names and notes within 255 characters, a reason within the cap, and the
-- answer cap the smaller of the caller's and the database's (a raw call can no longer
-- choose its own). Checked first: a refusal depends on the arguments only, never on the
-- run, so it tells an ungranted caller nothing.
CREATE OR REPLACE FUNCTION runfleet.answer(
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
        IF v_answers >= v_max_answers THEN
            RETURN QUERY SELECT 'limit'::text, NULL::text, v_target, false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO runfleet.deferreds (run_id, name, value, metadata, completed_at_ms)
    VALUES (p_run_id, v_target, v_value,
            jsonb_build_object('answered_by', v_who::text, 'note', p_note), runfleet.now_ms())
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
                                    'answered_by', v_who::text, 'note', p_note);
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
