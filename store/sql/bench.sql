-- The yardstick benchmarks measure runfleet against: a pgbench-style one-row commit.
-- It describes no runfleet behaviour; it lives here because all SQL lives in store/.

-- name: baseline_table
CREATE TABLE bench_commits (
    id bigserial PRIMARY KEY, payload jsonb NOT NULL, at_ms bigint NOT NULL);

-- name: baseline_insert
INSERT INTO bench_commits (payload, at_ms)
VALUES (%s, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);

-- name: capacity_counters
-- What `runfleet bench capacity` subtracts before/after a batch: statements in this
-- database, commits, transaction ids handed out (write transactions) and WAL bytes.
SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s
          JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database()),
       (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query = 'COMMIT'),
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       pg_current_wal_lsn() - '0/0'::pg_lsn;

-- name: capacity_backends
-- Client backends of this database other than the benchmark's own connection.
SELECT count(*) FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND datname = current_database()
   AND pid <> pg_backend_pid();

-- name: capacity_extension
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
