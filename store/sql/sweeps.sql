-- Reads the sweeps drive. Each is bounded, oldest first, and cursor-based so a
-- stuck prefix cannot starve the rows behind it.

-- name: stale_running
SELECT id, owner_host, owner_pid, owner_nonce, heartbeat_at_ms FROM runfleet.runs
 WHERE status = 'running' AND heartbeat_at_ms < runfleet.now_ms() - %(stale_after_ms)s
 ORDER BY heartbeat_at_ms, id LIMIT %(limit)s;

-- name: pending_runs
SELECT id, created_at_ms FROM runfleet.runs
 WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL
   AND (%(flow)s::text IS NULL OR flow = %(flow)s)
   AND created_at_ms < runfleet.now_ms() - %(older_than_ms)s
   AND (created_at_ms, id) > (%(after_ms)s, %(after_id)s)
   AND (%(through_ms)s::bigint IS NULL OR (created_at_ms, id) <= (%(through_ms)s, %(through_id)s))
 ORDER BY created_at_ms, id LIMIT %(limit)s;

-- name: pending_tail
SELECT id, created_at_ms FROM runfleet.runs
 WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL
   AND (%(flow)s::text IS NULL OR flow = %(flow)s)
   AND created_at_ms < runfleet.now_ms() - %(older_than_ms)s
 ORDER BY created_at_ms DESC, id DESC LIMIT 1;

-- name: pending_cancellations
SELECT id, created_at_ms FROM runfleet.runs
 WHERE cancel_requested_at_ms IS NOT NULL AND status IN ('pending', 'suspended')
   AND (created_at_ms, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY created_at_ms, id LIMIT %(limit)s;

-- name: stranded_claims
SELECT id, claim_host, claim_pid, claim_nonce, claimed_at_ms FROM runfleet.runs
 WHERE claim_host IS NOT NULL AND claimed_at_ms < runfleet.now_ms() - %(stale_after_ms)s
 ORDER BY claimed_at_ms, id LIMIT %(limit)s;

-- name: try_sweep_lock
SELECT pg_try_advisory_xact_lock(732011, %(kind)s::int) AS locked;

-- name: runnable_suspended
-- Suspended rows whose wait was cleared but that nobody resumed (the wake message
-- after a completion was lost): as stranded as a pending run with a lost wake.
SELECT id FROM runfleet.runs
 WHERE status = 'suspended' AND waiting_reason IS NULL AND claim_host IS NULL
   AND updated_at_ms < runfleet.now_ms() - %(older_than_ms)s
 ORDER BY updated_at_ms, id LIMIT %(limit)s;
