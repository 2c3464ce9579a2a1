-- The journal: append-only decisions, addressed by (source_id, source_seq) of their
-- writer: the database fills in `writer` (the authenticated role) and `seq` (an identity),
-- so no writer can take another's addresses or choose where a record sorts (0013).

-- name: append
-- One record or a batch, from parallel arrays; a record whose address is taken is
-- not inserted and not returned (the caller decides whether that is an error).
INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
SELECT b.run_id, b.kind, b.source_id, b.source_seq, b.payload, b.digest, runfleet.now_ms()
  FROM unnest(%(run_id)s::text[], %(kind)s::text[], %(source_id)s::text[],
              %(source_seq)s::bigint[], %(payload)s::jsonb[], %(digest)s::text[])
       WITH ORDINALITY AS b(run_id, kind, source_id, source_seq, payload, digest, n)
 ORDER BY b.n
ON CONFLICT (source_id, source_seq, writer) DO NOTHING
RETURNING seq;

-- name: append_owned
-- Fenced: the record lands only while the writer still owns the run at its epoch.
INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
SELECT %(run_id)s, %(kind)s, %(source_id)s, %(source_seq)s, %(payload)s, %(digest)s,
       runfleet.now_ms()
  FROM runfleet.runs r
 WHERE r.id = %(run_id)s AND r.status = 'running' AND r.owner_host = %(host)s
   AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s AND r.epoch = %(epoch)s
RETURNING seq;

-- name: at_address
-- This writer's record at the address (another role's at the same address is not ours).
SELECT seq, digest, payload FROM runfleet.journal
 WHERE source_id = %(source_id)s AND source_seq = %(source_seq)s
   AND writer = quote_ident(session_user)::regrole;

-- name: records
SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
 WHERE run_id = %(run_id)s AND seq > %(after_seq)s ORDER BY seq LIMIT %(limit)s;

-- name: last_records
SELECT * FROM (
    SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
     WHERE run_id = %(run_id)s ORDER BY seq DESC LIMIT %(limit)s) AS last
 ORDER BY seq;

-- name: last_of_kinds
-- The run's newest record of one of ``kinds`` (journal_run_idx, newest first), however
-- many records the run has.
SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
 WHERE run_id = %(run_id)s AND kind = ANY(%(kinds)s::text[]) ORDER BY seq DESC LIMIT 1;
