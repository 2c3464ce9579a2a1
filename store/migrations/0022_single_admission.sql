-- runfleet schema v22: a single enqueue pays for its statement's work, not for planning
-- it again on every call (docs/producer.md, "A single enqueue after 0022").
--
-- 1. runfleet.admit (0017, 0021) re-planned its statements on every call. PL/pgSQL keeps a
--    custom plan while it looks cheaper than the generic one, and `id = ANY (v_ids)` with
--    a one-element array always does (the generic plan assumes ten), so each call planned
--    the INSERT into `runs` (RLS, 20 indexes, three triggers) and its lookups afresh:
--    server-side, 500 one-run calls in a rolled-back DO block, 1.3-2.3 ms a call against
--    0.44-1.24 ms with the generic plans, alternated, load ~12. The generic plans are the
--    same index probes (tests/store/test_admission_plans.py reads them from the
--    transaction's counters), so the function now always uses them.
--
-- 2. runfleet.admit_one: the same admission for one run, with scalar parameters (no jsonb
--    batch to build, encode and expand three times). The single `enqueue` calls it;
--    batches keep runfleet.admit. Same rules, because it is the same kind of function:
--    SECURITY INVOKER (every policy, column grant and the journal's session_user writer
--    apply to its INSERTs as to a raw INSERT), the same INSERT ... ON CONFLICT DO NOTHING
--    against every unique index (the triggers fill priority and concurrency_key as for
--    any insert), the record written when the run is visible and has none, and the same
--    answer: the run as it is now if this role can see it (`inserted` true when this call
--    wrote it), and, when it was not written and carries a dedup_key, the open run holding
--    that key. tests/security/test_admit_function.py runs every rule on both functions.
--    1,500 calls in one rolled-back DO block: 0.43-0.57 ms a call against 0.77-1.0 ms for
--    runfleet.admit with generic plans, alternated, load ~11.
ALTER FUNCTION runfleet.admit(jsonb, jsonb, text, text) SET plan_cache_mode = force_generic_plan;

CREATE FUNCTION runfleet.admit_one(
    p_id text, p_flow text, p_queue text, p_state jsonb, p_payload text, p_lineage_id text,
    p_round_ordinal integer, p_previous_round_id text, p_delay_until_ms bigint,
    p_timeout_ms bigint, p_priority integer, p_dedup_key text,
    p_source_seq bigint, p_record jsonb, p_digest text, p_kind text, p_source_id text)
    RETURNS TABLE (inserted boolean, run runfleet.runs)
    LANGUAGE plpgsql VOLATILE AS
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
        priority, dedup_key)  -- docs/how-to/queues.md: NULL priority = the queue's default (trigger)
    VALUES (p_id, p_flow, p_queue, 'pending',
        p_state || CASE WHEN p_timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
                   ELSE jsonb_build_object('deadline_ms', LEAST(v_now + p_timeout_ms,
                                              (p_state->>'deadline_ms')::bigint))
                   END,
        p_payload::json,  -- canonical text, kept verbatim (store/values.py)
        p_lineage_id, p_round_ordinal, p_previous_round_id, v_now, v_now,
        CASE WHEN p_delay_until_ms IS NOT NULL THEN 'timer' END, p_delay_until_ms,
        p_priority, p_dedup_key)
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
