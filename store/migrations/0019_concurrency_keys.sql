-- runfleet schema: concurrency keys (docs/how-to/queues.md "Concurrency keys") — fairness across
-- the tenants of a queue: at most K runs per key executing at once, per-key rate limits,
-- and free slots shared round-robin across keys, all decided in the claim statement.
--
-- A run's key is computed by the database at admission from its flow's key expression
-- (runfleet.flow_keys: a payload field or the run's tenant scope), so every producer,
-- raw SQL included, keys its runs the same way, and no admission code carries it.
ALTER TABLE runfleet.runs
    ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 255);

-- Per-queue key limits, set by `runfleet queue set Q --key-concurrency K --key-rate R/s`.
-- keyed: the queue shares its slots across keys (a `--key FLOW=EXPR` named it); its
-- claims take the queue row's lock even without a queue-wide limit.
ALTER TABLE runfleet.queues
    ADD COLUMN keyed boolean NOT NULL DEFAULT false,
    ADD COLUMN key_concurrency integer CHECK (key_concurrency >= 1),  -- per key; NULL: none
    ADD COLUMN key_rate_per_s double precision CHECK (key_rate_per_s > 0);  -- per key

-- A flow's key expression: 'scope' (the run's first scope, its tenant), 'kwargs.NAME' or
-- 'args.N' (a field of the payload). Fleet bookkeeping written by `runfleet queue set`.
CREATE TABLE runfleet.flow_keys (
    flow          text PRIMARY KEY CHECK (length(flow) BETWEEN 1 AND 255),
    expression    text NOT NULL CHECK (expression = 'scope'
                                       OR expression ~ '^kwargs\.[A-Za-z_][A-Za-z0-9_]{0,99}$'
                                       OR expression ~ '^args\.[0-9]{1,3}$'),
    updated_at_ms bigint NOT NULL,
    updated_by    text NOT NULL
);

-- The keys of a keyed queue: the round-robin order (the key whose last start is oldest
-- goes first) and each key's token bucket. A row is made when a run with the key is
-- admitted (runs_key_seen below) and kept: an idle key is moved to the back of the order
-- when a claim finds it has nothing to start.
CREATE TABLE runfleet.queue_keys (
    queue          text NOT NULL,
    key            text NOT NULL,
    last_start_ms  bigint NOT NULL DEFAULT 0,
    rate_tokens    double precision,
    rate_at_ms     bigint,
    PRIMARY KEY (queue, key)
);
CREATE INDEX queue_keys_order_idx ON runfleet.queue_keys (queue, last_start_ms, key);

-- A key is a value of its runs' payload or scope (a tenant's name): only a fleet-wide
-- role ('*') reads the keys; workers read them all (their claims decide by them).
ALTER TABLE runfleet.queue_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_keys_fleet ON runfleet.queue_keys TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY queue_keys_scoped ON runfleet.queue_keys FOR SELECT
    TO runfleet_producer, runfleet_operator
    USING ((SELECT runfleet.granted_scopes()) ? '*');

-- A key's executing runs (its slots) and its fresh admissions in FIFO order.
CREATE INDEX runs_running_key_idx ON runfleet.runs (queue, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX runs_ready_key_idx ON runfleet.runs (queue, concurrency_key, rank_ms, id)
    WHERE status = 'pending' AND waiting_reason IS NULL AND owner_host IS NULL
      AND claim_host IS NULL AND concurrency_key IS NOT NULL;

-- The key of an admission: its flow's expression, evaluated on the row. SECURITY DEFINER
-- so a producer needs no privilege on flow_keys; one primary-key probe per row.
CREATE FUNCTION runfleet.run_concurrency_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_expr text;
    v_key text;
BEGIN
    SELECT f.expression INTO v_expr FROM runfleet.flow_keys f WHERE f.flow = NEW.flow;
    IF v_expr IS NULL THEN
        RETURN NEW;
    ELSIF v_expr = 'scope' THEN
        v_key := NEW.state -> 'scopes' ->> 0;
    ELSIF v_expr LIKE 'kwargs.%' THEN
        v_key := NEW.payload::jsonb -> 'kwargs' ->> substr(v_expr, 8);
    ELSE
        v_key := NEW.payload::jsonb -> 'args' ->> substr(v_expr, 6)::integer;
    END IF;
    NEW.concurrency_key := left(nullif(v_key, ''), 255);
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_concurrency_key BEFORE INSERT ON runfleet.runs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NULL)
    EXECUTE FUNCTION runfleet.run_concurrency_key();

-- Every admitted key gets its queue_keys row (one statement per admission batch).
CREATE FUNCTION runfleet.runs_key_seen() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    INSERT INTO runfleet.queue_keys (queue, key)
    SELECT DISTINCT n.queue, n.concurrency_key FROM admitted n
     WHERE n.concurrency_key IS NOT NULL
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_key_seen AFTER INSERT ON runfleet.runs
    REFERENCING NEW TABLE AS admitted FOR EACH STATEMENT
    EXECUTE FUNCTION runfleet.runs_key_seen();

-- queue_free_slots (0015), now also NOT NULL for a keyed queue: its claims take the queue
-- row's lock (runfleet.key_pick decides under it) and count as limited, so a worker
-- ending one of its executions opens its gate.
CREATE OR REPLACE FUNCTION runfleet.queue_free_slots(p_queue text, p_want integer DEFAULT 1)
    RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_limit integer;
    v_rate double precision;
    v_keyed boolean;
    v_tokens double precision;
    v_at bigint;
    v_now bigint;
    v_free integer := greatest(p_want, 0);
    v_running integer;
BEGIN
    SELECT q.concurrency, q.rate_per_s, q.keyed INTO v_limit, v_rate, v_keyed
      FROM runfleet.queues q WHERE q.name = p_queue;
    IF v_limit IS NULL AND v_rate IS NULL AND NOT coalesce(v_keyed, false) THEN
        RETURN NULL;
    END IF;
    SELECT q.concurrency, q.rate_per_s, q.keyed, q.rate_tokens, q.rate_at_ms
      INTO v_limit, v_rate, v_keyed, v_tokens, v_at
      FROM runfleet.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_limit IS NULL AND v_rate IS NULL AND NOT v_keyed THEN  -- lifted meanwhile
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

-- Which run starts in the slot a claim of ``p_id`` was granted (queue_free_slots granted
-- it one start; NULL: none may, and that start's queue token is given back). A run with
-- no key, or on a queue that is not keyed, is itself the answer. Otherwise, under the
-- queue row's lock (taken again here: the same transaction already holds it), the keys
-- of the queue are visited in round-robin order (oldest last start first, at most 64):
-- the first key below its concurrency (K running) with a token of its rate and a fresh
-- admission of a flow in ``p_flows`` starts its oldest one (the named run, if its key is
-- that key); a key with nothing fresh at all goes to the back. ``p_flows`` NULL: only
-- the named run may start (a path that cannot run another flow). The picked key's turn
-- and token are taken here, in the claim's transaction: a claim that then loses its
-- race wastes them (slow, never fast).
CREATE FUNCTION runfleet.key_pick(p_id text, p_flows text[])
    RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_queue text;
    v_key text;
    v_keyed boolean;
    v_k integer;
    v_rate double precision;
    v_qrate double precision;
    v_now bigint := runfleet.now_ms();
    v_cand record;
    v_run text;
    v_running integer;
    v_tokens double precision;
BEGIN
    SELECT r.queue, r.concurrency_key INTO v_queue, v_key FROM runfleet.runs r WHERE r.id = p_id;
    IF v_key IS NULL THEN
        RETURN p_id;
    END IF;
    SELECT q.keyed, q.key_concurrency, q.key_rate_per_s, q.rate_per_s
      INTO v_keyed, v_k, v_rate, v_qrate
      FROM runfleet.queues q WHERE q.name = v_queue FOR UPDATE;
    IF NOT coalesce(v_keyed, false) THEN
        RETURN p_id;
    END IF;
    FOR v_cand IN
        SELECT k.key, k.rate_tokens, k.rate_at_ms FROM runfleet.queue_keys k
         WHERE k.queue = v_queue AND (p_flows IS NOT NULL OR k.key = v_key)
         ORDER BY k.last_start_ms, k.key LIMIT 64
    LOOP
        IF v_k IS NOT NULL THEN
            SELECT count(*) INTO v_running FROM runfleet.runs r
             WHERE r.queue = v_queue AND r.concurrency_key = v_cand.key AND r.status = 'running';
            CONTINUE WHEN v_running >= v_k;
        END IF;
        IF v_rate IS NOT NULL THEN
            v_tokens := least(greatest(v_rate, 1),
                              coalesce(v_cand.rate_tokens, greatest(v_rate, 1))
                              + greatest(v_now - coalesce(v_cand.rate_at_ms, v_now), 0)
                                * v_rate / 1000.0);
            CONTINUE WHEN v_tokens < 1;
        END IF;
        IF v_cand.key = v_key THEN
            v_run := p_id;
        ELSE
            SELECT c.id INTO v_run FROM runfleet.runs c
             WHERE c.queue = v_queue AND c.concurrency_key = v_cand.key
               AND c.status = 'pending' AND c.waiting_reason IS NULL AND c.owner_host IS NULL
               AND c.claim_host IS NULL AND c.heartbeat_at_ms IS NULL
               AND c.cancel_requested_at_ms IS NULL AND c.flow = ANY(p_flows)
             ORDER BY c.rank_ms, c.id LIMIT 1 FOR UPDATE SKIP LOCKED;
            IF v_run IS NULL THEN
                IF NOT EXISTS (SELECT FROM runfleet.runs c
                                WHERE c.queue = v_queue AND c.concurrency_key = v_cand.key
                                  AND c.status = 'pending' AND c.waiting_reason IS NULL
                                  AND c.owner_host IS NULL AND c.claim_host IS NULL) THEN
                    UPDATE runfleet.queue_keys SET last_start_ms = v_now  -- idle: to the back
                     WHERE queue = v_queue AND key = v_cand.key;
                END IF;
                CONTINUE;
            END IF;
        END IF;
        UPDATE runfleet.queue_keys SET last_start_ms = v_now,
               rate_tokens = CASE WHEN v_rate IS NOT NULL THEN v_tokens - 1 END,
               rate_at_ms = CASE WHEN v_rate IS NOT NULL THEN v_now END
         WHERE queue = v_queue AND key = v_cand.key;
        RETURN v_run;
    END LOOP;
    IF v_qrate IS NOT NULL THEN  -- the queue's token granted for this start, unused
        UPDATE runfleet.queues SET rate_tokens = least(greatest(rate_per_s, 1), rate_tokens + 1)
         WHERE name = v_queue;
    END IF;
    RETURN NULL;
END
$$;

-- claim_and_activate and activate (one named run, no look-ahead): a slot of the queue,
-- then of the run's key, in that order (store/sql/runs.sql).
CREATE FUNCTION runfleet.start_grant(p_id text)
    RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_queue text;
BEGIN
    SELECT r.queue INTO v_queue FROM runfleet.runs r WHERE r.id = p_id;
    IF coalesce(runfleet.queue_free_slots(v_queue), 1) <= 0 THEN
        RETURN false;
    END IF;
    RETURN runfleet.key_pick(p_id, NULL) IS NOT NULL;
END
$$;
