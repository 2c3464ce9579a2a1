-- Admission of parentless runs (the producer's case): two statements sent in one
-- pipeline, so one round trip and one implicit transaction (no BEGIN/COMMIT): either
-- both land or neither does. Children keep runs.insert (they lock their parent first).
--
-- Why not one statement with the journal insert in a CTE: a producer's journal rows are
-- checked by row-level security (journal_scoped: the run must be visible), and a row
-- inserted by a sibling CTE is not visible to that check within the same statement, so
-- the insert would be refused for every scoped producer. The second statement runs after
-- the first and sees its rows.

-- name: runs
-- The rows, from one jsonb array of records (one parameter to encode, where parallel
-- arrays cost the producer a type probe per element); the ids it inserted come back.
-- No conflict target: every unique index is an arbiter (see runs.insert for why). A row
-- whose id or (lineage_id, round_ordinal) is taken is skipped, and its caller joins or
-- is refused.
INSERT INTO runfleet.runs AS r (
    id, flow, queue, status, state, payload, lineage_id, round_ordinal, parent_run_id,
    created_at_ms, updated_at_ms, waiting_reason, waiting_wake_at_ms,
    priority, dedup_key)  -- docs/queues.md: NULL priority = the queue's default (trigger)
SELECT b.id, b.flow, b.queue, 'pending',
    b.state || CASE WHEN b.timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
               ELSE jsonb_build_object('deadline_ms', LEAST(t.now_ms + b.timeout_ms,
                                                             (b.state->>'deadline_ms')::bigint))
               END,
    b.payload::json,  -- canonical text, kept verbatim (store/values.py)
    b.lineage_id, b.round_ordinal, b.previous_round_id, t.now_ms, t.now_ms,
    CASE WHEN b.delay_until_ms IS NOT NULL THEN 'timer' END, b.delay_until_ms,
    b.priority, b.dedup_key
  FROM (SELECT runfleet.now_ms() AS now_ms) AS t,  -- one admission instant per batch
       ROWS FROM (jsonb_to_recordset(%(runs)s::jsonb)
                  AS (id text, flow text, queue text, state jsonb, payload text,
                      lineage_id text, round_ordinal integer, previous_round_id text,
                      delay_until_ms bigint, timeout_ms bigint, priority integer,
                      dedup_key text))
           WITH ORDINALITY AS b(id, flow, queue, state, payload, lineage_id, round_ordinal,
                                previous_round_id, delay_until_ms, timeout_ms, priority,
                                dedup_key, n)
 ORDER BY b.n
ON CONFLICT DO NOTHING
RETURNING r.id;

-- name: created
-- Each batch run's ``created`` record, written for the runs that have none: exactly the
-- rows the statement before inserted, since every other run got its record in the
-- transaction that admitted it (retention deletes a run's records only with the run).
-- A run this role cannot see gets nothing and is not returned. Then every batch run as
-- it is now: the new rows, and the existing ones a re-admission joins (committed by
-- anyone before this statement, so a concurrent admission of the same id is seen).
-- No ON CONFLICT on the journal: an address collision fails the whole transaction.
WITH b AS (
    SELECT * FROM jsonb_to_recordset(%(records)s::jsonb)
                  AS b(id text, source_seq bigint, record jsonb, digest text, queue text,
                       dedup_key text)
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT b.id, %(kind)s, %(source_id)s, b.source_seq, b.record, b.digest, runfleet.now_ms()
      FROM b
     WHERE EXISTS (SELECT FROM runfleet.runs r WHERE r.id = b.id)
       AND NOT EXISTS (SELECT FROM runfleet.journal j
                        WHERE j.run_id = b.id AND j.kind = %(kind)s)
    RETURNING run_id
)
SELECT r.*, runfleet.now_ms() AS now_ms
  FROM runfleet.runs r
 WHERE r.id IN (SELECT b.id FROM b)
    -- and the open run holding a batch run's dedup_key (docs/queues.md): the caller
    -- whose insert that key's index skipped is answered with it, or refused
    OR (r.status IN ('pending', 'running', 'suspended')
        AND (r.queue, r.dedup_key) IN (SELECT b.queue, b.dedup_key FROM b
                                        WHERE b.dedup_key IS NOT NULL));
