-- runfleet schema v29: unkeyed runs of a keyed queue share one key, the empty key, and
-- take their turn with the others (docs/how-to/queues.md "Concurrency keys").
--
-- A run with no key (its flow has no key expression, or the expression finds nothing)
-- was its own pick in every claim: on a queue keyed by tenant, a burst of 1,500 such
-- runs whose wakes came first on the stream took every slot until it drained, and a
-- keyed run of another tenant waited behind all of it. Now the admission gives such a
-- run of a keyed queue the key '' (no payload or scope yields it: the trigger maps an
-- empty value to no key, so only this rule does), and the claim's round-robin, K per
-- key and per-key rate treat the no-key bucket as one key. A run of a queue that is not
-- keyed keeps no key, and its claims are as before.
ALTER TABLE runfleet.runs DROP CONSTRAINT runs_concurrency_key_check;
-- NOT VALID: every row already meets the stricter check it replaces (no scan under lock).
ALTER TABLE runfleet.runs ADD CONSTRAINT runs_concurrency_key_check
    CHECK (length(concurrency_key) <= 255) NOT VALID;

-- The key of an admission (0019), and now the empty key for an unkeyed run of a keyed
-- queue: one more primary-key probe, of runfleet.queues, for a run with no key.
CREATE OR REPLACE FUNCTION runfleet.run_concurrency_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_expr text;
    v_key text;
BEGIN
    SELECT f.expression INTO v_expr FROM runfleet.flow_keys f WHERE f.flow = NEW.flow;
    IF v_expr = 'scope' THEN
        v_key := NEW.state -> 'scopes' ->> 0;
    ELSIF v_expr LIKE 'kwargs.%' THEN
        v_key := NEW.payload::jsonb -> 'kwargs' ->> substr(v_expr, 8);
    ELSIF v_expr IS NOT NULL THEN
        v_key := NEW.payload::jsonb -> 'args' ->> substr(v_expr, 6)::integer;
    END IF;
    NEW.concurrency_key := left(nullif(v_key, ''), 255);
    IF NEW.concurrency_key IS NULL
       AND EXISTS (SELECT FROM runfleet.queues q WHERE q.name = NEW.queue AND q.keyed) THEN
        NEW.concurrency_key := '';  -- the no-key bucket: one key for every unkeyed run
    END IF;
    RETURN NEW;
END
$$;
