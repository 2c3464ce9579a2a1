-- runfleet schema v25: plans made on a young table do not outlive its growth, and a
-- settlement's statements are not planned again at every call.
--
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
