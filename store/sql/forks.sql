-- Resume, fork and delete a run (store/forks.py).

-- name: copy_steps
-- The source's recorded calls before position %(upto)s, as the new run's own history
-- (epoch 0: recorded before its first activation). A fork drops their compensations
-- (it did not cause those effects); a resumed round keeps them.
INSERT INTO runfleet.steps (run_id, key, name, output, digest, epoch, recorded_at_ms,
                            position, kind, compensate, compensated_at_ms)
SELECT %(to)s, s.key, s.name, s.output, s.digest, 0, runfleet.now_ms(), s.position, s.kind,
       CASE WHEN %(keep_compensations)s THEN s.compensate END, NULL
  FROM runfleet.steps s
 WHERE s.run_id = %(from)s AND s.position < %(upto)s
RETURNING key;

-- name: copy_deferreds
-- The completions the copied waits read (events, approvals, children, timers).
INSERT INTO runfleet.deferreds (run_id, name, value, metadata, completed_at_ms,
                                consumed_at_ms, digest)
SELECT %(to)s, d.name, d.value, d.metadata, d.completed_at_ms, d.consumed_at_ms, d.digest
  FROM runfleet.deferreds d
 WHERE d.run_id = %(from)s AND d.name = ANY(%(names)s::text[])
ON CONFLICT (run_id, name) DO NOTHING
RETURNING name;

-- name: event_put
INSERT INTO runfleet.run_events (run_id, key, value, digest, version, set_at_ms)
VALUES (%(run_id)s, %(key)s, %(value)s::json, runfleet.value_digest(%(value)s::json),
        %(version)s, runfleet.now_ms())
ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, digest = excluded.digest,
    version = excluded.version, set_at_ms = excluded.set_at_ms;

-- name: mark_resumed
UPDATE runfleet.runs SET state = state || jsonb_build_object('resumed_as', %(to)s::text)
 WHERE id = %(id)s
RETURNING id;

-- name: lineage_rows
SELECT id, status FROM runfleet.runs WHERE lineage_id = %(lineage)s ORDER BY round_ordinal
   FOR UPDATE;

-- name: delete_runs
-- Everything that belongs to these runs, then the runs (as retention's prune does), by
-- runfleet.delete_settled (0030): every run visible to the caller and settled, or nothing.
SELECT d.deleted_runs AS runs, d.deleted_records AS journal, d.deleted_steps AS steps
  FROM runfleet.delete_settled(%(ids)s::text[]) AS d;

-- name: session_role
-- Who asks for a resume or fork, for the journal: the authenticated role.
SELECT session_user::text AS role;
