-- rq's job registries and queue-level reads over run rows (store/registries.py). Every
-- registry is a read of runfleet.runs: there is no second list to keep in step. ``rq_id``
-- is the id an rq user reads: a failed-registry requeue's round (``<id>@<n>``) answers
-- with its lineage's id, as rq keeps one id across a requeue. A run that rq's
-- ``delete()`` removed (state ``deleted``) is in no registry and no queue.

-- name: by_status
-- Runs of the queue whose rq status the caller narrows in Python (deferred/started need
-- the dependencies' statuses): the candidate rows of one registry, oldest first.
SELECT CASE WHEN r.state ? 'requeued_from' THEN r.lineage_id ELSE r.id END AS rq_id,
       r.id, r.status, r.state->'depends_on' AS depends_on,
       coalesce((r.state->>'allow_failure')::boolean, false) AS allow_failure,
       r.waiting_wake_at_ms AS wake_at_ms
  FROM runfleet.runs r
 WHERE r.queue = %(queue)s
   AND NOT (r.state ? 'deleted') AND NOT (r.state ? 'requeued_as')
   -- past result_ttl / failure_ttl: rq's key expired (retention deletes the row later)
   AND NOT (r.status = 'completed' AND coalesce((r.state->>'result_ttl')::bigint >= 0
            AND r.updated_at_ms + (r.state->>'result_ttl')::bigint * 1000 <= runfleet.now_ms(),
            false))
   AND NOT (r.status = 'failed' AND coalesce((r.state->>'failure_ttl')::bigint >= 0
            AND r.updated_at_ms + (r.state->>'failure_ttl')::bigint * 1000 <= runfleet.now_ms(),
            false))
   AND coalesce(r.state->'scopes', '[]'::jsonb) <@ %(scopes)s::jsonb
   AND CASE %(kind)s
         WHEN 'finished' THEN r.status = 'completed' AND NOT (r.state ? 'handed_off_to')
         WHEN 'failed' THEN r.status = 'failed' AND NOT (r.state ? 'canceled')
         WHEN 'canceled' THEN r.status = 'cancelled'
              OR (r.status = 'failed' AND r.state ? 'canceled')
              OR (r.status IN ('pending', 'running', 'suspended')
                  AND r.cancel_requested_at_ms IS NOT NULL)
         WHEN 'scheduled' THEN r.cancel_requested_at_ms IS NULL AND ((r.status = 'pending'
              AND r.waiting_reason = 'timer' AND r.waiting_wake_at_ms > runfleet.now_ms()
              AND NOT (r.state ? 'depends_on'))
              -- rq's retry= parked on its interval (broker.jobs.retry_scheduled)
              OR (r.status = 'suspended' AND r.waiting_reason = 'timer' AND r.state ? 'retry'))
         WHEN 'started' THEN r.status IN ('running', 'suspended')
              AND r.cancel_requested_at_ms IS NULL
              AND NOT (r.status = 'suspended' AND r.waiting_reason = 'timer'
                       AND r.state ? 'retry')
         WHEN 'deferred' THEN r.status IN ('pending', 'running', 'suspended')
              AND r.cancel_requested_at_ms IS NULL AND r.state ? 'depends_on'
         ELSE false
       END
 ORDER BY r.updated_at_ms, r.created_at_ms, r.id
 LIMIT %(limit)s;

-- name: queued
-- rq's queue contents: pending runs nobody started, not waiting on a future timer,
-- oldest first; their rq ids (a requeued round answers with its lineage's id). A run with
-- dependencies is a candidate: the caller keeps it once they are met (rq enqueues a
-- dependent when its last dependency finishes, or is cancelled with enqueue_dependents).
SELECT CASE WHEN r.state ? 'requeued_from' THEN r.lineage_id ELSE r.id END AS rq_id,
       r.state->'depends_on' AS depends_on,
       coalesce((r.state->>'allow_failure')::boolean, false) AS allow_failure
  FROM runfleet.runs r
 WHERE r.queue = %(queue)s AND r.status = 'pending'
   AND r.cancel_requested_at_ms IS NULL
   AND (r.waiting_reason IS NULL
        OR (r.waiting_reason = 'timer' AND r.waiting_wake_at_ms <= runfleet.now_ms()))
   AND NOT (r.state ? 'deleted')
   -- past its deadline (rq's ttl): the deadline sweep cancels it; rq's expired job is gone
   AND coalesce((r.state->>'deadline_ms')::bigint > runfleet.now_ms(), true)
   AND coalesce(r.state->'scopes', '[]'::jsonb) <@ %(scopes)s::jsonb
 ORDER BY (r.state ? 'at_front') DESC,
          CASE WHEN r.state ? 'at_front' THEN -r.created_at_ms ELSE r.created_at_ms END,
          r.id
 LIMIT %(limit)s;

-- name: queues
-- rq's Queue.all(): every queue a run was ever enqueued on, but those rq's
-- ``Queue.delete()`` removed (until a new run is enqueued there).
SELECT DISTINCT r.queue FROM runfleet.runs r
 WHERE NOT (r.state ? 'queue_deleted')
   AND coalesce(r.state->'scopes', '[]'::jsonb) <@ %(scopes)s::jsonb
 ORDER BY r.queue;

-- name: mark
-- rq's delete (``deleted``), Queue.delete (``queue_deleted``), cancel's
-- enqueue_dependents (``dependents_released``) and remove_from_dependencies
-- (``removed_from_dependencies``), the cancel of a failed job (``canceled``: the run stays
-- failed, rq reads it canceled): one marker key in its state.
-- updated_at_ms is left alone: it is a settled run's settlement time (job.ended_at).
UPDATE runfleet.runs SET state = state || jsonb_build_object(%(key)s::text, true)
 WHERE id = ANY(%(ids)s)
RETURNING id;

-- name: mark_queue_deleted
UPDATE runfleet.runs SET state = state || '{"queue_deleted": true}'::jsonb
 WHERE queue = %(queue)s AND NOT (state ? 'queue_deleted')
   AND coalesce(state->'scopes', '[]'::jsonb) <@ %(scopes)s::jsonb;

-- name: dependents
-- Runs that name ``id`` in depends_on (rq's job.dependent_ids), oldest first; not those
-- deleted or cancelled with remove_from_dependencies.
SELECT r.id FROM runfleet.runs r
 WHERE r.state->'depends_on' ? %(id)s AND NOT (r.state ? 'deleted')
   AND NOT (r.state ? 'removed_from_dependencies')
 ORDER BY r.created_at_ms, r.id;

-- name: work_left
-- What a burst worker still has to do in its queues: runs that may start (or wake)
-- now or within the horizon, and every open dependent (the caller checks whether its
-- dependencies are met: a dependent of an unfinished job does not keep a burst alive).
-- ``excluding``: runs the worker found it cannot execute, left out so they never fill
-- the limit ahead of runs it can.
SELECT r.id, r.state->'depends_on' AS depends_on,
       coalesce((r.state->>'allow_failure')::boolean, false) AS allow_failure
  FROM runfleet.runs r
 WHERE r.queue = ANY(%(queues)s) AND r.status IN ('pending', 'running', 'suspended')
   AND NOT (r.id = ANY(%(excluding)s::text[]))
   AND (r.status = 'running'
        OR r.state ? 'depends_on'
        OR r.waiting_reason IS NULL
        OR (r.waiting_reason = 'timer'
            AND r.waiting_wake_at_ms <= runfleet.now_ms() + %(horizon_ms)s))
 LIMIT 200;

-- name: answering_many
-- The round that answers for each of many rq ids, in one statement: from each id, a
-- failed round that was requeued hops to the round that replaced it, a completed round
-- that handed off to its successor, until a round that does neither. ``following`` is the
-- hop the last row found would take: not null means its target is gone or hidden from
-- this role (row-level security), and nothing answers. The depth bound only guards
-- against a cycle. Only what the dependency gate reads of each answering round comes
-- back: its status and its markers (never its payload). One row per id found.
WITH RECURSIVE walk AS (
    SELECT r.id AS origin, r.status, r.state, 0 AS depth,
           nullif(CASE r.status WHEN 'failed' THEN r.state->>'requeued_as'
                                WHEN 'completed' THEN r.state->>'handed_off_to' END, '')
             AS following
      FROM runfleet.runs r WHERE r.id = ANY(%(ids)s::text[])
    UNION ALL
    SELECT w.origin, n.status, n.state, w.depth + 1,
           nullif(CASE n.status WHEN 'failed' THEN n.state->>'requeued_as'
                                WHEN 'completed' THEN n.state->>'handed_off_to' END, '')
      FROM walk w JOIN runfleet.runs n ON n.id = w.following
     WHERE w.depth < 10000
)
SELECT DISTINCT ON (w.origin) w.origin, w.status, w.following,
       w.state->'deleted' AS deleted,
       w.state->'dependents_released' AS dependents_released,
       w.state->'canceled' AS canceled
  FROM walk w ORDER BY w.origin, w.depth DESC;
