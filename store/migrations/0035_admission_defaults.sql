-- runfleet schema v35: an admission runs no per-row trigger for its priority, and one
-- lookup for its concurrency key.
--
-- A run admitted without a priority took its queue's default from runs_default_priority,
-- a SECURITY DEFINER trigger: a function call per row that switches the user and the
-- search_path and runs its own query. In a batch of admissions (a group commit) the
-- triggers were most of an inserted row's cost: 3,000 rows inserted in one statement took
-- ~90 us a row with both BEFORE triggers, ~62 us with the priority given, ~27 us with
-- neither. runfleet.admit and runfleet.admit_one now read the queue's default in their own
-- INSERT, so the trigger's condition (`NEW.priority IS NULL`) is false for every producer
-- admission; it stays for every other writer of runs. The producer may read
-- runfleet.queues (store/sql/roles.sql), and could name any priority itself: nothing it
-- may do changes.
--
-- runs_concurrency_key still fires for every admission (a producer may not write the key:
-- it is derived, so a tenant cannot pick another tenant's slots); it now reads the flow's
-- key expression and the queue's `keyed` in one query instead of two.
--
-- The functions keep their settings (0022, 0034): CREATE OR REPLACE restates them.
CREATE OR REPLACE FUNCTION runfleet.admit(p_runs jsonb, p_records jsonb, p_kind text, p_source_id text)
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
CREATE OR REPLACE FUNCTION runfleet.admit_one(
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
