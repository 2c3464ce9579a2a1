-- Durable flow calls: the recorded steps replay reads, attempts, compensations,
-- and the flow registry.

-- name: of_run
-- The output as its stored text (not decoded by the driver): replay checks the digest
-- over exactly this text and decodes it itself (store/values.py).
SELECT run_id, key, name, kind, position, output::text AS output_text, digest, epoch,
       recorded_at_ms, compensate, compensated_at_ms
  FROM runfleet.steps WHERE run_id = %(run_id)s ORDER BY position;

-- name: listing
-- A run's steps as a user lists them (DBOS list_workflow_steps): every recorded call, and
-- every step that was attempted and never recorded (it failed, or its attempt was cut
-- off), each with its attempt count and its last attempt's error. Recorded calls first, by
-- position; the others by their first attempt.
WITH tried AS (
    SELECT a.key, count(*) AS attempts, min(a.started_at_ms) AS first_started_at_ms,
           (array_agg(a.error ORDER BY a.attempt DESC))[1] AS last_error,
           (array_agg(a.finished_at_ms ORDER BY a.attempt DESC))[1] AS last_finished_at_ms
      FROM runfleet.attempts a WHERE a.run_id = %(run_id)s GROUP BY a.key
), recorded AS (
    SELECT s.key, s.name, s.kind, s.position, s.output::text AS output_text, s.recorded_at_ms,
           s.compensated_at_ms
      FROM runfleet.steps s WHERE s.run_id = %(run_id)s
)
SELECT coalesce(r.key, t.key) AS key, r.name, r.kind, r.position, r.output_text,
       r.recorded_at_ms, r.compensated_at_ms, coalesce(t.attempts, 0) AS attempts,
       t.last_error, t.last_finished_at_ms, t.first_started_at_ms
  FROM recorded r FULL JOIN tried t ON t.key = r.key
 ORDER BY r.position NULLS LAST, t.first_started_at_ms, coalesce(r.key, t.key);

-- name: record
-- Owner+epoch fenced: a process that lost the run can never record a call for it.
-- The record, its journal entry and (for a step) the end of the attempt that
-- produced it are one statement: one round trip, and all or nothing. The output is
-- canonical JSON text kept verbatim by the json column; the digest is over that text.
-- Takes a batch (`batch`: one jsonb array of {run_id, key, name, kind, position, output,
-- digest, epoch, compensate, attempt, seq, payload, payload_digest}, the calls of several
-- runs of one owner that became ready together), each row fenced by its own run and epoch.
-- One jsonb parameter rather than parallel arrays: the driver probes every element of
-- every array for its type and quotes it, at every call, which cost the worker about
-- twice the rest of the call's client CPU (docs/producer.md, "The worker's step
-- writes as one jsonb parameter"). Each row's run is read by its id alone (a LATERAL
-- that OFFSET 0 keeps from being flattened, so the fence's conditions stay outside it):
-- the planner, which takes the batch for 100 rows and the owner's runs for one, would
-- otherwise read every run the owner holds by runs_owner_idx.
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(run_id text, key text, name text, kind text, position integer, output text,
             digest text, epoch bigint, compensate text, attempt integer, seq bigint,
             payload jsonb, payload_digest text)
), recorded AS (
    INSERT INTO runfleet.steps (run_id, key, name, kind, position, output, digest, epoch,
                                recorded_at_ms, compensate)
    SELECT w.run_id, w.key, w.name, w.kind, w.position, w.output::json, w.digest, w.epoch,
           runfleet.now_ms(), w.compensate
      FROM wanted w CROSS JOIN LATERAL (
               SELECT r.status, r.owner_host, r.owner_pid, r.owner_nonce, r.epoch
                 FROM runfleet.runs r WHERE r.id = w.run_id OFFSET 0) AS r
     WHERE r.status = 'running' AND r.owner_host = %(host)s
       AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = w.epoch
    ON CONFLICT DO NOTHING
    RETURNING run_id, key, name, kind, position, output::text AS output_text, digest, epoch,
              recorded_at_ms, compensate, compensated_at_ms
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT rec.run_id, %(journal_kind)s, %(source_id)s, w.seq, w.payload, w.payload_digest,
           rec.recorded_at_ms
      FROM recorded rec JOIN wanted w ON w.run_id = rec.run_id AND w.key = rec.key
), finished AS (
    UPDATE runfleet.attempts AS a SET finished_at_ms = runfleet.now_ms(), error = NULL
      FROM recorded rec JOIN wanted w ON w.run_id = rec.run_id AND w.key = rec.key
     WHERE a.run_id = rec.run_id AND a.key = rec.key AND a.attempt = w.attempt
)
SELECT * FROM recorded;

-- name: attempt_start
-- Numbers and records the next attempt of each (run, step), fenced like a record; a
-- batch as one jsonb array of {run_id, key, epoch}, each run read by its id alone (as
-- `record`'s). A row missing from the answer lost its fence.
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS w(run_id text, key text, epoch bigint)
)
INSERT INTO runfleet.attempts (run_id, key, attempt, started_at_ms)
SELECT w.run_id, w.key,
       coalesce((SELECT max(a.attempt) FROM runfleet.attempts a
                  WHERE a.run_id = w.run_id AND a.key = w.key), 0) + 1,
       runfleet.now_ms()
  FROM wanted w CROSS JOIN LATERAL (
           SELECT r.status, r.owner_host, r.owner_pid, r.owner_nonce, r.epoch
             FROM runfleet.runs r WHERE r.id = w.run_id OFFSET 0) AS r
 WHERE r.status = 'running' AND r.owner_host = %(host)s
   AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = w.epoch
RETURNING run_id, key, attempt;

-- name: attempt_finish
UPDATE runfleet.attempts SET finished_at_ms = runfleet.now_ms(), error = %(error)s
 WHERE run_id = %(run_id)s AND key = %(key)s AND attempt = %(attempt)s;

-- name: attempts_of
SELECT attempt, started_at_ms, finished_at_ms, error FROM runfleet.attempts
 WHERE run_id = %(run_id)s AND key = %(key)s ORDER BY attempt;

-- name: mark_compensated
UPDATE runfleet.steps AS s SET compensated_at_ms = runfleet.now_ms()
  FROM runfleet.runs r
 WHERE s.run_id = %(run_id)s AND s.key = %(key)s AND s.compensated_at_ms IS NULL
   AND r.id = s.run_id AND r.status = 'running' AND r.owner_host = %(host)s
   AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = %(epoch)s
RETURNING s.key;

-- name: set_digest
UPDATE runfleet.steps SET digest = %(digest)s WHERE run_id = %(run_id)s AND key = %(key)s
RETURNING key;

-- name: delete
DELETE FROM runfleet.steps WHERE run_id = %(run_id)s AND key = %(key)s RETURNING key;
