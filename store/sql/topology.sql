-- Replication topology as the connected server sees it (`runfleet doctor`, read replicas).
-- Only catalog views and settings: nothing here reads or writes runfleet's tables except
-- `present_runs`. A role without pg_monitor sees NULL for another session's replication
-- columns; callers show what they get.

-- name: server
-- This server's role and the settings that decide whether a commit waits for a standby.
-- `replay_lag_s`: on a standby, the age of the last transaction it replayed (it grows
-- while the primary is idle too: read it with `receive_behind_bytes`).
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
       END AS replay_lag_s,
       CASE WHEN pg_is_in_recovery()
            THEN pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::bigint
       END AS receive_behind_bytes,
       (SELECT sender_host || ':' || sender_port FROM pg_stat_wal_receiver LIMIT 1)
           AS upstream;

-- name: timeline
-- The WAL timeline: 1 on a cluster never promoted; each promotion adds one. Needs
-- superuser or pg_monitor-like rights on some installs (callers tolerate a refusal).
SELECT timeline_id AS timeline FROM pg_control_checkpoint();

-- name: standbys
-- The standbys streaming from this primary, with how far behind each one replays.
-- `state` and `sync_state` stay NULL where the role may not read them (no pg_monitor):
-- unknown, which is not the same as `async`.
SELECT coalesce(application_name, '') AS name,
       coalesce(client_addr::text, 'local') AS client,
       state,
       sync_state,
       extract(epoch FROM replay_lag)::float8 AS replay_lag_s,
       CASE WHEN replay_lsn IS NOT NULL
            THEN pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint
       END AS replay_behind_bytes
  FROM pg_stat_replication
 ORDER BY application_name;

-- name: walsender_pids
-- The processes streaming WAL from this primary (the failover suite pauses them to hold
-- a standby behind: tests/servers/patroni.py).
SELECT pid FROM pg_stat_replication;

-- name: present_runs
-- Which of these run ids this database has (a wake in Redis names a run it should).
SELECT id FROM runfleet.runs WHERE id = ANY(%(ids)s::text[]);
