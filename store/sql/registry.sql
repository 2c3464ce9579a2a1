-- The flow registry (store/registry.py): flows workers registered at start, by name.

-- name: register
-- A starting worker's flow: inserted, or its queue, signature and last sighting refreshed.
INSERT INTO runfleet.flows (name, queue, signature, registered_at_ms, last_seen_ms)
VALUES (%(name)s, %(queue)s, %(signature)s, runfleet.now_ms(), runfleet.now_ms())
ON CONFLICT (name) DO UPDATE SET queue = excluded.queue, signature = excluded.signature,
    last_seen_ms = excluded.last_seen_ms;

-- name: get
SELECT name, queue, signature, registered_at_ms, last_seen_ms FROM runfleet.flows
 WHERE name = %(name)s;
