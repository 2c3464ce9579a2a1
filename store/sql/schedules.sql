-- Periodic schedules (store/schedules.py). A schedule row is the fleet's only memory of
-- which tick comes next: firing a tick admits its run(s) and moves next_tick_ms forward in
-- ONE transaction, under the row's lock and compared-and-set on the old next_tick_ms, so
-- two schedulers never both admit a tick; the run id derived from the tick makes even a
-- repeated admission join the first. Times are database time (runfleet.now_ms()).

-- name: insert
-- A new schedule (CLI `schedule add`); nothing when the name is taken.
INSERT INTO runfleet.schedules
       (name, flow, queue, cron, timezone, payload, scopes, catch_up, overlap, timeout_ms,
        max_rounds, origin, paused, next_tick_ms, created_at_ms, updated_at_ms)
VALUES (%(name)s, %(flow)s, %(queue)s, %(cron)s, %(timezone)s, %(payload)s, %(scopes)s,
        %(catch_up)s, %(overlap)s, %(timeout_ms)s, %(max_rounds)s, %(origin)s, false,
        %(next_tick_ms)s, runfleet.now_ms(), runfleet.now_ms())
ON CONFLICT (name) DO NOTHING
RETURNING *, runfleet.now_ms() AS now_ms;

-- name: upsert
-- A decorated flow's schedule, written by every worker at start. An unchanged definition
-- writes nothing (its next tick, counters and pause stay); a changed cron or time zone
-- restarts the cadence from the next_tick_ms the caller computed; other changes (payload,
-- queue, policies) keep the cadence. A pause set by an operator survives restarts.
INSERT INTO runfleet.schedules AS s
       (name, flow, queue, cron, timezone, payload, scopes, catch_up, overlap, timeout_ms,
        max_rounds, origin, paused, next_tick_ms, created_at_ms, updated_at_ms)
VALUES (%(name)s, %(flow)s, %(queue)s, %(cron)s, %(timezone)s, %(payload)s, %(scopes)s,
        %(catch_up)s, %(overlap)s, %(timeout_ms)s, %(max_rounds)s, %(origin)s, false,
        %(next_tick_ms)s, runfleet.now_ms(), runfleet.now_ms())
ON CONFLICT (name) DO UPDATE
   SET flow = EXCLUDED.flow, queue = EXCLUDED.queue, cron = EXCLUDED.cron,
       timezone = EXCLUDED.timezone, payload = EXCLUDED.payload, scopes = EXCLUDED.scopes,
       catch_up = EXCLUDED.catch_up, overlap = EXCLUDED.overlap,
       timeout_ms = EXCLUDED.timeout_ms, max_rounds = EXCLUDED.max_rounds,
       origin = EXCLUDED.origin,
       next_tick_ms = CASE WHEN (s.cron, s.timezone) = (EXCLUDED.cron, EXCLUDED.timezone)
                           THEN s.next_tick_ms ELSE EXCLUDED.next_tick_ms END,
       updated_at_ms = runfleet.now_ms()
 WHERE (s.flow, s.queue, s.cron, s.timezone, s.payload::text, s.scopes, s.catch_up,
        s.overlap, s.timeout_ms, s.max_rounds, s.origin)
       IS DISTINCT FROM
       (EXCLUDED.flow, EXCLUDED.queue, EXCLUDED.cron, EXCLUDED.timezone,
        EXCLUDED.payload::text, EXCLUDED.scopes, EXCLUDED.catch_up, EXCLUDED.overlap,
        EXCLUDED.timeout_ms, EXCLUDED.max_rounds, EXCLUDED.origin)
RETURNING *, runfleet.now_ms() AS now_ms;

-- name: due
-- Names of unpaused schedules whose next tick has come, most overdue first
-- (schedules_due_idx). No lock here: each is locked by `lock_due` as it fires.
SELECT name FROM runfleet.schedules
 WHERE NOT paused AND next_tick_ms <= (SELECT runfleet.now_ms())
 ORDER BY next_tick_ms, name
 LIMIT %(limit)s;

-- name: lock_due
-- One due schedule, locked until the firing transaction ends; none if another scheduler
-- holds it or fired it since `due` listed it.
SELECT s.*, runfleet.now_ms() AS now_ms FROM runfleet.schedules s
 WHERE s.name = %(name)s AND NOT s.paused AND s.next_tick_ms <= runfleet.now_ms()
   FOR UPDATE SKIP LOCKED;

-- name: advance
-- The compare-and-set that makes a tick fired: only from the next_tick_ms the firing read.
UPDATE runfleet.schedules
   SET next_tick_ms = %(next_tick_ms)s,
       last_tick_ms = coalesce(%(last_tick_ms)s, last_tick_ms),
       last_run_id = coalesce(%(last_run_id)s, last_run_id),
       admitted = admitted + %(admitted)s,
       missed = missed + %(missed)s,
       overlapped = overlapped + %(overlapped)s,
       updated_at_ms = runfleet.now_ms()
 WHERE name = %(name)s AND next_tick_ms = %(expected_tick_ms)s AND NOT paused
RETURNING *, runfleet.now_ms() AS now_ms;

-- name: get
SELECT s.*, runfleet.now_ms() AS now_ms FROM runfleet.schedules s WHERE s.name = %(name)s;

-- name: get_for_update
SELECT s.*, runfleet.now_ms() AS now_ms FROM runfleet.schedules s
 WHERE s.name = %(name)s FOR UPDATE;

-- name: list
SELECT s.*, runfleet.now_ms() AS now_ms FROM runfleet.schedules s ORDER BY s.name;

-- name: pause
UPDATE runfleet.schedules SET paused = true, updated_at_ms = runfleet.now_ms()
 WHERE name = %(name)s
RETURNING *, runfleet.now_ms() AS now_ms;

-- name: resume
-- Ticks that fell due while paused were paused, not missed: the cadence restarts at the
-- first tick after now (computed by the caller under the row lock).
UPDATE runfleet.schedules
   SET paused = false, next_tick_ms = %(next_tick_ms)s, updated_at_ms = runfleet.now_ms()
 WHERE name = %(name)s AND paused
RETURNING *, runfleet.now_ms() AS now_ms;

-- name: remove
DELETE FROM runfleet.schedules WHERE name = %(name)s RETURNING name;
