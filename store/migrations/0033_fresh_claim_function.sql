-- runfleet schema v33: an idle worker's claim is planned once per connection.
--
-- runs.claim_if_fresh (a stream delivery's read and claim in one statement) was sent as a
-- prepared statement, and Postgres chose to plan it again for every call: its generic
-- plan's estimate is above the custom plans' (the look-ahead's `ahead_flows IS NOT NULL`
-- and the queue filter are unknown to it), so `plan_cache_mode = auto` kept custom plans.
-- Planning the statement's ten CTEs took 0.7 ms of the claim's ~1.3 ms round trip
-- (`bind` in the server's log), on every idle start. The same statement now runs inside
-- runfleet.claim_fresh with a generic plan, planned once per connection as the
-- settlement's functions are; the plan is the one tests/store/test_claim_plans.py reads
-- (every scan of runs an index probe of the named row, however deep the backlog).
--
-- Nothing else changes: SECURITY INVOKER (the worker's rights and row security), one
-- statement with one snapshot, the same rows locked in the same order, the same answer
-- (the activated row, and the row as the statement's snapshot saw it).
CREATE FUNCTION runfleet.claim_fresh(
    p_id text, p_flow text, p_ahead_flows text[], p_serves text[], p_host text,
    p_pid integer, p_nonce text, p_owner_key text, p_journal_kind text, p_source_id text,
    p_source_seq bigint)
    RETURNS TABLE (activated boolean, run runfleet.runs, now_ms bigint, limited boolean)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH seen AS (
        SELECT r.*, r AS whole, runfleet.now_ms() AS now_ms FROM runfleet.runs r
         WHERE r.id = p_id
    ), slots AS MATERIALIZED (
        -- The queue's fleet-wide limit, decided before any run row is locked (a rate's
        -- token is asked only for a fresh admission: the only row it can start).
        SELECT runfleet.queue_free_slots(
                   s.queue, CASE WHEN s.status = 'pending' AND s.owner_host IS NULL
                                  AND s.claim_host IS NULL AND s.waiting_reason IS NULL
                                  AND s.cancel_requested_at_ms IS NULL THEN 1 ELSE 0 END) AS free
          FROM seen s
    ), keyed AS MATERIALIZED (
        -- A keyed queue's turn: the run its round-robin across keys starts in the slot.
        SELECT CASE WHEN s.concurrency_key IS NULL THEN s.id
                    WHEN coalesce(slots.free, 1) > 0 AND s.status = 'pending'
                         AND s.owner_host IS NULL AND s.claim_host IS NULL
                         AND s.waiting_reason IS NULL AND s.cancel_requested_at_ms IS NULL
                         AND s.flow = p_flow
                    THEN runfleet.key_pick(s.id, coalesce(p_ahead_flows, ARRAY[p_flow]))
               END AS id
          FROM seen s, slots
    ), pick AS (
        SELECT c.id FROM seen s, slots, LATERAL (
            SELECT c.id, c.rank_ms FROM runfleet.runs c
             WHERE p_ahead_flows IS NOT NULL AND c.queue = s.queue
               AND c.status = 'pending' AND c.waiting_reason IS NULL AND c.owner_host IS NULL
               AND c.claim_host IS NULL AND c.priority > s.priority
             ORDER BY c.priority DESC, c.rank_ms, c.id LIMIT 1) AS c
         WHERE s.status = 'pending' AND s.flow = p_flow AND s.waiting_reason IS NULL
           AND s.claim_host IS NULL AND s.owner_host IS NULL AND s.heartbeat_at_ms IS NULL
           AND s.cancel_requested_at_ms IS NULL AND c.rank_ms < s.rank_ms
           AND (p_serves IS NULL OR s.queue = ANY(p_serves))
           AND s.concurrency_key IS NULL  -- a keyed run's slot is its keys' turn
    ), ahead AS MATERIALIZED (
        SELECT c.id FROM runfleet.runs c
         WHERE c.id = (SELECT p.id FROM pick p) AND c.status IS NOT DISTINCT FROM 'pending'
           AND c.waiting_reason IS NOT DISTINCT FROM NULL
           AND c.owner_host IS NOT DISTINCT FROM NULL
           AND c.claim_host IS NOT DISTINCT FROM NULL AND c.heartbeat_at_ms IS NULL
           AND c.cancel_requested_at_ms IS NULL AND c.flow = ANY(p_ahead_flows)
           AND c.concurrency_key IS NULL
           FOR UPDATE SKIP LOCKED
    ), activated AS (
        UPDATE runfleet.runs AS r SET
            status = 'running', owner_host = p_host, owner_pid = p_pid,
            owner_nonce = p_nonce, epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
            updated_at_ms = runfleet.now_ms()
         WHERE coalesce((SELECT free FROM slots), 1) > 0
           AND r.id = coalesce((SELECT a.id FROM ahead a), (SELECT k.id FROM keyed k))
           AND (r.flow = p_flow OR r.id IN (SELECT a.id FROM ahead a)
                OR r.id <> p_id)  -- another key's turn: key_pick chose among the flows
           AND r.status IS NOT DISTINCT FROM 'pending'
           AND r.waiting_reason IS NOT DISTINCT FROM NULL
           AND r.claim_host IS NOT DISTINCT FROM NULL AND r.owner_host IS NOT DISTINCT FROM NULL
           AND r.heartbeat_at_ms IS NULL AND r.cancel_requested_at_ms IS NULL
           AND (p_serves IS NULL OR r.queue = ANY(p_serves))
        RETURNING r AS whole, r.id, r.epoch, runfleet.now_ms() AS now_ms,
                  (SELECT free FROM slots) IS NOT NULL AS limited
    ), journaled AS (
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        SELECT a.id, p_journal_kind, p_source_id, p_source_seq, p.payload,
               left(encode(sha256(convert_to(p.payload::text, 'UTF8')), 'hex'), 32), a.now_ms
          FROM activated a,
               LATERAL (SELECT jsonb_build_object('owner', p_owner_key, 'epoch', a.epoch,
                                                  'from', 'pending')
                               || CASE WHEN a.id <> p_id  -- took a lower priority's slot
                                       THEN jsonb_build_object('ahead_of', p_id)
                                       ELSE '{}'::jsonb END AS payload) AS p
    ), refunded AS MATERIALIZED (
        -- A rate's token taken for a run this statement did not start goes back (0032).
        SELECT runfleet.rate_refund(s.queue, 1) AS n FROM seen s, slots
         WHERE slots.free > 0 AND NOT EXISTS (SELECT FROM activated)
    )
    SELECT true, a.whole, a.now_ms, a.limited FROM activated a
    UNION ALL
    SELECT false, s.whole, s.now_ms, (SELECT free FROM slots) IS NOT NULL FROM seen s
     WHERE (SELECT count(*) FROM refunded) >= 0;
END
$$;
