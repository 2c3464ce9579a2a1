-- runfleet schema v16: the workflow lifecycle — events a flow publishes and messages sent
-- to a run (docs/explanation/lifecycle.md).

-- Events a flow publishes (ctx.set_event): one row per (run, key), the latest value wins.
-- Written only by the run's owner, in the transaction that records the set_event call
-- (store/events.py), so a replay never writes an older value over a newer one.
CREATE TABLE runfleet.run_events (
    run_id          text NOT NULL,
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    value           json NOT NULL,
    digest          text NOT NULL,
    version         integer NOT NULL CHECK (version >= 1),
    set_at_ms       bigint NOT NULL,
    PRIMARY KEY (run_id, key)
);

-- Messages sent to a run (send / ctx.recv): kept in the order they were sent (seq), each
-- consumed once, by the recv whose step record is written in the same transaction.
-- message_id (the sender's idempotency key) makes a retried send a no-op.
CREATE TABLE runfleet.run_messages (
    run_id          text NOT NULL,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    topic           text NOT NULL CHECK (length(topic) BETWEEN 1 AND 255),
    message_id      text CHECK (length(message_id) BETWEEN 1 AND 255),
    value           json NOT NULL,
    digest          text NOT NULL,
    sent_at_ms      bigint NOT NULL,
    consumed_key    text,
    consumed_at_ms  bigint,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, message_id)
);
CREATE INDEX run_messages_pending ON runfleet.run_messages (run_id, topic, seq)
    WHERE consumed_at_ms IS NULL;

ALTER TABLE runfleet.run_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_events_fleet ON runfleet.run_events TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_events_scoped ON runfleet.run_events TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_events.run_id));

ALTER TABLE runfleet.run_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_messages_fleet ON runfleet.run_messages TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_messages_scoped ON runfleet.run_messages TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_messages.run_id));
-- A producer's message is held to the payload cap through any client (as 0013's are),
-- and is never written as already consumed.
CREATE POLICY run_messages_producer_sends ON runfleet.run_messages AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (consumed_key IS NULL AND consumed_at_ms IS NULL
                AND octet_length(value::text) <= coalesce(
                    (SELECT l.value FROM runfleet.limits l WHERE l.name = 'max_payload_bytes'),
                    0));
