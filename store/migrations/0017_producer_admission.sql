-- runfleet schema v17: a parentless admission is one statement (the producer's fast path).
-- Until now it was two statements pipelined in one implicit transaction (the rows, then
-- their `created` records): one statement with the journal insert in a sibling CTE is
-- refused for every scoped producer, because row-level security (journal_scoped: the run
-- must be visible) cannot see a row a sibling CTE inserted. Inside a function the two
-- INSERTs are two statements, so the second sees the first's rows, and the caller sends
-- one statement: one parse/bind/execute, plans the function keeps for its session.
--
-- SECURITY INVOKER on purpose: every rule a producer's own INSERT meets still applies
-- unchanged, because it *is* the caller's INSERT: the scope policies (runs_scoped on the
-- rows, journal_scoped on the records), the restrictive policies of 0013 (no derived or
-- reserved ids, the payload and state caps, the database's clock), the column privileges
-- of store/sql/roles.sql, and the journal's writer (session_user, its column default).
-- Nothing is re-implemented here, so nothing can drift from the policies.
--
-- p_runs: the rows (store/sql/admit.sql `batch` documents the fields); p_records: one
-- `created` record per run ({id, source_seq, record, digest}). Returns every batch run
-- this role can see as it is after the insert, and whether this call inserted it.
CREATE FUNCTION runfleet.admit(p_runs jsonb, p_records jsonb, p_kind text, p_source_id text)
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
    -- joins (committed by anyone before this statement); and the open run holding a batch
    -- run's dedup_key (docs/how-to/queues.md): the caller whose insert that key's index skipped is
    -- answered with it, or refused.
    RETURN QUERY
    SELECT r.id = ANY (v_inserted), r FROM runfleet.runs r
     WHERE r.id = ANY (v_ids)
        OR (r.status IN ('pending', 'running', 'suspended')
            AND (r.queue, r.dedup_key) IN (
                SELECT b.queue, b.dedup_key
                  FROM jsonb_to_recordset(p_runs) AS b(queue text, dedup_key text)
                 WHERE b.dedup_key IS NOT NULL));
END
$$;

-- The index audit of `runs` (docs/producer.md "Indexes on runs"): runs_pending_idx
-- (created_at_ms, id) WHERE status = 'pending' is an entry in every admission and no read
-- plans with it any more: the sweeps scan runs_runnable_pending_idx (the same key, only the
-- runs a sweep may start) and runs_pending_flow_idx (by flow), and every other read of
-- pending runs (rq's job_ids, `runfleet runs`, the overdue report) is served by
-- runs_status_created_idx (status, created_at_ms). Dropped: one index entry and its WAL
-- less per admission and per claim.
DROP INDEX runfleet.runs_pending_idx;
