-- runfleet schema v31: retention, the statistics refresh and the run DAG's edge inserts
-- are serialized by rows only workers can lock, as the sweeps are (0028).
--
-- Retention's pass took pg_try_advisory_lock(732012, 1), runfleet.analyze_grown (0025)
-- pg_try_advisory_xact_lock(732013, 1) and every parent edge a child's admission records
-- pg_advisory_xact_lock(7320112026): any login of the database may take any advisory
-- lock, so a producer's or the read-only operator's session that held one stopped every
-- retention pass, every statistics refresh or every child admission of the fleet for as
-- long as it liked. All three now use a row of runfleet.sweep_leases, which only
-- runfleet_worker and the owner may lock or write (store/sql/roles.sql grants producers
-- and operators nothing on it):
-- - an edge insert locks the `dag` row FOR UPDATE for its transaction (it waits: two
--   inserts that jointly close a cycle must not both pass their checks; a worker's wait
--   is bounded by its lock_timeout, store/config.py worker_lock_wait_ms);
-- - the statistics refresh locks its row FOR UPDATE SKIP LOCKED for its call (the
--   function runs as the owner), as a sweep tick does;
-- - a retention pass commits batch by batch, so no transaction spans it: it holds its
--   row as a timed lease instead (`holder`, `held_until_ms`, database time), taken when
--   free or expired, renewed after every batch and given back at the end; a process that
--   dies mid-pass holds retention off until its lease expires (store/retention.py).
ALTER TABLE runfleet.sweep_leases ADD COLUMN holder text, ADD COLUMN held_until_ms bigint;
INSERT INTO runfleet.sweep_leases (kind, name) VALUES
    (9, 'retention'), (10, 'statistics'), (11, 'dag');

-- runfleet.analyze_grown as in 0025, but for its lease: calls do not overlap (the
-- statistics row, SKIP LOCKED: the loser skips).
CREATE OR REPLACE FUNCTION runfleet.analyze_grown()
    RETURNS TABLE (table_name text, rows_counted bigint, rows_now bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms' AS
$$
DECLARE
    v record;
BEGIN
    IF NOT EXISTS (SELECT FROM runfleet.sweep_leases l WHERE l.name = 'statistics'
                      FOR UPDATE SKIP LOCKED) THEN
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
