-- The journal: append-only decisions, addressed by (source_id, source_seq).

-- name: append
INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
VALUES (%(run_id)s, %(kind)s, %(source_id)s, %(source_seq)s, %(payload)s, %(digest)s,
        runfleet.now_ms())
ON CONFLICT (source_id, source_seq) DO NOTHING
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
SELECT seq, digest, payload FROM runfleet.journal
 WHERE source_id = %(source_id)s AND source_seq = %(source_seq)s;

-- name: records
SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
 WHERE run_id = %(run_id)s AND seq > %(after_seq)s ORDER BY seq LIMIT %(limit)s;

-- name: last_records
SELECT * FROM (
    SELECT seq, run_id, kind, source_id, source_seq, payload, at_ms FROM runfleet.journal
     WHERE run_id = %(run_id)s ORDER BY seq DESC LIMIT %(limit)s) AS last
 ORDER BY seq;
