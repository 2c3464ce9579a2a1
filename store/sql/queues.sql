-- Per-queue settings (store/queues.py, docs/how-to/queues.md).

-- name: set
-- Upsert the settings named (a NULL leaves one as it is) and journal the change with the
-- authenticated role that made it (session_user, never a caller-chosen name), in one
-- statement: the settings and their history never disagree.
-- concurrency / rate_per_s: a positive limit, 0 to lift it (stored NULL), NULL to leave
-- it. A changed rate starts from a full bucket.
WITH upserted AS (
    INSERT INTO runfleet.queues AS q (name, default_priority, concurrency, rate_per_s,
                                      keyed, key_concurrency, key_rate_per_s,
                                      updated_at_ms, updated_by)
    VALUES (%(name)s, coalesce(%(default_priority)s::integer, 0),
            nullif(%(concurrency)s::integer, 0), nullif(%(rate_per_s)s::float8, 0),
            %(key_flow)s::text IS NOT NULL OR nullif(%(key_concurrency)s::integer, 0) IS NOT NULL
                OR nullif(%(key_rate_per_s)s::float8, 0) IS NOT NULL,
            nullif(%(key_concurrency)s::integer, 0), nullif(%(key_rate_per_s)s::float8, 0),
            runfleet.now_ms(), session_user::text)
    ON CONFLICT (name) DO UPDATE SET
        keyed = q.keyed OR excluded.keyed,
        key_concurrency = CASE WHEN %(key_concurrency)s::integer IS NULL THEN q.key_concurrency
                               ELSE nullif(%(key_concurrency)s::integer, 0) END,
        key_rate_per_s = CASE WHEN %(key_rate_per_s)s::float8 IS NULL THEN q.key_rate_per_s
                              ELSE nullif(%(key_rate_per_s)s::float8, 0) END,
        default_priority = coalesce(%(default_priority)s::integer, q.default_priority),
        concurrency = CASE WHEN %(concurrency)s::integer IS NULL THEN q.concurrency
                           ELSE nullif(%(concurrency)s::integer, 0) END,
        rate_per_s = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_per_s
                          ELSE nullif(%(rate_per_s)s::float8, 0) END,
        rate_tokens = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_tokens END,
        rate_at_ms = CASE WHEN %(rate_per_s)s::float8 IS NULL THEN q.rate_at_ms END,
        updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by
    RETURNING q.*
), keyed_flow AS (
    -- the flow's key expression (fleet-wide: its runs are keyed on whichever queue)
    INSERT INTO runfleet.flow_keys AS f (flow, expression, updated_at_ms, updated_by)
    SELECT %(key_flow)s::text, %(key_expression)s::text, u.updated_at_ms, u.updated_by
      FROM upserted u WHERE %(key_flow)s::text IS NOT NULL
    ON CONFLICT (flow) DO UPDATE SET expression = excluded.expression,
        updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by
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

-- name: changes_readable
-- Whether this role may read the queues' change history (fleet-wide operators, workers;
-- a scoped operator may not: who changed a limit, and why, is the fleet's).
SELECT has_table_privilege('runfleet.queue_changes', 'SELECT') AS readable;

-- name: running
-- How many runs of each named queue execute now (the slots in use of a limited one).
SELECT r.queue, count(*) AS running FROM runfleet.runs r
 WHERE r.status = 'running' AND r.queue = ANY(%(names)s::text[]) GROUP BY r.queue;

-- name: wait
-- How long until the queue's rate bucket holds a whole token, as the claim statement
-- would refill it now (0: a token is there; NULL: no rate); ``limited``: any limit at all.
SELECT CASE WHEN q.rate_per_s IS NULL THEN NULL
            ELSE greatest(0, ceil((1 - least(greatest(q.rate_per_s, 1),
                                             coalesce(q.rate_tokens, greatest(q.rate_per_s, 1))
                                             + greatest(runfleet.now_ms()
                                                        - coalesce(q.rate_at_ms, runfleet.now_ms()), 0)
                                               * q.rate_per_s / 1000.0))
                                  * 1000.0 / q.rate_per_s))::bigint END AS wait_ms,
       q.concurrency IS NOT NULL OR q.rate_per_s IS NOT NULL OR q.keyed AS limited
  FROM runfleet.queues q WHERE q.name = %(name)s;

-- name: flow_keys
-- The key expressions of flows (runfleet.flow_keys), by flow.
SELECT f.* FROM runfleet.flow_keys f ORDER BY f.flow;

-- name: keys
-- The keys of a queue in round-robin order (the next turn first) with their slots in use,
-- fresh admissions waiting, and when the key's rate next allows a start (0: a token is
-- there; NULL: no key rate).
SELECT k.key, k.last_start_ms,
       (SELECT count(*) FROM runfleet.runs r WHERE r.queue = k.queue
           AND r.concurrency_key = k.key AND r.status = 'running') AS running,
       (SELECT count(*) FROM runfleet.runs r WHERE r.queue = k.queue
           AND r.concurrency_key = k.key AND r.status = 'pending'
           AND r.waiting_reason IS NULL AND r.owner_host IS NULL
           AND r.claim_host IS NULL) AS waiting,
       CASE WHEN q.key_rate_per_s IS NULL THEN NULL
            ELSE greatest(0, ceil((1 - least(greatest(q.key_rate_per_s, 1),
                                             coalesce(k.rate_tokens, greatest(q.key_rate_per_s, 1))
                                             + greatest(runfleet.now_ms()
                                                        - coalesce(k.rate_at_ms, runfleet.now_ms()), 0)
                                               * q.key_rate_per_s / 1000.0))
                                  * 1000.0 / q.key_rate_per_s))::bigint END AS wait_ms
  FROM runfleet.queue_keys k JOIN runfleet.queues q ON q.name = k.queue
 WHERE k.queue = %(name)s AND (%(key)s::text IS NULL OR k.key = %(key)s)
 ORDER BY k.last_start_ms, k.key LIMIT %(limit)s;

-- name: bucket
-- How many whole tokens the queue's rate bucket holds now, as the claim statement would
-- refill it, and its rate (NULL: no rate): how many gated wakes the pump moves.
SELECT q.rate_per_s, CASE WHEN q.rate_per_s IS NULL THEN NULL
            ELSE floor(least(greatest(q.rate_per_s, 1),
                             coalesce(q.rate_tokens, greatest(q.rate_per_s, 1))
                             + greatest(runfleet.now_ms()
                                        - coalesce(q.rate_at_ms, runfleet.now_ms()), 0)
                               * q.rate_per_s / 1000.0))::integer END AS tokens
  FROM runfleet.queues q WHERE q.name = %(name)s;
