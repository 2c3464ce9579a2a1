-- rq's producer surface over run rows (rqface/jobs.py): what a queue holds, the
-- failed registry, a job's meta. Scoped reads name only runs whose scopes the
-- caller's cover (row-level security narrows them again for scoped roles).

-- name: failed_ids
-- rq's FailedJobRegistry: runs of the queue that settled failed and were not requeued,
-- oldest failure first.
SELECT r.id FROM runfleet.runs r
 WHERE r.queue = %(queue)s AND r.status = 'failed' AND NOT (r.state ? 'requeued_as')
   AND NOT (r.state ? 'canceled')
   AND coalesce(r.state->'scopes', '[]'::jsonb) <@ %(scopes)s::jsonb
 ORDER BY r.updated_at_ms, r.id
 LIMIT %(limit)s;

-- name: save_meta
-- rq's job.save_meta(): only the meta key of the state changes (workers merge their
-- patches with ||, so neither side overwrites the other); updated_at_ms is left alone
-- because it is the run's settlement time once settled (job.ended_at).
UPDATE runfleet.runs SET state = jsonb_set(state, '{meta}', %(meta)s::jsonb)
 WHERE id = %(id)s
RETURNING id;

-- name: started_at
-- When the run was first activated (rq's job.started_at) and the worker process that
-- activated it last (rq's job.worker_name), from its journal.
SELECT min(j.at_ms) AS at_ms,
       (array_agg(j.payload->>'owner' ORDER BY j.seq DESC))[1] AS worker
  FROM runfleet.journal j
 WHERE j.run_id = %(id)s
   AND j.kind IN ('claimed-and-activated', 'activated', 'stolen-and-activated');

-- name: mark_requeued
-- A failed run that rq's requeue replaced by a new round: it stays failed (terminal is
-- never left) and leaves the failed registry; reading it follows ``requeued_as``.
UPDATE runfleet.runs SET state = state || jsonb_build_object('requeued_as', %(to)s::text)
 WHERE id = %(id)s AND status = 'failed'
RETURNING id;
