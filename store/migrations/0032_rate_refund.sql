-- runfleet schema v32: a rate's token taken by a claim that started nothing goes back.
--
-- runfleet.queue_free_slots takes a rate's tokens under the queue row's lock, before any
-- run row is locked (the lock order every claim keeps). A fresh claim asks for a token for
-- each run its statement's snapshot shows fresh; when a concurrent claim of the same run
-- commits first (two wakes of one run: its gated wake and the lost-wake sweep's, read by
-- two workers), or the batch claim skips a row another transaction holds, that token
-- started nothing and was gone: three worker processes held 4/s at 87.7 % over a minute
-- (tests/queues/test_rate_limit.py). The fresh claims (claim_if_fresh,
-- claim_and_activate_many) now hand the unused tokens back with runfleet.rate_refund in the
-- same statement, still under the queue row's lock.

CREATE FUNCTION runfleet.rate_refund(p_queue text, p_unused integer)
    RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF p_unused IS NULL OR p_unused <= 0 THEN
        RETURN 0;
    END IF;
    -- The bucket as queue_free_slots left it (rate_at_ms is that call's instant): the tokens
    -- go back on top, still at most one second's starts.
    UPDATE runfleet.queues q
       SET rate_tokens = least(greatest(q.rate_per_s, 1), coalesce(q.rate_tokens, 0) + p_unused)
     WHERE q.name = p_queue AND q.rate_per_s IS NOT NULL;
    RETURN p_unused;
END
$$;
