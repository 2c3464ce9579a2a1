-- runfleet schema v21: what an admission costs the server no longer grows with the backlog,
-- and no longer pays a SQL function's planning per written row (docs/producer.md, "What
-- an admission cost the server").
--
-- 1. runfleet.admit (0017) answered the batch's runs and the open run holding a batch
--    run's dedup_key in ONE query, `id = ANY (ids) OR (status IN open AND (queue,
--    dedup_key) IN (...))`: the planner served the OR with a bitmap scan of
--    runs_status_created_idx over every open run, so one admission read the whole
--    backlog (~5 ms of server time at 3,600 pending runs, against ~1 ms at none). Now the
--    batch's runs are a primary-key probe, and the dedup holders a probe of
--    runs_open_dedup_idx per key (LIMIT 1 in a LATERAL: the index is unique, and the
--    limit keeps the planner from a hash join over the index), made only when the batch
--    carries a key. The answer is the same rows.
--
-- 2. runfleet.run_expires_at_ms (0010), the expression and predicate of runs_expiry_idx,
--    had subqueries in its body, so Postgres could not inline it: every insert and every
--    non-HOT update of `runs` (admission, claim, settlement) ran it through the SQL
--    function executor twice, parsing and planning its body each statement: ~0.4-0.5 ms
--    per admitted row, about as much as all the other indexes together. The same
--    function as one expression is inlined when the index is opened. Same values for
--    every input (tests/store/test_admission_plans.py compares it with 0010's body), so
--    the index needs no rebuild.
CREATE OR REPLACE FUNCTION runfleet.run_expires_at_ms(status text, state jsonb, settled_at_ms bigint)
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

CREATE OR REPLACE FUNCTION runfleet.admit(p_runs jsonb, p_records jsonb, p_kind text, p_source_id text)
    RETURNS TABLE (inserted boolean, run runfleet.runs)
    LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
    v_ids text[];       -- the batch's ids: every lookup below is an index probe by them
    v_inserted text[];
    v_visible text[];
    v_recorded text[];
BEGIN
    SELECT coalesce(array_agg(b.id), '{}') INTO v_ids
      FROM jsonb_to_recordset(p_records) AS b(id text);

    -- No conflict target: every unique index is an arbiter (see runs.insert for why). A
    -- row whose id or (lineage_id, round_ordinal) is taken is skipped, and its caller
    -- joins or is refused.
    WITH ins AS (
        INSERT INTO runfleet.runs AS r (
            id, flow, queue, status, state, payload, lineage_id, round_ordinal, parent_run_id,
            created_at_ms, updated_at_ms, waiting_reason, waiting_wake_at_ms,
            priority, dedup_key)  -- docs/how-to/queues.md: NULL priority = the queue's default (trigger)
        SELECT b.id, b.flow, b.queue, 'pending',
            b.state || CASE WHEN b.timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
                       ELSE jsonb_build_object('deadline_ms', LEAST(t.now_ms + b.timeout_ms,
                                                  (b.state->>'deadline_ms')::bigint))
                       END,
            b.payload::json,  -- canonical text, kept verbatim (store/values.py)
            b.lineage_id, b.round_ordinal, b.previous_round_id, t.now_ms, t.now_ms,
            CASE WHEN b.delay_until_ms IS NOT NULL THEN 'timer' END, b.delay_until_ms,
            b.priority, b.dedup_key
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
        RETURNING r.id
    )
    SELECT coalesce(array_agg(ins.id), '{}') INTO v_inserted FROM ins;

    -- The records, for the batch runs that have none: exactly the rows just inserted,
    -- since every other run got its record in the transaction that admitted it (retention
    -- deletes a run's records only with the run). A run this role cannot see gets none.
    -- No ON CONFLICT on the journal: an address collision fails the whole admission.
    SELECT coalesce(array_agg(r.id), '{}') INTO v_visible
      FROM runfleet.runs r WHERE r.id = ANY (v_ids);
    SELECT coalesce(array_agg(j.run_id), '{}') INTO v_recorded
      FROM runfleet.journal j WHERE j.run_id = ANY (v_visible) AND j.kind = p_kind;
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT b.id, p_kind, p_source_id, b.source_seq, b.record, b.digest, runfleet.now_ms()
      FROM jsonb_to_recordset(p_records) AS b(id text, source_seq bigint, record jsonb,
                                               digest text)
     WHERE b.id = ANY (v_visible) AND NOT b.id = ANY (v_recorded);

    -- Every batch run as it is now: the new rows, and the existing ones a re-admission
    -- joins (committed by anyone before this statement), by primary key.
    RETURN QUERY
    SELECT r.id = ANY (v_inserted), r FROM runfleet.runs r WHERE r.id = ANY (v_ids);
    -- And the open run holding a batch run's dedup_key (docs/how-to/queues.md): the caller whose
    -- insert that key's index skipped is answered with it, or refused. A probe of
    -- runs_open_dedup_idx per key (its predicate spelt out so the planner may use it),
    -- and none at all for a batch without keys: one OR'd with the id lookup read every
    -- open run (a bitmap scan of the status index), so an admission cost grew with the
    -- backlog.
    IF jsonb_path_exists(p_runs, '$[*] ? (@.dedup_key != null)') THEN
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
         WHERE NOT (h.r).id = ANY (v_ids);
    END IF;
END
$$;
