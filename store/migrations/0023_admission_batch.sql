-- runfleet schema v23: a batch admission that does not grow with the square of its size
-- (docs/producer.md, "A batch admission in linear time (0023)").
--
-- runfleet.admit (0017, 0021; its generic plans since 0022) tested membership in its own
-- array variables per row: `b.id = ANY (v_visible) AND NOT b.id = ANY (v_recorded)` for
-- every record, `r.id = ANY (v_inserted)` for every answered run, and `r.id = ANY (v_ids)`
-- wherever the planner read `runs` sequentially (a table not yet analyzed, as the bench's
-- is). In a generic plan an array variable is a parameter, which Postgres searches
-- linearly (only a constant array is hashed), so a batch of n runs made about n * n
-- comparisons: server-side, 135 us a run in a batch of 1,000, 475 in one of 4,000 and
-- 1,014 in one of 8,000 (load ~3-5). Same rules and same answer, now:
--
-- - the new rows are the INSERT's RETURNING (the runs' SELECT policies apply to it, as to
--   the re-read they replace; nothing else can change an uncommitted row);
-- - the runs it joins are a primary-key probe per id it did not insert (none for a batch
--   of new runs);
-- - every set of ids is a jsonb object's keys (`?` is a binary search);
-- - the records go to the visible batch runs that have none, as before.
CREATE OR REPLACE FUNCTION runfleet.admit(p_runs jsonb, p_records jsonb, p_kind text, p_source_id text)
    RETURNS TABLE (inserted boolean, run runfleet.runs)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS
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
