-- runfleet schema v24: a settlement's walk of attached descendants costs its probes, not
-- a scan of every run nor a plan per call (docs/producer.md, "The settlement's
-- descendant walk").
--
-- Every terminal settlement batch (settle_many) and every cancel asks which unsettled
-- runs its lineage reaches through attached edges. As a statement (store/sql/runs.sql,
-- attached_descendants_many), its recursive step joined run_parents and runs as plain
-- joins, which the planner, seeing an empty run_parents, drove from a sequential scan
-- of every row of runfleet.runs: 3 ms a settlement beside 1,500 settled runs, growing
-- with the table (pg_stat_statements, the user's loop of single enqueues, 2 workers).
-- With the joins as LATERAL probes the walk executed in ~0.05 ms but was planned again
-- at every settlement (~0.9 ms; the ids' values made a custom plan look cheaper). This
-- function holds the walk with generic plans, planned once per connection.
-- Every unsettled run a final settlement or a cancel of each of p_ids' lineages reaches:
-- from any round of the lineage, through attached edges, every round of each attached
-- child's own lineage, transitively, as (root, descendant) pairs; a root's own lineage
-- is not listed (its rounds are the caller's). The policy read is the one the edge's
-- child (the round its parent created) recorded. UNION deduplicates, so a diamond is
-- visited once and the walk ends on the finite edge set with no depth cap (cycles are
-- refused at insert). Usually empty: a run without children costs one probe of
-- run_parents by parent per round of its lineage.
--
-- Every lookup is a LATERAL subquery with an ORDER BY (never flattened into a join), so
-- each stays an index probe whatever the statistics say. A function with generic plans
-- (docs/producer.md, "The settlement's descendant walk"): as a statement with the ids'
-- values visible, every settlement planned it again (~1 ms, ten times its execution);
-- here it is planned once per connection. SECURITY INVOKER: the caller's row security.
CREATE FUNCTION runfleet.attached_descendants(p_ids text[])
    RETURNS TABLE (root text, id text)
    LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS
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
