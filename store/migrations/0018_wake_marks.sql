-- runfleet schema: a lost wake is one no reader will still deliver, not an old one.
-- Per queue, the Postgres time before which every admission's stream message has been
-- delivered or destroyed (docs/backlog.md has the argument). Workers advance it from
-- what they read of their queues' streams; the lost-pending sweep reads it. No write on
-- the admission path: the row's admission time is compared with the mark.

CREATE TABLE runfleet.wake_marks (
    queue                text PRIMARY KEY,
    delivered_through_ms bigint NOT NULL,
    updated_at_ms        bigint NOT NULL
);
