-- Per-queue settings (store/queues.py, docs/queues.md).

-- name: set
-- Upsert the settings named (a NULL leaves one as it is) and journal the change with the
-- authenticated role that made it (session_user, never a caller-chosen name), in one
-- statement: the settings and their history never disagree.
-- concurrency / rate_per_s: a positive limit, 0 to lift it (stored NULL), NULL to leave
-- it. A changed rate starts from a full bucket.
WITH upserted AS (
    INSERT INTO runfleet.queues AS q (name, default_priority, concurrency, rate_per_s,
                                      updated_at_ms, updated_by)
    VALUES (%(name)s, coalesce(%(default_priority)s::integer, 0),
            nullif(%(concurrency)s::integer, 0), nullif(%(rate_per_s)s::float8, 0),
            runfleet.now_ms(), session_user::text)
    ON CONFLICT (name) DO UPDATE SET
        default_priority = coalesce(%(default_priority)s::integer, q.default_priority),
        concurrency = CASE WHEN %(concurrency)s::integer IS NULL THEN q.concurrency
                           ELSE nullif(%(concurrency)s::integer, 0) END,
        rate_per_s = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_per_s
                          ELSE nullif(%(rate_per_s)s::float8, 0) END,
        rate_tokens = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_tokens END,
        rate_at_ms = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_at_ms END,
        updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by
    RETURNING q.*
), changed AS (
    INSERT INTO runfleet.queue_changes (queue, change, note, changed_by, at_ms)
    SELECT u.name, %(change)s::jsonb, %(note)s, u.updated_by, u.updated_at_ms FROM upserted u
)
SELECT * FROM upserted;

-- name: get
SELECT q.* FROM runfleet.queues q WHERE q.name = %(name)s;

-- name: all
SELECT q.* FROM runfleet.queues q ORDER BY q.name;

-- name: changes
SELECT c.* FROM runfleet.queue_changes c WHERE c.queue = %(name)s ORDER BY c.seq DESC
 LIMIT %(limit)s;

-- name: running
-- How many runs of each named queue execute now (the slots in use of a limited one).
SELECT r.queue, count(*) AS running FROM runfleet.runs r
 WHERE r.status = 'running' AND r.queue = ANY(%(names)s::text[]) GROUP BY r.queue;

-- name: wait
-- How long until the queue's rate bucket holds a whole token, as the claim statement
-- would refill it now (0: a token is there; NULL: no rate).
SELECT CASE WHEN q.rate_per_s IS NULL THEN NULL
            ELSE greatest(0, ceil((1 - least(greatest(q.rate_per_s, 1),
                                             coalesce(q.rate_tokens, greatest(q.rate_per_s, 1))
                                             + greatest(runfleet.now_ms()
                                                        - coalesce(q.rate_at_ms, runfleet.now_ms()), 0)
                                               * q.rate_per_s / 1000.0))
                                  * 1000.0 / q.rate_per_s))::bigint END AS wait_ms
  FROM runfleet.queues q WHERE q.name = %(name)s;
