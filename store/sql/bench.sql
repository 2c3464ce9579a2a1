-- The yardstick benchmarks measure runfleet against: a pgbench-style one-row commit.
-- It describes no runfleet behaviour; it lives here because all SQL lives in store/.

-- name: baseline_table
CREATE TABLE bench_commits (
    id bigserial PRIMARY KEY, payload jsonb NOT NULL, at_ms bigint NOT NULL);

-- name: baseline_insert
INSERT INTO bench_commits (payload, at_ms)
VALUES (%s, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
