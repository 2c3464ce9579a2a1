-- Parks and wakes, deferred completions (first writer wins) and durable clocks.

-- name: park
-- Owner-fenced; the caller holds the row lock (get_for_update) so a deferred
-- completion cannot slip between its "already satisfied?" check and this write.
-- An execution that parks ended cleanly, so its run's recoveries in a row start again.
UPDATE runfleet.runs AS r SET
    status = 'suspended', owner_host = NULL, owner_pid = NULL, owner_nonce = NULL,
    heartbeat_at_ms = NULL, recoveries = 0,
    waiting_reason = %(reason)s, waiting_wake_at_ms = %(wake_at_ms)s,
    waiting_token = %(token)s, waiting_request = %(request)s,
    waiting_deferred = %(deferred)s, updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status = 'running'
   AND r.owner_host = %(host)s AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s
   AND r.epoch = %(epoch)s
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: wake
WITH before AS (
    SELECT id, waiting_reason, waiting_wake_at_ms, waiting_token, waiting_request
      FROM runfleet.runs WHERE id = %(id)s AND waiting_reason IS NOT NULL FOR UPDATE
)
UPDATE runfleet.runs AS r SET
    waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
    waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
  FROM before WHERE r.id = before.id
RETURNING before.id AS run_id, before.waiting_reason AS reason,
          before.waiting_wake_at_ms AS wake_at_ms, before.waiting_token AS token,
          before.waiting_request AS request;

-- name: waiting
SELECT id AS run_id, waiting_reason AS reason, waiting_wake_at_ms AS wake_at_ms,
       waiting_token AS token, waiting_request AS request
  FROM runfleet.runs
 WHERE id = %(id)s AND waiting_reason IS NOT NULL
   AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: waiting_runs
-- Earliest wake first, untimed waits last, run id breaks ties (sweeper order).
SELECT id AS run_id, waiting_reason AS reason, waiting_wake_at_ms AS wake_at_ms,
       waiting_token AS token, waiting_request AS request
  FROM runfleet.runs
 WHERE waiting_reason IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')
   AND (%(reason)s::text IS NULL OR waiting_reason = %(reason)s)
   AND (%(due_before_ms)s::bigint IS NULL OR waiting_wake_at_ms <= %(due_before_ms)s)
   AND (%(due_now)s::boolean IS NOT TRUE OR waiting_wake_at_ms <= runfleet.now_ms())
   AND (%(cancel_requested)s::boolean IS NULL
        OR (cancel_requested_at_ms IS NOT NULL) = %(cancel_requested)s)
 ORDER BY waiting_wake_at_ms ASC NULLS LAST, id
 LIMIT %(limit)s;

-- name: waiting_tree
-- Attached children (DAG edges) and later rounds (parent_run_id links) of a run,
-- walked to a bounded depth. Settled runs are walked through but never listed.
WITH RECURSIVE tree(id, depth) AS (
    SELECT %(id)s::text, 0
    UNION
    SELECT nxt.id, t.depth + 1 FROM tree t
      CROSS JOIN LATERAL (
          SELECT e.child_id AS id FROM runfleet.run_parents e
            JOIN runfleet.runs c ON c.id = e.child_id
           WHERE e.parent_id = t.id
             AND (%(include_detached)s OR coalesce(c.state->>'on_parent_exit', 'cancel') <> 'detach')
          UNION ALL
          SELECT n.id FROM runfleet.runs n WHERE n.parent_run_id = t.id
      ) AS nxt
     WHERE t.depth < 64
)
SELECT r.id AS run_id, r.waiting_reason AS reason, r.waiting_wake_at_ms AS wake_at_ms,
       r.waiting_token AS token, r.waiting_request AS request, min(tree.depth) AS depth
  FROM tree JOIN runfleet.runs r ON r.id = tree.id
 WHERE r.waiting_reason IS NOT NULL AND r.status NOT IN ('completed', 'failed', 'cancelled')
 GROUP BY r.id
 ORDER BY min(tree.depth), r.created_at_ms, r.id;

-- name: deferred_insert
-- value is canonical JSON text (store/values.py), kept verbatim; its digest is of that text.
INSERT INTO runfleet.deferreds (run_id, name, value, metadata, completed_at_ms, digest)
VALUES (%(run_id)s, %(name)s, %(value)s::json, %(metadata)s, runfleet.now_ms(),
        runfleet.value_digest(%(value)s::json))
ON CONFLICT (run_id, name) DO NOTHING
RETURNING run_id, name, value, metadata, completed_at_ms, consumed_at_ms, digest;

-- name: lock_child
-- A parent parking on child:<id> waits here for a settlement of that child still in
-- flight (it holds the child's row lock until it commits its notify_parents).
SELECT 1 FROM runfleet.runs WHERE id = %(id)s FOR SHARE;

-- name: deferred_get
SELECT run_id, name, value, metadata, completed_at_ms, consumed_at_ms, digest
  FROM runfleet.deferreds WHERE run_id = %(run_id)s AND name = %(name)s;

-- name: deferred_consume
UPDATE runfleet.deferreds SET consumed_at_ms = runfleet.now_ms()
 WHERE run_id = %(run_id)s AND name = %(name)s AND consumed_at_ms IS NULL
RETURNING name;

-- name: deferreds_completed
SELECT run_id, name, value, metadata, completed_at_ms, consumed_at_ms, digest
  FROM runfleet.deferreds WHERE run_id = %(run_id)s ORDER BY completed_at_ms, name;

-- name: wake_if_awaiting
-- The run parked on exactly this deferred: clear the wait so a claim can resume it.
UPDATE runfleet.runs AS r SET
    waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
    waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(run_id)s AND r.waiting_deferred = %(name)s
   AND r.waiting_reason <> 'quarantine'
   AND r.status NOT IN ('completed', 'failed', 'cancelled')
RETURNING r.id;

-- name: clock_insert
-- Owner-fenced and existing-wins: a replayed sleep finds the clock it set before.
INSERT INTO runfleet.clocks (run_id, name, deferred_name, due_at_ms)
SELECT %(run_id)s, %(name)s, %(deferred_name)s, %(due_at_ms)s
  FROM runfleet.runs r
 WHERE r.id = %(run_id)s AND r.status = 'running' AND r.owner_host = %(host)s
   AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = %(epoch)s
ON CONFLICT (run_id, name) DO NOTHING
RETURNING run_id, name, deferred_name, due_at_ms, completed_at_ms;

-- name: clock_get
SELECT run_id, name, deferred_name, due_at_ms, completed_at_ms
  FROM runfleet.clocks WHERE run_id = %(run_id)s AND name = %(name)s;

-- name: clock_complete
UPDATE runfleet.clocks SET completed_at_ms = runfleet.now_ms()
 WHERE run_id = %(run_id)s AND name = %(name)s AND completed_at_ms IS NULL
RETURNING run_id, name, deferred_name, due_at_ms, completed_at_ms;

-- name: clocks_due
SELECT run_id, name, deferred_name, due_at_ms, completed_at_ms FROM runfleet.clocks
 WHERE completed_at_ms IS NULL AND due_at_ms <= runfleet.now_ms()
 ORDER BY due_at_ms, run_id, name LIMIT %(limit)s;

-- name: clocks_pending
SELECT run_id, name, deferred_name, due_at_ms, completed_at_ms FROM runfleet.clocks
 WHERE run_id = %(run_id)s AND completed_at_ms IS NULL ORDER BY due_at_ms, name;

-- name: notify_parents
-- Settled children complete the deferred every parent awaits them through (diamond
-- edges included) and clear the wait of each parent parked on one:
-- runfleet.notify_parents (migration 0025; the statement, its rules, and why it is a
-- function with generic plans). The parents are those of EVERY round of a child's
-- lineage; a parent already settled gets nothing; only_parent, when set, limits the
-- hand-over to that parent. Takes a batch (children[i] settled with values[i], canonical
-- JSON text); answers the woken parents' rows, so the caller can hint them without
-- reading them again.
SELECT (n.run).*, n.now_ms, n.woken_by
  FROM runfleet.notify_parents(%(children)b::text[], %(values)b::text[],
                               %(only_parent)s::text) AS n;

-- name: awaiting_token
SELECT waiting_reason, waiting_token, waiting_deferred, status FROM runfleet.runs
 WHERE id = %(id)s FOR UPDATE;

-- name: answer
-- A producer's answer (an event's value, or an approval's decision when token is set):
-- checked, written, woken and journaled by runfleet.answer (migration 0009) under the run's
-- row lock, with the authenticated role as the actor. Producers may not write deferreds
-- themselves, so this is the only way an answer from outside lands.
SELECT outcome, why, deferred_name, woke
  FROM runfleet.answer(%(run_id)s, %(name)s, %(token)s, %(approved)s, %(value)s::json,
                       %(note)s, %(reason)s, %(max_answers)s, %(source_id)s, %(source_seq)s);
