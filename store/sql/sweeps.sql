-- Reads the sweeps drive. Each is an index scan bounded by its batch: its WHERE is the
-- predicate of a partial index whose columns are the keyset, and it reads strictly after
-- a cursor (kept in runfleet.sweep_cursors) so rows the fleet cannot take (a retired flow,
-- a queue nobody reads, an owner the probe vouches for) never hide the rows behind them.
-- The minimum bigint is the "start" of every keyset. The database time is read once per
-- statement as an InitPlan, (SELECT runfleet.now_ms()): the function is volatile, so
-- compared directly it would be a filter evaluated per row instead of an index bound.

-- name: stale_running
-- Running rows whose lease is older than `stale_after_ms` by database time, stalest first
-- (runs_stale_running_idx): the stale sweep's batch and `runfleet fleet stuck`'s list.
-- Whole rows plus database time, so a caller judges lease age on the one clock.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.status = 'running'
   AND r.heartbeat_at_ms < (SELECT runfleet.now_ms()) - %(stale_after_ms)s
   AND (r.heartbeat_at_ms, r.id) > (%(after_ms)s, %(after_id)s)
 ORDER BY r.heartbeat_at_ms, r.id LIMIT %(limit)s;

-- name: parked_released
-- Runs a shutdown or a lapse handed back (runs_released_idx).
SELECT id, updated_at_ms FROM runfleet.runs
 WHERE status = 'suspended' AND waiting_reason = 'released'
   AND (updated_at_ms, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY updated_at_ms, id LIMIT %(limit)s;

-- name: due_waits
-- Timed waits whose time has come (runs_due_wait_idx); quarantine never wakes on a timer.
SELECT id, waiting_wake_at_ms FROM runfleet.runs
 WHERE waiting_wake_at_ms IS NOT NULL AND waiting_reason IS NOT NULL
   AND waiting_reason <> 'quarantine' AND status IN ('pending', 'suspended')
   AND waiting_wake_at_ms <= (SELECT runfleet.now_ms())
   AND (waiting_wake_at_ms, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY waiting_wake_at_ms, id LIMIT %(limit)s;

-- name: due_clocks
SELECT run_id, name, deferred_name, due_at_ms, completed_at_ms FROM runfleet.clocks
 WHERE completed_at_ms IS NULL AND due_at_ms <= (SELECT runfleet.now_ms())
   AND (due_at_ms, run_id, name) > (%(after_ms)s, %(after_id)s, %(after_name)s)
 ORDER BY due_at_ms, run_id, name LIMIT %(limit)s;

-- name: deadline_passed
-- Unsettled runs past their deadline with no cancel request yet (runs_deadline_due_idx).
SELECT id, (state->>'deadline_ms')::bigint AS deadline_ms FROM runfleet.runs
 WHERE status IN ('pending', 'running', 'suspended') AND cancel_requested_at_ms IS NULL
   AND state ? 'deadline_ms' AND state->>'deadline_ms' IS NOT NULL
   AND (state->>'deadline_ms')::bigint <= (SELECT runfleet.now_ms())
   AND ((state->>'deadline_ms')::bigint, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY (state->>'deadline_ms')::bigint, id LIMIT %(limit)s;

-- name: pending_runs
-- Runnable pending admissions (runs_runnable_pending_idx), bounded above by the tail read
-- when a scan cycle started (the maximum bigint when unbounded), so the cycle is finite
-- under new admissions.
SELECT id, created_at_ms FROM runfleet.runs
 WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL
   AND (%(flow)s::text IS NULL OR flow = %(flow)s)
   AND created_at_ms < (SELECT runfleet.now_ms()) - %(older_than_ms)s
   AND (created_at_ms, id) > (%(after_ms)s, %(after_id)s)
   -- Implied by the row comparison; stated so that a plan through the (status, created)
   -- index also starts at the cursor instead of reading and filtering everything before it.
   AND created_at_ms >= %(after_ms)s
   AND (created_at_ms, id) <= (%(through_ms)s, %(through_id)s)
 ORDER BY created_at_ms, id LIMIT %(limit)s;

-- name: pending_tail
SELECT id, created_at_ms FROM runfleet.runs
 WHERE status = 'pending' AND waiting_reason IS NULL AND claim_host IS NULL
   AND (%(flow)s::text IS NULL OR flow = %(flow)s)
   AND created_at_ms < (SELECT runfleet.now_ms()) - %(older_than_ms)s
 ORDER BY created_at_ms DESC, id DESC LIMIT 1;

-- name: pending_cancellations
-- Pending and parked runs a cancel reached (parked-cancelled is the suspended half).
SELECT id, created_at_ms FROM runfleet.runs
 WHERE cancel_requested_at_ms IS NOT NULL AND status IN ('pending', 'suspended')
   AND (created_at_ms, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY created_at_ms, id LIMIT %(limit)s;

-- name: stranded_claims
SELECT id, claim_host, claim_pid, claim_nonce, claimed_at_ms FROM runfleet.runs
 WHERE claim_host IS NOT NULL AND claimed_at_ms < (SELECT runfleet.now_ms()) - %(stale_after_ms)s
 ORDER BY claimed_at_ms, id LIMIT %(limit)s;

-- name: try_sweep_lock
-- The kind's lease for this tick: its row of runfleet.sweep_leases, locked FOR UPDATE SKIP
-- LOCKED (migration 0028). Locking it needs UPDATE on that table, which only the worker
-- role has: a producer's or an operator's login cannot take it, so none can stop a sweep
-- (an advisory lock, which any login may take, decided this before). Two bounds on the
-- rest of the transaction, local to it (``set_config(..., true)``), so a pooled
-- connection keeps its own settings after it: how long it may sit idle
-- (``Settings.sweep_lock_idle_ms``: a worker cut off from Postgres mid-tick loses its
-- session, and the lease with it, after that long instead of holding the kind for the
-- whole fleet until idle_in_transaction_session_timeout), and how long any of its
-- statements may wait on a row lock (``Settings.worker_lock_wait_ms``: a row a producer
-- holds locked fails that row's write alone, in its savepoint, and the sweep goes on).
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true) AS idle_ms,
       set_config('lock_timeout', %(lock_ms)s::text, true) AS lock_ms,
       EXISTS (SELECT FROM runfleet.sweep_leases l WHERE l.kind = %(kind)s::int
                  FOR UPDATE SKIP LOCKED) AS locked;

-- name: runnable_suspended
-- Suspended rows whose wait was cleared but that nobody resumed (the wake message
-- after a completion was lost): as stranded as a pending run with a lost wake.
SELECT id, updated_at_ms FROM runfleet.runs
 WHERE status = 'suspended' AND waiting_reason IS NULL AND claim_host IS NULL
   AND updated_at_ms < (SELECT runfleet.now_ms()) - %(older_than_ms)s
   AND (updated_at_ms, id) > (%(after_ms)s, %(after_id)s)
 ORDER BY updated_at_ms, id LIMIT %(limit)s;

-- name: cursor_get
-- One row whatever happens: the cursor's columns are NULL when the kind has none yet.
SELECT c.after_ms, c.after_id, c.after_name, c.through_ms, c.through_id,
       c.cycle_started_ms, runfleet.now_ms() AS now_ms
  FROM (SELECT 1) AS one
  LEFT JOIN runfleet.sweep_cursors c ON c.kind = %(kind)s;

-- name: cursor_put
INSERT INTO runfleet.sweep_cursors
    (kind, after_ms, after_id, after_name, through_ms, through_id, cycle_started_ms, updated_at_ms)
VALUES (%(kind)s, %(after_ms)s, %(after_id)s, %(after_name)s, %(through_ms)s, %(through_id)s,
        %(cycle_started_ms)s, runfleet.now_ms())
ON CONFLICT (kind) DO UPDATE SET
    after_ms = EXCLUDED.after_ms, after_id = EXCLUDED.after_id,
    after_name = EXCLUDED.after_name, through_ms = EXCLUDED.through_ms,
    through_id = EXCLUDED.through_id, cycle_started_ms = EXCLUDED.cycle_started_ms,
    updated_at_ms = EXCLUDED.updated_at_ms;

-- name: lost_pending
-- Never-started pending runs whose wake no reader will still deliver (docs/backlog.md):
-- admitted (and last written) before their queue's wake mark (the Postgres time before
-- which every admission's message has been delivered or destroyed, runfleet.wake_marks),
-- or before `fallback_before_ms` (an age bound, used only while this worker cannot reach
-- Redis; the minimum bigint otherwise). A queue without a mark (nobody serving it samples
-- its stream) has only the fallback. The index range ends at `before_ms`, the largest mark
-- or fallback (a value, not a subquery, so the planner sizes the range from statistics and
-- walks it in index order under the LIMIT): a deep healthy backlog, admitted after every
-- mark, costs the scan nothing. The per-queue mark is a subplan per row of that range.
SELECT r.id, r.created_at_ms FROM runfleet.runs r
 WHERE r.status = 'pending' AND r.waiting_reason IS NULL AND r.claim_host IS NULL
   AND r.created_at_ms < %(before_ms)s
   AND r.created_at_ms >= %(after_ms)s
   AND (r.created_at_ms, r.id) > (%(after_ms)s, %(after_id)s)
   AND (r.created_at_ms, r.id) <= (%(through_ms)s, %(through_id)s)
   -- The row's last write (a requeue, a released claim) published its own wake after it.
   AND GREATEST(r.created_at_ms, r.updated_at_ms) < GREATEST(
       (SELECT m.delivered_through_ms FROM runfleet.wake_marks m WHERE m.queue = r.queue),
       %(fallback_before_ms)s)
 ORDER BY r.created_at_ms, r.id LIMIT %(limit)s;

-- name: lost_pending_tail
-- The newest run `lost_pending` would answer now: bounds one finite cycle.
SELECT r.id, r.created_at_ms FROM runfleet.runs r
 WHERE r.status = 'pending' AND r.waiting_reason IS NULL AND r.claim_host IS NULL
   AND r.created_at_ms < %(before_ms)s
   AND GREATEST(r.created_at_ms, r.updated_at_ms) < GREATEST(
       (SELECT m.delivered_through_ms FROM runfleet.wake_marks m WHERE m.queue = r.queue),
       %(fallback_before_ms)s)
 ORDER BY r.created_at_ms DESC, r.id DESC LIMIT 1;

-- name: wake_mark_advance
-- A queue's mark only moves forward (two workers sampling the same stream may disagree
-- about how far; each is sound, so the larger is).
INSERT INTO runfleet.wake_marks (queue, delivered_through_ms, updated_at_ms)
VALUES (%(queue)s, %(through_ms)s, runfleet.now_ms())
ON CONFLICT (queue) DO UPDATE SET
    delivered_through_ms = EXCLUDED.delivered_through_ms, updated_at_ms = EXCLUDED.updated_at_ms
 WHERE runfleet.wake_marks.delivered_through_ms < EXCLUDED.delivered_through_ms;

-- name: wake_marks
SELECT queue, delivered_through_ms, updated_at_ms FROM runfleet.wake_marks ORDER BY queue;

-- name: lost_pending_redispatched
-- The lost-pending sweep's dispatch is the row's latest wake: a later cycle counts the run
-- lost again only once the queue's mark passes this write (its new message is delivered or
-- destroyed too), not while that message still waits in a deep stream. Only rows still
-- never started: a reader that already claimed one has written it itself. A row locked
-- elsewhere (a claim in flight, or its producer's `FOR UPDATE`) is skipped, not waited
-- on: it stays counted as lost, and the next cycle wakes it again.
UPDATE runfleet.runs SET updated_at_ms = runfleet.now_ms()
 WHERE id IN (SELECT l.id FROM runfleet.runs l WHERE l.id = ANY(%(ids)s::text[])
               ORDER BY l.id FOR UPDATE SKIP LOCKED)
   AND status = 'pending' AND claim_host IS NULL AND owner_host IS NULL
   AND waiting_reason IS NULL;

-- name: analyze_grown
-- The table whose statistics runfleet.analyze_grown (migration 0025) refreshed, if any:
-- the one whose committed rows grew most, at least doubling since Postgres last counted
-- them, so that no plan cached while it was young outlives its growth. Nothing while
-- another caller is at it.
SELECT table_name, rows_counted, rows_now FROM runfleet.analyze_grown();
