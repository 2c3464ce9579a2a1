-- Events a flow publishes and messages sent to a run (store/events.py, migration 0015).

-- name: event_upsert
-- The latest value wins: a set_event call that is recorded writes over the one before.
-- value is canonical JSON text (store/values.py), kept verbatim; digested as stored.
INSERT INTO runfleet.run_events AS e (run_id, key, value, digest, version, set_at_ms)
VALUES (%(run_id)s, %(key)s, %(value)s::json, runfleet.value_digest(%(value)s::json), 1,
        runfleet.now_ms())
ON CONFLICT (run_id, key) DO UPDATE
   SET value = excluded.value, digest = excluded.digest, version = e.version + 1,
       set_at_ms = excluded.set_at_ms
RETURNING run_id, key, value::text AS value_text, digest, version, set_at_ms;

-- name: event_get
-- The event as it stands, with its run's status (a settled run sets nothing more).
SELECT r.status, e.key, e.value::text AS value_text, e.digest, e.version, e.set_at_ms
  FROM runfleet.runs r
  LEFT JOIN runfleet.run_events e ON e.run_id = r.id AND e.key = %(key)s
 WHERE r.id = %(run_id)s;

-- name: events_of_run
SELECT run_id, key, value::text AS value_text, digest, version, set_at_ms
  FROM runfleet.run_events WHERE run_id = %(run_id)s ORDER BY key;

-- name: message_insert
-- A retried send (same message_id) writes nothing and answers nothing.
INSERT INTO runfleet.run_messages (run_id, topic, message_id, value, digest, sent_at_ms)
VALUES (%(run_id)s, %(topic)s, %(message_id)s, %(value)s::json,
        runfleet.value_digest(%(value)s::json), runfleet.now_ms())
ON CONFLICT (run_id, message_id) DO NOTHING
RETURNING seq, digest;

-- name: message_by_id
SELECT seq, digest FROM runfleet.run_messages
 WHERE run_id = %(run_id)s AND message_id = %(message_id)s;

-- name: wake_receiver
-- The run parked in a recv on this topic: clear the wait so a claim can resume it.
UPDATE runfleet.runs AS r SET
    waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
    waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(run_id)s AND r.status = 'suspended' AND r.waiting_reason = 'event'
   AND r.waiting_token = %(token)s
RETURNING r.id;

-- name: message_next
-- The oldest message on the topic nobody consumed; the caller holds the run's row lock,
-- so two receives of one run never take the same message.
SELECT seq, value::text AS value_text, digest FROM runfleet.run_messages
 WHERE run_id = %(run_id)s AND topic = %(topic)s AND consumed_at_ms IS NULL
 ORDER BY seq LIMIT 1;

-- name: message_consume
UPDATE runfleet.run_messages SET consumed_key = %(key)s, consumed_at_ms = runfleet.now_ms()
 WHERE run_id = %(run_id)s AND seq = %(seq)s AND consumed_at_ms IS NULL
RETURNING seq;

-- name: messages_of_run
SELECT seq, topic, message_id, digest, sent_at_ms, consumed_key, consumed_at_ms
  FROM runfleet.run_messages WHERE run_id = %(run_id)s ORDER BY seq;
