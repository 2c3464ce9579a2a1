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
-- Everything that belongs to these runs, then the runs (as retention's prune does).
WITH doomed AS (SELECT unnest(%(ids)s::text[]) AS id),
j AS (DELETE FROM runfleet.journal WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
s AS (DELETE FROM runfleet.steps WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
a AS (DELETE FROM runfleet.attempts WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
d AS (DELETE FROM runfleet.deferreds WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
c AS (DELETE FROM runfleet.clocks WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
e AS (DELETE FROM runfleet.run_events WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
m AS (DELETE FROM runfleet.run_messages WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
p AS (DELETE FROM runfleet.run_parents
       WHERE child_id IN (SELECT id FROM doomed) OR parent_id IN (SELECT id FROM doomed)
      RETURNING 1),
r AS (DELETE FROM runfleet.runs WHERE id IN (SELECT id FROM doomed) RETURNING 1)
SELECT (SELECT count(*) FROM r) AS runs, (SELECT count(*) FROM j) AS journal,
       (SELECT count(*) FROM s) AS steps;

-- name: session_role
-- Who asks for a resume or fork, for the journal: the authenticated role.
SELECT session_user::text AS role;
