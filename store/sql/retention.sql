-- Retention: delete settled runs and every row that belongs to them, one bounded batch
-- per statement. A statement is its own short transaction (the pool autocommits), so
-- the row locks it takes last one batch; it never waits on a lock (SKIP LOCKED), so
-- a worker or producer holding a run it scans simply keeps that run for the next pass.
--
-- A settled run is due when its own TTL has passed (rq's result_ttl for a completed
-- run, failure_ttl for a failed one: runfleet.run_expires_at_ms <= %(now_ms)s; a
-- negative TTL never passes), or, when it has no TTL of its own, when it settled before
-- the fleet cutoff %(before_ms)s (RUNFLEET_RETENTION or --settled-before).
--
-- The unit is a lineage (every handoff or requeued round of a run): it goes only when
-- every round is due, and no run linked to one of its rounds by a parent edge (a parent
-- or a child) belongs to a lineage with a round still open or not due. Terminal rows
-- never change status, so a lineage judged prunable stays prunable; the rows that could
-- still appear (a new child edge, an answer) are written under the run's row lock,
-- which this statement holds or skips.

-- name: prune_batch
-- One batch: scan up to %(limit)s runs strictly after the keyset cursor, in the order
-- %(scan)s names: 'settled' walks runs settled before the cutoff (runs_settled_idx),
-- 'expiry' walks runs whose own TTL has passed (runs_expiry_idx); the other branch is a
-- one-time filter that reads nothing. Then widen each to its lineage, keep lineages that
-- are held, lock the rest (SKIP LOCKED; a lineage with any round locked elsewhere is
-- kept whole), delete them with their rows. Returns one row: the counts per table, how
-- many runs the scan read and the scan's last key (the next cursor).
WITH scanned AS (
    (SELECT id, lineage_id, updated_at_ms AS key_ms FROM runfleet.runs
      WHERE %(scan)s::text = 'settled'
        AND status IN ('completed', 'failed', 'cancelled')
        AND updated_at_ms < %(before_ms)s
        AND (updated_at_ms, id) > (%(after_ms)s, %(after_id)s)
      ORDER BY updated_at_ms, id
      LIMIT %(limit)s)
    UNION ALL
    (SELECT id, lineage_id, runfleet.run_expires_at_ms(status, state, updated_at_ms) AS key_ms
       FROM runfleet.runs
      WHERE %(scan)s::text = 'expiry'
        AND runfleet.run_expires_at_ms(status, state, updated_at_ms) <= %(now_ms)s
        AND (runfleet.run_expires_at_ms(status, state, updated_at_ms), id)
            > (%(after_ms)s, %(after_id)s)
      ORDER BY runfleet.run_expires_at_ms(status, state, updated_at_ms), id
      LIMIT %(limit)s)
),
last_key AS (
    SELECT key_ms, id FROM scanned ORDER BY key_ms DESC, id DESC LIMIT 1
),
members AS (
    SELECT m.id, m.lineage_id, m.status, m.updated_at_ms,
           runfleet.run_expires_at_ms(m.status, m.state, m.updated_at_ms) AS expires_at_ms
      FROM runfleet.runs m
     WHERE m.lineage_id IN (SELECT lineage_id FROM scanned)
),
relatives AS (
    SELECT m.lineage_id, e.parent_id AS other FROM members m
      JOIN runfleet.run_parents e ON e.child_id = m.id
    UNION
    SELECT m.lineage_id, e.child_id FROM members m
      JOIN runfleet.run_parents e ON e.parent_id = m.id
),
held AS (
    SELECT lineage_id FROM members
     WHERE status NOT IN ('completed', 'failed', 'cancelled')
        OR NOT coalesce(expires_at_ms <= %(now_ms)s, updated_at_ms < %(before_ms)s)
    UNION
    SELECT rel.lineage_id FROM relatives rel
      JOIN runfleet.runs o ON o.id = rel.other
      JOIN runfleet.runs live ON live.lineage_id = o.lineage_id
     WHERE live.status NOT IN ('completed', 'failed', 'cancelled')
        OR NOT coalesce(
            runfleet.run_expires_at_ms(live.status, live.state, live.updated_at_ms)
                <= %(now_ms)s,
            live.updated_at_ms < %(before_ms)s)
),
wanted AS (
    SELECT id, lineage_id FROM members
     WHERE lineage_id NOT IN (SELECT lineage_id FROM held)
),
locked AS (
    SELECT r.id, r.lineage_id FROM runfleet.runs r
     WHERE r.id IN (SELECT id FROM wanted)
       AND r.status IN ('completed', 'failed', 'cancelled')
       FOR UPDATE SKIP LOCKED
),
doomed AS (
    SELECT l.id FROM locked l
     WHERE NOT EXISTS (
         SELECT 1 FROM wanted w
          WHERE w.lineage_id = l.lineage_id AND w.id NOT IN (SELECT id FROM locked))
),
del_journal AS (
    DELETE FROM runfleet.journal WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_steps AS (
    DELETE FROM runfleet.steps WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_attempts AS (
    DELETE FROM runfleet.attempts WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_deferreds AS (
    DELETE FROM runfleet.deferreds WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_clocks AS (
    DELETE FROM runfleet.clocks WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_events AS (
    DELETE FROM runfleet.run_events WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_messages AS (
    DELETE FROM runfleet.run_messages WHERE run_id IN (SELECT id FROM doomed) RETURNING 1
),
del_edges AS (
    DELETE FROM runfleet.run_parents
     WHERE child_id IN (SELECT id FROM doomed) OR parent_id IN (SELECT id FROM doomed)
    RETURNING 1
),
del_runs AS (
    DELETE FROM runfleet.runs WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT key_ms FROM last_key) AS last_ms,
       (SELECT id FROM last_key) AS last_id,
       (SELECT count(*) FROM del_runs) AS runs,
       (SELECT count(*) FROM del_journal) AS journal,
       (SELECT count(*) FROM del_steps) AS steps,
       (SELECT count(*) FROM del_attempts) AS attempts,
       (SELECT count(*) FROM del_deferreds) AS deferreds,
       (SELECT count(*) FROM del_clocks) AS clocks,
       (SELECT count(*) FROM del_edges) AS edges;

-- name: cutoff
-- The cutoff in database time: runs settled before it may go.
SELECT runfleet.now_ms() - %(older_than_ms)s AS before_ms, runfleet.now_ms() AS now_ms;

-- name: take_lease
-- One pruner per fleet at a time: the retention row of runfleet.sweep_leases (migration
-- 0031) held as a timed lease, since a pass commits batch by batch and no transaction
-- spans it. Taken when nobody holds it, when its holder is the caller (a renewal), or
-- when its lease expired (a holder that died mid-pass). Only the worker role and the
-- owner may write that table: no producer or operator login can hold retention off, as
-- any login could with the advisory lock this replaced. It never waits on the row: a
-- taker committing meanwhile is the winner (SKIP LOCKED).
UPDATE runfleet.sweep_leases AS l
   SET holder = %(holder)s, held_until_ms = runfleet.now_ms() + %(lease_ms)s
  FROM (SELECT kind FROM runfleet.sweep_leases WHERE name = 'retention'
           FOR UPDATE SKIP LOCKED) AS free
 WHERE l.kind = free.kind
   AND (l.holder IS NULL OR l.holder = %(holder)s OR l.held_until_ms < runfleet.now_ms())
RETURNING l.kind;

-- name: drop_lease
UPDATE runfleet.sweep_leases SET holder = NULL, held_until_ms = NULL
 WHERE name = 'retention' AND holder = %(holder)s;

-- name: run_keyed_tables
-- Every runfleet table with a column that names a run; retention must know them all.
SELECT DISTINCT c.table_name FROM information_schema.columns c
 WHERE c.table_schema = 'runfleet'
   AND c.column_name IN ('run_id', 'child_id', 'parent_id')
 ORDER BY 1;

-- name: known_queues
-- Queues some worker registered a flow on: where dead stream consumers may linger.
SELECT DISTINCT queue FROM runfleet.flows ORDER BY queue;

-- name: prune_keys
-- Concurrency keys no open run needs (docs/how-to/queues.md "Concurrency keys"): up to %(limit)s
-- rows of runfleet.queue_keys strictly after the keyset cursor whose key has no pending,
-- running or suspended run (runs_open_key_idx) and whose per-key bucket, if any, is full
-- again (so a key that comes back starts fresh without a start more than its rate: a full
-- bucket and the front of the turn, as a new key). A row an admission holds (FOR KEY SHARE
-- until it commits: runs_key_seen) or a claim is updating is skipped, kept for the next pass.
WITH doomed AS (
    SELECT k.queue, k.key FROM runfleet.queue_keys k
      LEFT JOIN runfleet.queues q ON q.name = k.queue
     WHERE (k.queue, k.key) > (%(after_queue)s, %(after_key)s)
       AND NOT EXISTS (SELECT FROM runfleet.runs r
                        WHERE r.queue = k.queue AND r.concurrency_key = k.key
                          AND r.status IN ('pending', 'running', 'suspended'))
       AND (q.key_rate_per_s IS NULL OR k.rate_at_ms IS NULL
            OR runfleet.bucket_tokens(q.key_rate_per_s, k.rate_tokens, k.rate_at_ms,
                                      runfleet.now_ms()) >= greatest(q.key_rate_per_s, 1))
     ORDER BY k.queue, k.key LIMIT %(limit)s
       FOR UPDATE OF k SKIP LOCKED
), deleted AS (
    DELETE FROM runfleet.queue_keys k USING doomed d
     WHERE k.queue = d.queue AND k.key = d.key
    RETURNING k.queue, k.key
)
SELECT count(*) AS deleted,
       (SELECT d.queue FROM deleted d ORDER BY d.queue DESC, d.key DESC LIMIT 1) AS last_queue,
       (SELECT d.key FROM deleted d ORDER BY d.queue DESC, d.key DESC LIMIT 1) AS last_key
  FROM deleted;
