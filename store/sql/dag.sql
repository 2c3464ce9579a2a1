-- The run DAG: durable parent edges, cycle-checked inside the inserting transaction.

-- name: lock_dag
-- Edge inserts serialize on one transaction-scoped lock, so two transactions
-- that jointly close a cycle cannot both pass their checks: the `dag` row of
-- runfleet.sweep_leases (migration 0031), which only the worker role and the owner may
-- lock (an advisory lock, which any login may take, let a tenant stall every child
-- admission of the fleet).
SELECT kind FROM runfleet.sweep_leases WHERE name = 'dag' FOR UPDATE;

-- name: insert_edge
INSERT INTO runfleet.run_parents (child_id, parent_id) VALUES (%(child)s, %(parent)s)
ON CONFLICT (child_id, parent_id) DO NOTHING
RETURNING child_id, parent_id, seq;

-- name: get_edge
SELECT child_id, parent_id, seq FROM runfleet.run_parents
 WHERE child_id = %(child)s AND parent_id = %(parent)s;

-- name: ancestor_path
-- Walks up from the new parent; a path that reaches the child closes a cycle.
WITH RECURSIVE up(id, path) AS (
    SELECT %(parent)s::text, ARRAY[%(child)s::text, %(parent)s::text]
    UNION ALL
    SELECT e.parent_id, up.path || e.parent_id FROM up
      JOIN runfleet.run_parents e ON e.child_id = up.id
     WHERE NOT e.parent_id = ANY(up.path[2:]) AND cardinality(up.path) < 256
)
SELECT path FROM up WHERE id = %(child)s LIMIT 1;

-- name: parents
SELECT child_id, parent_id, seq FROM runfleet.run_parents
 WHERE child_id = %(id)s ORDER BY seq;

-- name: children
SELECT child_id, parent_id, seq FROM runfleet.run_parents
 WHERE parent_id = %(id)s ORDER BY seq;

-- name: remove_edges
DELETE FROM runfleet.run_parents WHERE child_id = %(id)s OR parent_id = %(id)s;

-- name: lock_lineage
-- Every round of a child's lineage, locked against a settlement in flight: a parent
-- joining the child (a diamond) reads which rounds have settled only after their
-- settlements committed, and a settlement that starts later sees the joiner's edge.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.lineage_id = (SELECT l.lineage_id FROM runfleet.runs l WHERE l.id = %(id)s)
 ORDER BY r.round_ordinal
   FOR SHARE;
