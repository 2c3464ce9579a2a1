-- Fleet-wide counts for operators, the demo and benchmarks.

-- name: status_counts
SELECT status, count(*) AS n FROM runfleet.runs
 WHERE (%(flow)s::text IS NULL OR flow = %(flow)s)
 GROUP BY status;

-- name: settled_more_than_once
-- A run whose terminal decision was journaled twice: must never happen.
SELECT run_id, count(*) AS n FROM runfleet.journal
 WHERE (kind = 'transitioned' AND payload->>'to' IN ('completed', 'failed', 'cancelled'))
    OR (kind = 'interrupted' AND (payload->>'cancelled')::boolean)
 GROUP BY run_id HAVING count(*) > 1;

-- name: records_of_kind
SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
 WHERE kind = %(kind)s AND seq > %(after_seq)s ORDER BY seq LIMIT %(limit)s;

-- name: db_now
-- Database time, the one clock the fleet agrees on (also what schedules count from).
SELECT runfleet.now_ms() AS now_ms;

-- name: running_by_owner
-- How many running rows each owner holds: the database's view, not the liveness key's.
SELECT owner_host, owner_pid, owner_nonce, count(*) AS n FROM runfleet.runs
 WHERE status = 'running'
 GROUP BY owner_host, owner_pid, owner_nonce;

-- name: queue_overview
-- Per queue, what `runfleet info` shows (rq's `rq info`): open runs by what they wait
-- for, and the failed runs not yet requeued (rq's failed registry: no `requeued_as`, not
-- deleted). Scheduled = pending on its start time (enqueue_in/at); dead = parked `dead`.
SELECT queue,
       count(*) FILTER (WHERE status = 'pending' AND NOT (waiting_reason IS NOT DISTINCT FROM
                        'timer' AND waiting_wake_at_ms > runfleet.now_ms())) AS pending,
       count(*) FILTER (WHERE status = 'pending' AND waiting_reason = 'timer'
                        AND waiting_wake_at_ms > runfleet.now_ms()) AS scheduled,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'suspended'
                        AND waiting_reason IS DISTINCT FROM 'dead') AS waiting,
       count(*) FILTER (WHERE status = 'suspended' AND waiting_reason = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'failed' AND NOT (state ? 'requeued_as')
                        AND NOT (state ? 'deleted')) AS failed
  FROM runfleet.runs
 WHERE status IN ('pending', 'running', 'suspended', 'failed')
 GROUP BY queue
 ORDER BY queue;
