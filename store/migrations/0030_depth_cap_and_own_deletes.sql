-- runfleet schema v30: Postgres caps nesting as it caps size, and a tenant deletes its own
-- settled runs.
--
-- A producer's raw INSERT of a payload nested 3,000 arrays deep (6 KB, within every size
-- cap) stored a value Python's json cannot decode (it gives up past ~1,000 levels): every
-- reader of the row died on it. Readers now render such a value as undecodable
-- (store/values.py) and go on; the database refuses it from producers in the first
-- place, for runs (payload, state) and journal records alike. The Python API refuses
-- first (store/validate.py, a typed error).
--
-- delete_run needs DELETE on everything that belongs to a run, which producers never
-- held: a tenant could cancel a run of its own but never remove it. Producers may now
-- delete settled runs they can see (the scope policies' USING) and what belongs to them,
-- nothing of a live run (the RESTRICTIVE policies below); the privileges themselves are
-- in store/sql/roles.sql.

-- Refused when any value sits more than 64 levels below the top (`[[1]]` has its 1 at
-- level 2). The jsonpath walk is in C and stops at level 65; a value too short to nest
-- that deep (130 bytes) is not walked at all.
CREATE FUNCTION runfleet.depth_ok(p_field text, p_value jsonb) RETURNS boolean
    LANGUAGE plpgsql STABLE AS
$$
BEGIN
    IF p_value IS NOT NULL AND jsonb_path_exists(p_value, 'strict $.**{65}') THEN
        RETURN runfleet.refuse(p_field,
            'nested deeper than 64 levels (runfleet holds every stored value to 64)');
    END IF;
    RETURN true;
END
$$;

CREATE POLICY runs_producer_depth ON runfleet.runs AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK ((octet_length(payload::text) < 130 OR runfleet.depth_ok('payload', payload::jsonb))
                AND runfleet.depth_ok('state', state));
CREATE POLICY runs_producer_state_depth ON runfleet.runs AS RESTRICTIVE FOR UPDATE
    TO runfleet_producer
    USING (true)
    WITH CHECK (runfleet.depth_ok('state', state));
CREATE POLICY journal_producer_depth ON runfleet.journal AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (runfleet.depth_ok('payload', payload));

-- A producer deletes a run only once it is settled, and what belongs to a run only while
-- that run is there and settled (one statement deletes both: it sees the run). The scope
-- policies decide which runs it sees at all.
CREATE POLICY runs_producer_deletes ON runfleet.runs AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (status IN ('completed', 'failed', 'cancelled'));
CREATE POLICY journal_producer_deletes ON runfleet.journal AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = journal.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY steps_producer_deletes ON runfleet.steps AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = steps.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY attempts_producer_deletes ON runfleet.attempts AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = attempts.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY deferreds_producer_deletes ON runfleet.deferreds AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = deferreds.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY clocks_producer_deletes ON runfleet.clocks AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = clocks.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY run_events_producer_deletes ON runfleet.run_events AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_events.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY run_messages_producer_deletes ON runfleet.run_messages AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_messages.run_id
                      AND r.status IN ('completed', 'failed', 'cancelled')));
CREATE POLICY run_parents_producer_deletes ON runfleet.run_parents AS RESTRICTIVE FOR DELETE
    TO runfleet_producer
    USING (EXISTS (SELECT FROM runfleet.runs r
                    WHERE r.id IN (run_parents.child_id, run_parents.parent_id)
                      AND r.status IN ('completed', 'failed', 'cancelled')));
