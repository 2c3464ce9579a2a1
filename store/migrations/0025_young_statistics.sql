-- runfleet schema v25: plans made on a young table do not outlive its growth.
--
-- Plans made on a young table do not outlive its growth (0025): runfleet.analyze_grown
-- analyzes every runfleet table that has at least doubled (plus 16 pages) since
-- Postgres last counted its pages, which invalidates every plan cached on it. A worker's
-- connections prepare their statements in the fleet's first seconds, when runs and the
-- journal hold a handful of rows; a plan made then reads a one-page table by a
-- sequential scan, and Postgres keeps it until the table's statistics change, which
-- autovacuum does only once a minute at best: a settlement beside 8,000 runs read them
-- all twice (1.5-2 ms a statement, growing with the table; docs/producer.md, "Plans
-- made on a young table"). The sweeper calls this every tick (Settings.
-- refresh_statistics); a doubling rule costs one ANALYZE per table per doubling, so it
-- matters while a table is young and is nearly free once it is large, where
-- autovacuum's own rule (10 % changed) is the finer one. One caller at a time, fleet-wide
-- (the others skip, not wait). SECURITY DEFINER: ANALYZE needs the tables' owner; it
-- takes no input, and only the worker role may call it. Answers what it analyzed.
CREATE FUNCTION runfleet.analyze_grown()
    RETURNS TABLE (table_name text, pages_counted integer, pages_now bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(732013, 1) THEN
        RETURN;
    END IF;
    FOR v IN
        SELECT c.oid::regclass AS rel, c.relname::text AS relname, c.relpages,
               pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages
          FROM pg_class c
         WHERE c.relnamespace = 'runfleet'::regnamespace AND c.relkind = 'r'
         ORDER BY c.relname
    LOOP
        IF v.pages >= 2 * greatest(v.relpages, 0) + 16 THEN
            EXECUTE format('ANALYZE %s', v.rel);
            table_name := v.relname;
            pages_counted := v.relpages;
            pages_now := v.pages;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION runfleet.analyze_grown() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runfleet.analyze_grown() TO runfleet_worker;
