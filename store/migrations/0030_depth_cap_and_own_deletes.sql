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
-- delete_run needed DELETE on everything that belongs to a run, which producers never
-- held: a tenant could cancel a run of its own but never remove it. It now calls
-- runfleet.delete_settled (below), which producers may execute (store/sql/roles.sql).

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

-- Answers and messages are values a worker hands to a flow: held to the same depth. An
-- answer is written only by runfleet.answer (a definer, which row-level security does
-- not hold), so a trigger checks the deferreds it writes (those with `answered_by`);
-- a producer's message, by a policy beside 0015's.
CREATE FUNCTION runfleet.answer_depth_ok() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    IF octet_length(NEW.value::text) >= 130 THEN
        PERFORM runfleet.depth_ok('value', NEW.value::jsonb);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER deferreds_answer_depth BEFORE INSERT ON runfleet.deferreds
    FOR EACH ROW WHEN (NEW.metadata ? 'answered_by')
    EXECUTE FUNCTION runfleet.answer_depth_ok();
CREATE POLICY run_messages_producer_depth ON runfleet.run_messages AS RESTRICTIVE FOR INSERT
    TO runfleet_producer
    WITH CHECK (octet_length(value::text) < 130 OR runfleet.depth_ok('value', value::jsonb));

-- Deleting settled runs and all that is theirs, for whoever may see them: what
-- delete_run (store/forks.py) calls. SECURITY DEFINER, so a producer holds no DELETE on
-- any table (its raw SQL still cannot erase a record or a step of a run it keeps); the
-- rules are checked here instead, with the caller's grants as row-level security reads
-- them: every run named must be visible to the authenticated role and settled, or
-- nothing is deleted. Operators are not granted it (they read, they write nothing).
CREATE FUNCTION runfleet.delete_settled(p_ids text[])
    RETURNS TABLE (deleted_runs bigint, deleted_records bigint, deleted_steps bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    v_who name := session_user;
    v_granted jsonb;
    v_open text;
BEGIN
    IF NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = v_who AND (rolsuper OR rolbypassrls))
            OR pg_has_role(v_who, 'runfleet_migrator', 'MEMBER')
            OR pg_has_role(v_who, 'runfleet_worker', 'MEMBER')) THEN
        SELECT coalesce(jsonb_agg(DISTINCT g.scope), '[]'::jsonb) INTO v_granted
          FROM runfleet.grants g WHERE pg_has_role(v_who, g.role::oid, 'MEMBER');
        IF EXISTS (SELECT FROM runfleet.runs r
                    WHERE r.id = ANY (p_ids)
                      AND NOT (v_granted ? '*'
                               OR (jsonb_typeof(r.state -> 'scopes') = 'array'
                                   AND jsonb_array_length(r.state -> 'scopes') > 0
                                   AND v_granted @> (r.state -> 'scopes')))) THEN
            RAISE EXCEPTION 'permission denied: % may not delete these runs', v_who
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    SELECT r.id INTO v_open FROM runfleet.runs r
     WHERE r.id = ANY (p_ids) AND r.status NOT IN ('completed', 'failed', 'cancelled')
     LIMIT 1 FOR UPDATE;
    IF FOUND THEN
        PERFORM runfleet.refuse('run_id', format('run %s is not settled', quote_literal(v_open)));
    END IF;
    RETURN QUERY
    WITH doomed AS (SELECT unnest(p_ids) AS id),
    j AS (DELETE FROM runfleet.journal WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    s AS (DELETE FROM runfleet.steps WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    a AS (DELETE FROM runfleet.attempts WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    d AS (DELETE FROM runfleet.deferreds WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    c AS (DELETE FROM runfleet.clocks WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    e AS (DELETE FROM runfleet.run_events WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    m AS (DELETE FROM runfleet.run_messages WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
    p AS (DELETE FROM runfleet.run_parents
           WHERE child_id IN (SELECT id FROM doomed) OR parent_id IN (SELECT id FROM doomed)
          RETURNING 1),
    r AS (DELETE FROM runfleet.runs WHERE id IN (SELECT id FROM doomed) RETURNING 1)
    SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM j), (SELECT count(*) FROM s);
END
$$;
