-- runfleet schema v24: a settlement's walk of attached descendants costs its probes: not a
-- scan of every run, not a plan per call, not a JIT compile (docs/producer.md, "The
-- settlement's descendant walk").
--
-- Every terminal settlement batch (settle_many) and every cancel asks which unsettled
-- runs its lineage reaches through attached edges. As a statement (store/sql/runs.sql,
-- attached_descendants_many) its recursive step joined run_parents and runs as plain
-- joins, which the planner, reading a run_parents never analyzed, drove from a
-- sequential scan of every row of runfleet.runs: 3 ms a settlement beside 1,500 settled
-- runs, growing with the table (pg_stat_statements, the user's loop of single enqueues,
-- 2 workers). This function holds the walk as index probes with generic plans and JIT
-- off (each reason below). JIT is also why an earlier rewrite into the same probes was
-- reverted (docs/backlog.md): behind PgBouncer, where the connection's `-c jit=off` is
-- refused, the probes' inflated estimate was JIT-compiled at every call.

-- Every unsettled run a final settlement or a cancel of each of p_ids' lineages reaches:
-- from any round of the lineage, through attached edges, every round of each attached
-- child's own lineage, transitively, as (root, descendant) pairs; a root's own lineage
-- is not listed (its rounds are the caller's). The policy read is the one the edge's
-- child (the round its parent created) recorded. UNION deduplicates, so a diamond is
-- visited once and the walk ends on the finite edge set with no depth cap (cycles are
-- refused at insert). Usually empty: a run without children costs one probe of
-- run_parents by parent per round of its lineage.
--
-- Every lookup, in the seeds and in the recursive step alike, is a LATERAL subquery with
-- an ORDER BY (never flattened into a join), so each stays an index probe whatever the
-- statistics say: as plain joins the recursive step, planned from a run_parents never
-- analyzed, read every row of runs on every settlement (docs/producer.md, "The
-- settlement's descendant walk"). Generic plans: with the ids' values visible a custom
-- plan looked cheaper, so every settlement planned the walk again (~1 ms, ten times its
-- execution); here it is planned once per connection. JIT off: a recursive CTE's row
-- estimate multiplies at every level, so the walk's estimated cost passes
-- jit_above_cost although it reads a handful of rows, and a connection through PgBouncer
-- (which refuses the connection's own `-c jit=off`) compiled it at every call: 0.5-2 s a
-- settlement, a sixteen-process fleet test twice as slow. SECURITY INVOKER: the caller's
-- row security.
CREATE FUNCTION runfleet.attached_descendants(p_ids text[])
    RETURNS TABLE (root text, id text)
    LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE seeds AS (
        SELECT l.id AS root, l.lineage_id AS root_lineage
          FROM unnest(p_ids) AS s(id)
         CROSS JOIN LATERAL (SELECT r.id, r.lineage_id FROM runfleet.runs r
                              WHERE r.id = s.id ORDER BY r.id) l
    ), tree(root, root_lineage, id) AS (
        SELECT s.root, s.root_lineage, r.id FROM seeds s
         CROSS JOIN LATERAL (SELECT x.id FROM runfleet.runs x
                              WHERE x.lineage_id = s.root_lineage ORDER BY x.round_ordinal) r
        UNION
        SELECT t.root, t.root_lineage, m.id FROM tree t
         CROSS JOIN LATERAL (SELECT e.child_id FROM runfleet.run_parents e
                              WHERE e.parent_id = t.id ORDER BY e.seq) e
         CROSS JOIN LATERAL (SELECT c.lineage_id FROM runfleet.runs c
                              WHERE c.id = e.child_id
                                AND coalesce(c.state->>'on_parent_exit', 'cancel') = 'cancel'
                              ORDER BY c.id) c
         CROSS JOIN LATERAL (SELECT x.id FROM runfleet.runs x
                              WHERE x.lineage_id = c.lineage_id ORDER BY x.round_ordinal) m
    )
    SELECT DISTINCT tree.root, d.id FROM tree
     CROSS JOIN LATERAL (SELECT y.id FROM runfleet.runs y
                          WHERE y.id = tree.id
                            AND y.status NOT IN ('completed', 'failed', 'cancelled')
                            AND y.lineage_id <> tree.root_lineage ORDER BY y.id) d
     ORDER BY tree.root, d.id;
END
$$;
