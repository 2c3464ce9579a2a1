-- runfleet schema: queues that shape load (docs/how-to/queues.md) — run priorities with aging,
-- a default priority per queue, and deduplication keys.
--
-- priority: higher starts first. A worker's claim statement lets a fresh pending run of
-- the same queue with a strictly higher priority take the slot a delivery offered, unless
-- the delivered run has out-aged it (store/sql/runs.sql claim_if_fresh). Aging is a fixed
-- rate: one priority point is worth one minute of waiting, so rank_ms (the admission time
-- minus a minute per point) orders runs of a queue by effective priority, FIFO within a
-- priority, and is a plain stored column an index can serve (no clock in the key).
ALTER TABLE runfleet.runs
    ADD COLUMN priority integer NOT NULL DEFAULT 0
        CHECK (priority BETWEEN -1000000 AND 1000000),
    ADD COLUMN dedup_key text CHECK (length(dedup_key) BETWEEN 1 AND 255),
    ADD COLUMN rank_ms bigint GENERATED ALWAYS AS (created_at_ms - priority::bigint * 60000) STORED;
-- No default from now on: an admission that names no priority gets its queue's
-- (runfleet.queue_default_priority below), rows before this migration keep 0.
ALTER TABLE runfleet.runs ALTER COLUMN priority DROP DEFAULT;

-- The fresh admissions of a queue by effective priority: the claim's look-ahead reads the
-- first entry above the delivered run's priority (one index probe; none when all are 0).
CREATE INDEX runs_ready_priority_idx ON runfleet.runs (queue, priority DESC, rank_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND owner_host IS NULL
      AND claim_host IS NULL;

-- dedup_key: at most one OPEN run (pending, running, suspended) per (queue, key). The
-- admission's ON CONFLICT DO NOTHING has no target, so this index is an arbiter too: a
-- second admission with an open key inserts nothing and its caller is answered with the
-- open run or refused (store/admit.py). A settled run frees its key.
CREATE UNIQUE INDEX runs_open_dedup_idx ON runfleet.runs (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'suspended');

-- Per-queue settings, changed live by `runfleet queue set` (store/queues.py), each change
-- stamped with the authenticated role that made it (session_user).
CREATE TABLE runfleet.queues (
    name              text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 255),
    default_priority  integer NOT NULL DEFAULT 0
                          CHECK (default_priority BETWEEN -1000000 AND 1000000),
    concurrency       integer CHECK (concurrency >= 1),  -- fleet-wide; NULL: unlimited
    rate_per_s        double precision CHECK (rate_per_s > 0),  -- starts/s fleet-wide; NULL: none
    rate_tokens       double precision,  -- the token bucket (capacity: one second's starts, >= 1)
    rate_at_ms        bigint,            -- when rate_tokens was last refilled
    updated_at_ms     bigint NOT NULL,
    updated_by        text NOT NULL
);
-- How many of ``p_want`` runs of the queue may start now (NULL: neither a concurrency
-- limit nor a rate), deciding for the calling claim statement under the queue row's lock,
-- held until that statement's transaction ends: claims on a limited queue serialize on it. The count is taken AFTER
-- the lock, in this function's own snapshot (a VOLATILE function's statements each see
-- what committed before them), so a claim that committed while this one waited for the
-- lock is counted. The running rows ARE the slots: a settled or parked run frees its slot
-- in the statement that moves it, a takeover keeps it (the row stays running), and a
-- SIGKILLed owner's run holds it until its takeover, so no slot can leak or double.
-- Every caller takes this lock before any run row lock (store/sql/runs.sql). A rate's
-- tokens are taken for the starts granted; a grant whose claim then loses a race wastes
-- its token, so the bucket errs slow, never fast.
CREATE FUNCTION runfleet.queue_free_slots(p_queue text, p_want integer DEFAULT 1)
    RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_limit integer;
    v_rate double precision;
    v_tokens double precision;
    v_at bigint;
    v_now bigint;
    v_free integer := greatest(p_want, 0);
    v_running integer;
BEGIN
    SELECT q.concurrency, q.rate_per_s INTO v_limit, v_rate
      FROM runfleet.queues q WHERE q.name = p_queue;
    IF v_limit IS NULL AND v_rate IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT q.concurrency, q.rate_per_s, q.rate_tokens, q.rate_at_ms
      INTO v_limit, v_rate, v_tokens, v_at
      FROM runfleet.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_limit IS NULL AND v_rate IS NULL THEN  -- lifted while this claim waited for the lock
        RETURN NULL;
    END IF;
    IF v_limit IS NOT NULL THEN
        SELECT count(*) INTO v_running FROM runfleet.runs r
         WHERE r.queue = p_queue AND r.status = 'running';
        v_free := least(v_free, greatest(v_limit - v_running, 0));
    END IF;
    IF v_rate IS NOT NULL THEN
        -- The token bucket: refilled at v_rate per second up to one second's starts (at
        -- least one), and the starts granted here taken from it under the same lock.
        v_now := runfleet.now_ms();
        v_tokens := least(greatest(v_rate, 1),
                          coalesce(v_tokens, greatest(v_rate, 1))
                          + greatest(v_now - coalesce(v_at, v_now), 0) * v_rate / 1000.0);
        v_free := least(v_free, floor(v_tokens)::integer);
        UPDATE runfleet.queues SET rate_tokens = v_tokens - v_free, rate_at_ms = v_now
         WHERE name = p_queue;
    END IF;
    RETURN v_free;
END
$$;
CREATE INDEX runs_running_queue_idx ON runfleet.runs (queue) WHERE status = 'running';

-- Every change of a queue's settings, with who made it (append-only, like the journal).
CREATE TABLE runfleet.queue_changes (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text NOT NULL,
    change     jsonb NOT NULL,
    note       text,
    changed_by text NOT NULL,
    at_ms      bigint NOT NULL
);
CREATE INDEX queue_changes_queue_idx ON runfleet.queue_changes (queue, seq);

-- The queue's default priority for an admission that names none. SECURITY DEFINER so a
-- producer needs no privilege on runfleet.queues; it reads one row by primary key.
CREATE FUNCTION runfleet.queue_default_priority() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    NEW.priority := coalesce(
        (SELECT q.default_priority FROM runfleet.queues q WHERE q.name = NEW.queue), 0);
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_default_priority BEFORE INSERT ON runfleet.runs
    FOR EACH ROW WHEN (NEW.priority IS NULL)
    EXECUTE FUNCTION runfleet.queue_default_priority();
