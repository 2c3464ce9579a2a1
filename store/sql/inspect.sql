-- Read-only queries for operators (the `runfleet` CLI: runs, tree, fleet, stuck, doctor).
-- Every row query returns whole run rows plus database time, so callers do lease and
-- due-time arithmetic on one clock (Postgres's), never the operator's laptop.

-- name: list_runs
-- Newest first; every filter optional. `since_ms` bounds admission time.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE (%(status)s::text IS NULL OR r.status = %(status)s)
   AND (%(flow)s::text IS NULL OR r.flow = %(flow)s)
   AND (%(queue)s::text IS NULL OR r.queue = %(queue)s)
   AND (%(since_ms)s::bigint IS NULL OR r.created_at_ms >= %(since_ms)s)
 ORDER BY r.created_at_ms DESC, r.id DESC
 LIMIT %(limit)s;

-- name: lineage
-- Every round of a handoff chain, first round first.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.lineage_id = %(lineage_id)s
 ORDER BY r.round_ordinal;

-- name: pending_older
-- Pending rows not started `older_than_ms` after they became startable: admission time,
-- or the due time of a delayed admission (a run enqueued for later is not late before it).
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.status = 'pending'
   AND greatest(r.created_at_ms, coalesce(r.waiting_wake_at_ms, 0))
       < runfleet.now_ms() - %(older_than_ms)s
 ORDER BY r.created_at_ms, r.id LIMIT %(limit)s;

-- name: overdue_waits
-- Timed waits (timer, quota) whose wake time passed more than `grace_ms` ago: the due
-- sweep should have woken them within a tick or two.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.waiting_reason IN ('timer', 'quota')
   AND r.status NOT IN ('completed', 'failed', 'cancelled')
   AND r.waiting_wake_at_ms < runfleet.now_ms() - %(grace_ms)s
 ORDER BY r.waiting_wake_at_ms, r.id LIMIT %(limit)s;

-- name: waiting_for
-- Unsettled runs parked for one reason (e.g. 'quarantine'), oldest park first.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.waiting_reason = %(reason)s
   AND r.status NOT IN ('completed', 'failed', 'cancelled')
 ORDER BY r.updated_at_ms, r.id LIMIT %(limit)s;

-- name: active_queues
-- Queues that unsettled runs sit on: the streams whose lag is worth measuring.
SELECT DISTINCT queue FROM runfleet.runs
 WHERE status IN ('pending', 'running', 'suspended')
 ORDER BY queue LIMIT %(limit)s;

-- name: waiting_deferred
-- The completion a parked run waits for (an event's name), which the run row keeps
-- but the typed RunRow does not carry.
SELECT waiting_deferred FROM runfleet.runs WHERE id = %(id)s;

-- name: server_info
-- The same expression as runfleet.now_ms(), spelled out so it answers before migrations.
SELECT current_setting('server_version') AS version,
       (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms;

-- name: reactivated_over
-- Unsettled runs whose body was started again more than `over` times from an
-- interruption: each takeover (stolen-and-activated) and each release
-- (interrupt-released) re-runs the body from its last recorded call. A run caught in
-- such a loop (a drive failing every time, a lease lapsing every time) never settles
-- and no sweep will notice. The epoch counts every activation, so it bounds the count:
-- only runs with epoch > over + 1 need their journal counted.
SELECT r.*, runfleet.now_ms() AS now_ms, x.restarts, x.takeovers, x.last_at_ms
  FROM runfleet.runs r
 CROSS JOIN LATERAL (
       SELECT count(*) AS restarts,
              count(*) FILTER (WHERE j.kind = 'stolen-and-activated') AS takeovers,
              max(j.at_ms) AS last_at_ms
         FROM runfleet.journal j
        WHERE j.run_id = r.id AND j.kind IN ('stolen-and-activated', 'interrupt-released')
       ) AS x
 WHERE r.status IN ('pending', 'running', 'suspended') AND r.epoch > %(over)s + 1
   AND x.restarts > %(over)s
 ORDER BY x.restarts DESC, r.id LIMIT %(limit)s;
