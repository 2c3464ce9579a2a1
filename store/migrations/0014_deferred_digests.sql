-- runfleet schema v14: a deferred completion records the digest of the value that won,
-- so a second answer can be told whether the value that stands is its own (a retry whose
-- first try committed unseen) or another one, and the journal says which value won.
--
-- runfleet.value_digest is the digest of a stored value's exact text (a json column keeps
-- the text verbatim): sha256, the first 32 hex digits, as store/values.py text_digest
-- takes it in Python. Written by every path that completes a deferred: runfleet itself
-- (store/sql/waits.sql deferred_insert, notify_parents) and runfleet.answer below, which
-- also journals it. Rows written before this migration keep a NULL digest.
ALTER TABLE runfleet.deferreds ADD COLUMN digest text;

CREATE FUNCTION runfleet.value_digest(p_value json) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS
$$ SELECT left(encode(sha256(convert_to(p_value::text, 'UTF8')), 'hex'), 32) $$;

-- The 0013 function (the limits it holds every caller to), unchanged but for the digest
-- it writes and journals, and an event answered before being 'existing' ahead of the
-- answer cap.
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
