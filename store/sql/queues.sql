-- Per-queue settings (store/queues.py, docs/queues.md).

-- name: set
-- Upsert the settings named (a NULL leaves one as it is) and journal the change with the
-- authenticated role that made it (session_user, never a caller-chosen name), in one
-- statement: the settings and their history never disagree.
WITH upserted AS (
    INSERT INTO runfleet.queues AS q (name, default_priority, updated_at_ms, updated_by)
    VALUES (%(name)s, coalesce(%(default_priority)s::integer, 0), runfleet.now_ms(),
            session_user::text)
    ON CONFLICT (name) DO UPDATE SET
        default_priority = coalesce(%(default_priority)s::integer, q.default_priority),
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
