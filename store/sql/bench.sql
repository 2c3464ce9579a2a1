-- The yardstick benchmarks measure runfleet against: a pgbench-style one-row commit.
-- It describes no runfleet behaviour; it lives here because all SQL lives in store/.

-- name: baseline_table
CREATE TABLE bench_commits (
    id bigserial PRIMARY KEY, payload jsonb NOT NULL, at_ms bigint NOT NULL);

-- name: baseline_insert
INSERT INTO bench_commits (payload, at_ms)
VALUES (%s, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);

-- name: hops_table
-- `bench producer`'s hop: the cost of a one-row insert and its commit alone. A logged
-- table: a temporary one writes no WAL, so its commit would flush nothing.
CREATE TABLE IF NOT EXISTS runfleet_bench_hops (x int);

-- name: hops_insert
INSERT INTO runfleet_bench_hops VALUES (1);

-- name: hops_drop
DROP TABLE runfleet_bench_hops;

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

-- name: durability_settings
-- What a drain's commits cost the server's disk: reported beside every fsync row.
SELECT current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes;

-- name: journal_tail
-- The last journal seq: a drain's records are the ones after it.
SELECT coalesce(max(seq), 0) AS seq FROM runfleet.journal;

-- name: drain_progress
-- Runs settled since %(after_seq)s, read from the journal's primary key: a count over
-- runfleet.runs would read the whole history the 1,000,000-row case put there, every poll.
SELECT count(*) FILTER (WHERE payload->>'to' = 'completed') AS completed,
       count(*) FILTER (WHERE payload->>'to' IN ('failed', 'cancelled')) AS bad
  FROM runfleet.journal
 WHERE seq > %(after_seq)s AND kind = 'transitioned';

-- name: drain_window
-- A drain's processing window in database time: first activation to last settlement.
SELECT min(at_ms) FILTER (WHERE kind IN ('claimed-and-activated', 'stolen-and-activated',
                                         'activated', 'resumed')) AS first_ms,
       max(at_ms) FILTER (WHERE kind = 'transitioned') AS last_ms
  FROM runfleet.journal
 WHERE seq > %(after_seq)s;

-- name: history_runs
-- %(rows)s runs of %(flow)s on %(queue)s that settled over the past day, as a long-lived
-- fleet leaves them (completed, their owner cleared): the history the sweeps must not read.
INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, epoch,
                           created_at_ms, updated_at_ms, result)
SELECT 'hist-' || lpad(g::text, 8, '0'), %(flow)s, %(queue)s, 'completed', '{}'::jsonb,
       'hist-' || lpad(g::text, 8, '0'), 1,
       t - 86400000 + g * 80, t - 86400000 + g * 80 + 5, 'null'::json
  FROM generate_series(1, %(rows)s) g, (SELECT runfleet.now_ms() AS t) now;

-- name: history_journal
-- Their journal: created, claimed-and-activated and transitioned for each, in run order
-- (what an admission and a no-op's lifecycle write).
INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
SELECT 'hist-' || lpad(g::text, 8, '0'), k.kind, 'bench-history', 3 * g + k.n, k.payload,
       md5(g::text || k.kind), t - 86400000 + g * 80 + k.n
  FROM generate_series(1, %(rows)s) g,
       (VALUES (0, 'created', '{}'::jsonb),
               (1, 'claimed-and-activated', '{"epoch": 1, "from": "pending"}'::jsonb),
               (2, 'transitioned', '{"from": "running", "to": "completed"}'::jsonb))
           AS k(n, kind, payload),
       (SELECT runfleet.now_ms() AS t) now
 ORDER BY g, k.n;

-- name: history_analyze
-- Statistics as autovacuum would leave them after such a fill.
ANALYZE runfleet.runs, runfleet.journal;

-- name: backlog_unsettled
-- Whether a backlog drain still waits for a run (pending or running), by the (status,
-- created) index: the first entry answers. A count read every entry, twice a second:
-- 33 ms a poll and ~0.18 ms of the server's time per run drained at a 100,000-run
-- backlog, as much as the batch claim itself (bench --profile, docs/backlog.md).
SELECT EXISTS (SELECT FROM runfleet.runs WHERE status IN ('pending', 'running'))
    AS unsettled;

-- name: backlog_rate
-- How many of a backlog drain's claims after %(after_seq)s lost their race (two readers
-- handed the same run), and how many runs it settled.
SELECT count(*) FILTER (WHERE kind = 'transitioned') AS settled,
       count(*) FILTER (WHERE kind = 'claim-lost') AS claim_lost
  FROM runfleet.journal
 WHERE seq > %(after_seq)s;

-- name: backlog_settlements
-- Every settlement of a backlog drain after %(after_seq)s: which worker process wrote it
-- (its source, the owner key) and when (database time). The steady window starts once
-- 10 %% are done and every process has settled a run (ops/bench/backlog.py).
SELECT source_id, at_ms FROM runfleet.journal
 WHERE seq > %(after_seq)s AND kind = 'transitioned';

-- name: other_backends
-- Other sessions on this database: a backend reports its statistics when it exits (or at
-- most once a second while busy), so the counters below are complete only once the
-- drain's sessions are gone.
SELECT count(*) AS n FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid();

-- name: server_counters
-- The server's WAL and this database's commits so far (cumulative, PostgreSQL >= 14):
-- a drain's cost per run is the difference across it. pg_stat_wal counts the whole
-- server: exact on the bench's own throwaway, approximate on a shared one.
SELECT w.wal_records, w.wal_bytes, w.wal_sync, d.xact_commit
  FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database();

-- name: runs_churn
-- Row churn on runfleet.runs (cumulative): updates, how many were HOT, dead tuples now,
-- and autovacuum runs so far. A backlog drain's cost is the difference across it.
SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count
  FROM pg_stat_user_tables WHERE schemaname = 'runfleet' AND relname = 'runs';

-- name: limits_counters
-- What `runfleet bench limits` counts (pg_stat_statements, this database): the claim
-- statements (every one decides a queue's limits: queue_free_slots or start_grant) and
-- the reads the limits add beside them (a refused claim's wait, the token pump's bucket,
-- a key's state), told apart by the doc comments their text starts with.
SELECT coalesce(sum(s.calls) FILTER (WHERE s.query ~ 'queue_free_slots|start_grant'), 0)
           AS claims,
       coalesce(sum(s.calls) FILTER (
           WHERE s.query ~ '^-- (How long until the queue|How many whole tokens|The keys of a queue)'),
           0) AS limit_reads,
       coalesce(sum(s.calls), 0) AS statements
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = current_database();

-- name: statements_reset
-- `python -m bench backlog --profile`: forget this database's statement counters
-- (pg_stat_statements) before a drain, so the profile counts that drain alone.
SELECT pg_stat_statements_reset(0, d.oid, 0) FROM pg_database d WHERE d.datname = current_database();

-- name: statements_profile
-- The statements a drain ran on this database (pg_stat_statements, track = top), the
-- costliest first: calls, time and shared buffers per call, rows per call.
SELECT s.query, s.calls, s.total_exec_time, s.mean_exec_time,
       (s.shared_blks_hit + s.shared_blks_read + s.shared_blks_dirtied)::float8 / s.calls
           AS buffers_per_call,
       s.shared_blks_read::float8 / s.calls AS reads_per_call,
       s.rows::float8 / s.calls AS rows_per_call
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = current_database() AND s.calls > 0
 ORDER BY s.total_exec_time DESC
 LIMIT %(top)s;

-- name: runs_index_sizes
-- Every index on runfleet.runs and its size in pages now (bloat: compare across a drain).
SELECT c.relname AS index, pg_relation_size(c.oid) / current_setting('block_size')::int AS pages
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'runfleet.runs'::regclass ORDER BY c.relname;
