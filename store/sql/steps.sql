-- Durable flow calls: the recorded steps replay reads, attempts, compensations,
-- and the flow registry.

-- name: of_run
-- The output as its stored text (not decoded by the driver): replay checks the digest
-- over exactly this text and decodes it itself (store/values.py).
SELECT run_id, key, name, kind, position, output::text AS output_text, digest, epoch,
       recorded_at_ms, compensate, compensated_at_ms
  FROM runfleet.steps WHERE run_id = %(run_id)s ORDER BY position;

-- name: record
-- Owner+epoch fenced: a process that lost the run can never record a call for it.
-- The record, its journal entry and (for a step) the end of the attempt that
-- produced it are one statement: one round trip, and all or nothing. The output is
-- canonical JSON text kept verbatim by the json column; the digest is over that text.
WITH recorded AS (
    INSERT INTO runfleet.steps (run_id, key, name, kind, position, output, digest, epoch,
                                recorded_at_ms, compensate)
    SELECT %(run_id)s, %(key)s, %(name)s, %(kind)s, %(position)s, %(output)s::json,
           %(digest)s, %(epoch)s, runfleet.now_ms(), %(compensate)s
      FROM runfleet.runs r
     WHERE r.id = %(run_id)s AND r.status = 'running' AND r.owner_host = %(host)s
       AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = %(epoch)s
    ON CONFLICT DO NOTHING
    RETURNING run_id, key, name, kind, position, output::text AS output_text, digest, epoch,
              recorded_at_ms, compensate, compensated_at_ms
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT run_id, %(journal_kind)s, %(source_id)s, %(source_seq)s, %(payload)s,
           %(payload_digest)s, recorded_at_ms
      FROM recorded
), finished AS (
    UPDATE runfleet.attempts AS a SET finished_at_ms = runfleet.now_ms(), error = NULL
      FROM recorded
     WHERE a.run_id = recorded.run_id AND a.key = recorded.key AND a.attempt = %(attempt)s
)
SELECT * FROM recorded;

-- name: attempt_start
INSERT INTO runfleet.attempts (run_id, key, attempt, started_at_ms)
SELECT %(run_id)s, %(key)s,
       coalesce((SELECT max(attempt) FROM runfleet.attempts
                  WHERE run_id = %(run_id)s AND key = %(key)s), 0) + 1,
       runfleet.now_ms()
  FROM runfleet.runs r
 WHERE r.id = %(run_id)s AND r.status = 'running' AND r.owner_host = %(host)s
   AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = %(epoch)s
RETURNING attempt;

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
