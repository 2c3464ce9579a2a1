-- runfleet schema: a keyed queue's turns for a whole claim batch (docs/how-to/queues.md
-- "Concurrency keys"). The batch claim now takes keyed runs, so a stream read of n keyed
-- runs is one claim statement, not n; the turn rule (K per key, round-robin across keys,
-- per-key rates, priority within a key) is runfleet.key_pick_many, and the single claims'
-- runfleet.key_pick is that function for one run. Keys are visited only while they have a
-- free slot and a token, so keys at their limit no longer use up the visits.

-- A token bucket's tokens at ``p_now``: refilled at ``p_rate`` per second up to one
-- second's starts (at least one); a bucket never drawn from is full.
CREATE FUNCTION runfleet.bucket_tokens(p_rate double precision, p_tokens double precision,
                                       p_at bigint, p_now bigint)
    RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$
    SELECT least(greatest(p_rate, 1),
                 coalesce(p_tokens, greatest(p_rate, 1))
                 + greatest(p_now - coalesce(p_at, p_now), 0) * p_rate / 1000.0)
$$;

-- Which runs start in the slots a claim of the named runs ``p_ids`` (all of ``p_queue``,
-- best slot first) was granted: one row per slot used, ``named_id`` the slot's delivered
-- run and ``pick_id`` the run that starts in it. A named run with no key, or on a queue
-- that is not keyed, is its own pick. For the keyed ones, under the queue row's lock (the
-- claim already holds it; taken again here), the keys are visited in round-robin order
-- (oldest last start first), in passes that give each key at most one start: a key below
-- its concurrency (K running, counting this call's picks) with a token of its rate starts
-- its best fresh admission of a flow in ``p_flows`` (the smallest rank_ms: the highest
-- priority, aged, then FIFO; a named run is one of them), SKIP LOCKED. Keys at their limit
-- or out of tokens are not visited; a key with nothing fresh at all goes to the back; at
-- most 64 visits find nothing (flows the caller does not run). A pick that is a named run
-- takes its own slot; the others take the named runs left, in order (those stay pending:
-- the caller re-publishes their wakes). Slots no pick used give their queue tokens back.
-- ``p_flows`` NULL: only the named runs may start (a path that cannot run another run).
-- Each picked key's turn and token are taken here, in the claim's transaction: a claim
-- that then loses its race wastes them (slow, never fast).
CREATE FUNCTION runfleet.key_pick_many(p_queue text, p_ids text[], p_flows text[])
    RETURNS TABLE (named_id text, pick_id text)
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_keyed boolean;
    v_k integer;
    v_rate double precision;
    v_qrate double precision;
    v_now bigint := runfleet.now_ms();
    v_stamp bigint;
    v_named text[];
    v_named_keys text[];
    v_picked text[] := '{}';
    v_running jsonb := '{}';
    v_cand record;
    v_run text;
    v_fruitless integer := 0;
    v_progress boolean;
BEGIN
    SELECT q.keyed INTO v_keyed FROM runfleet.queues q WHERE q.name = p_queue;
    RETURN QUERY
        SELECT u.id, u.id FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
          JOIN runfleet.runs r ON r.id = u.id
         WHERE r.concurrency_key IS NULL OR NOT coalesce(v_keyed, false) OR r.queue <> p_queue
         ORDER BY u.n;
    SELECT array_agg(u.id ORDER BY u.n), array_agg(DISTINCT r.concurrency_key)
      INTO v_named, v_named_keys
      FROM unnest(p_ids) WITH ORDINALITY AS u(id, n) JOIN runfleet.runs r ON r.id = u.id
     WHERE r.concurrency_key IS NOT NULL AND coalesce(v_keyed, false) AND r.queue = p_queue;
    IF v_named IS NULL THEN
        RETURN;
    END IF;
    SELECT q.keyed, q.key_concurrency, q.key_rate_per_s, q.rate_per_s
      INTO v_keyed, v_k, v_rate, v_qrate
      FROM runfleet.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_k IS NOT NULL THEN  -- each key's executing runs (its slots), read after the lock
        SELECT coalesce(jsonb_object_agg(b.key, b.n), '{}') INTO v_running
          FROM (SELECT r.concurrency_key AS key, count(*) AS n FROM runfleet.runs r
                 WHERE r.queue = p_queue AND r.status = 'running'
                   AND r.concurrency_key IS NOT NULL
                 GROUP BY r.concurrency_key) AS b;
    END IF;
    -- Turns are stamped strictly after every key's last start, so a picked key goes to
    -- the back even among the keys this call picks.
    SELECT greatest(v_now, coalesce(max(k.last_start_ms), 0)) INTO v_stamp
      FROM runfleet.queue_keys k WHERE k.queue = p_queue;
    <<passes>>
    LOOP
        v_progress := false;
        FOR v_cand IN
            SELECT k.key, k.rate_tokens, k.rate_at_ms FROM runfleet.queue_keys k
             WHERE k.queue = p_queue AND (p_flows IS NOT NULL OR k.key = ANY(v_named_keys))
               AND (v_k IS NULL OR coalesce((v_running ->> k.key)::integer, 0) < v_k)
               AND (v_rate IS NULL
                    OR runfleet.bucket_tokens(v_rate, k.rate_tokens, k.rate_at_ms, v_now) >= 1)
             ORDER BY k.last_start_ms, k.key
        LOOP
            EXIT passes WHEN cardinality(v_picked) >= cardinality(v_named);
            IF p_flows IS NULL THEN
                SELECT c.id INTO v_run FROM runfleet.runs c
                 WHERE c.id = ANY(v_named) AND c.id <> ALL(v_picked)
                   AND c.concurrency_key = v_cand.key
                 ORDER BY c.rank_ms, c.id LIMIT 1;
            ELSE
                SELECT c.id INTO v_run FROM runfleet.runs c
                 WHERE c.queue = p_queue AND c.concurrency_key = v_cand.key
                   AND c.status = 'pending' AND c.waiting_reason IS NULL AND c.owner_host IS NULL
                   AND c.claim_host IS NULL AND c.heartbeat_at_ms IS NULL
                   AND c.cancel_requested_at_ms IS NULL
                   AND (c.flow = ANY(p_flows) OR c.id = ANY(v_named))
                   AND c.id <> ALL(v_picked)
                 ORDER BY c.rank_ms, c.id LIMIT 1 FOR UPDATE SKIP LOCKED;
            END IF;
            IF v_run IS NULL THEN
                IF p_flows IS NOT NULL
                   AND NOT EXISTS (SELECT FROM runfleet.runs c
                                    WHERE c.queue = p_queue AND c.concurrency_key = v_cand.key
                                      AND c.status = 'pending' AND c.waiting_reason IS NULL
                                      AND c.owner_host IS NULL AND c.claim_host IS NULL) THEN
                    v_stamp := v_stamp + 1;
                    UPDATE runfleet.queue_keys SET last_start_ms = v_stamp  -- idle: to the back
                     WHERE queue = p_queue AND key = v_cand.key;
                ELSE
                    v_fruitless := v_fruitless + 1;
                    EXIT passes WHEN v_fruitless >= 64;
                END IF;
                CONTINUE;
            END IF;
            v_picked := v_picked || v_run;
            v_progress := true;
            v_stamp := v_stamp + 1;
            v_running := jsonb_set(v_running, ARRAY[v_cand.key],
                                   to_jsonb(coalesce((v_running ->> v_cand.key)::integer, 0) + 1));
            UPDATE runfleet.queue_keys SET last_start_ms = v_stamp,
                   rate_tokens = CASE WHEN v_rate IS NOT NULL THEN runfleet.bucket_tokens(
                                     v_rate, v_cand.rate_tokens, v_cand.rate_at_ms, v_now) - 1 END,
                   rate_at_ms = CASE WHEN v_rate IS NOT NULL THEN v_now END
             WHERE queue = p_queue AND key = v_cand.key;
        END LOOP;
        EXIT WHEN NOT v_progress OR cardinality(v_picked) >= cardinality(v_named);
    END LOOP;
    IF v_qrate IS NOT NULL AND cardinality(v_picked) < cardinality(v_named) THEN
        -- the queue's tokens granted for these slots, unused
        UPDATE runfleet.queues
           SET rate_tokens = least(greatest(rate_per_s, 1),
                                   rate_tokens + cardinality(v_named) - cardinality(v_picked))
         WHERE name = p_queue;
    END IF;
    RETURN QUERY
        WITH own AS (
            SELECT n.id, n.o FROM unnest(v_named) WITH ORDINALITY AS n(id, o)
             WHERE n.id = ANY(v_picked)
        ), spare AS (
            SELECT n.id, row_number() OVER (ORDER BY n.o) AS k
              FROM unnest(v_named) WITH ORDINALITY AS n(id, o) WHERE n.id <> ALL(v_picked)
        ), other AS (
            SELECT p.id, row_number() OVER (ORDER BY p.o) AS k
              FROM unnest(v_picked) WITH ORDINALITY AS p(id, o) WHERE p.id <> ALL(v_named)
        )
        SELECT o.id, o.id FROM own o
        UNION ALL
        SELECT s.id, x.id FROM other x JOIN spare s ON s.k = x.k;
END
$$;

-- The single claims' turn (claim_if_fresh, and start_grant for claim_and_activate and
-- activate): key_pick_many for one named run. NULL: its slot starts nothing.
CREATE OR REPLACE FUNCTION runfleet.key_pick(p_id text, p_flows text[])
    RETURNS text LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
    SELECT t.pick_id FROM runfleet.runs r,
           LATERAL runfleet.key_pick_many(r.queue, ARRAY[p_id], p_flows) AS t
     WHERE r.id = p_id
$$;

-- Retention prunes a key's row once no run of it is open and its bucket is full again
-- (retention.prune_keys; docs/how-to/queues.md). A key's open runs, whatever their state:
CREATE INDEX runs_open_key_idx ON runfleet.runs (queue, concurrency_key)
    WHERE status IN ('pending', 'running', 'suspended') AND concurrency_key IS NOT NULL;

-- Every admitted key has its queue_keys row when the admission commits. The row is made
-- if missing and then held FOR KEY SHARE until the admission commits (a claim's UPDATE of
-- the turn or bucket does not wait for it; retention's DELETE skips it), so retention
-- cannot delete a key between this statement's insert and its commit, while its runs are
-- not yet visible. A row deleted meanwhile is made again.
CREATE OR REPLACE FUNCTION runfleet.runs_key_seen() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_keys integer;
    v_held integer;
BEGIN
    SELECT count(*) INTO v_keys
      FROM (SELECT DISTINCT n.queue, n.concurrency_key FROM admitted n
             WHERE n.concurrency_key IS NOT NULL) AS d;
    WHILE v_keys > 0 LOOP
        INSERT INTO runfleet.queue_keys (queue, key)
        SELECT DISTINCT n.queue, n.concurrency_key FROM admitted n
         WHERE n.concurrency_key IS NOT NULL
         ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
        SELECT count(*) INTO v_held FROM (
            SELECT FROM runfleet.queue_keys k
             WHERE (k.queue, k.key) IN (SELECT n.queue, n.concurrency_key FROM admitted n)
             ORDER BY k.queue, k.key FOR KEY SHARE) AS h;
        EXIT WHEN v_held >= v_keys;
    END LOOP;
    RETURN NULL;
END
$$;

-- A scoped reader (producer, operator) sees a key beside an open run it may read (the
-- runs' own policies decide which, inside this one): `queue show`, `fleet`, `explain` and
-- the dashboard show a tenant its own keys, never another tenant's key values. Before,
-- only a fleet-wide role ('*') read any key.
ALTER POLICY queue_keys_scoped ON runfleet.queue_keys
    USING ((SELECT runfleet.granted_scopes()) ? '*'
           OR EXISTS (SELECT FROM runfleet.runs r
                       WHERE r.queue = queue_keys.queue AND r.concurrency_key = queue_keys.key
                         AND r.status IN ('pending', 'running', 'suspended')));
