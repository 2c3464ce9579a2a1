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
