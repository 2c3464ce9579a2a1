-- runfleet schema v5: scopes are enforced by Postgres, not only by the caller's word.
-- A role sees and changes a run only if the scopes granted to it (runfleet.grants, to
-- the role or any role it is a member of) cover every scope the run records; a run that
-- records no scope is fleet-wide and needs the grant '*'. Rows that belong to a run
-- (journal, steps, attempts, deferreds, clocks, parent edges) follow their run. Workers
-- have policies that are plain `true` (the planner folds them away: the hot path pays
-- nothing); the schema owner (the migrator) is not subject to RLS at all.
-- Table privileges are not here: `runfleet roles --apply` (store/sql/roles.sql) grants
-- them, since which role may do what is deployment policy, re-applied after migrating.

-- The policies name the group roles, so they must exist (cluster-wide, NOLOGIN, no
-- privileges of their own). Creating them needs CREATEROLE, but only the first time in
-- a cluster; two databases migrating at once may race, hence the handlers.
DO $$
DECLARE
    wanted text;
BEGIN
    FOREACH wanted IN ARRAY ARRAY['runfleet_migrator', 'runfleet_worker',
                                  'runfleet_producer', 'runfleet_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = wanted) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', wanted);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$$;

CREATE TABLE runfleet.grants (
    role            regrole NOT NULL,
    scope           text NOT NULL CHECK (length(scope) BETWEEN 1 AND 255),
    granted_at_ms   bigint NOT NULL,
    PRIMARY KEY (role, scope)
);

CREATE OR REPLACE FUNCTION runfleet.granted_scopes() RETURNS text[]
    LANGUAGE sql STABLE AS
$$ SELECT coalesce(array_agg(DISTINCT g.scope), '{}'::text[])
     FROM runfleet.grants g
    WHERE pg_has_role(current_user, g.role::oid, 'MEMBER') $$;

CREATE OR REPLACE FUNCTION runfleet.covers(run_scopes jsonb, granted text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS
$$ SELECT '*' = ANY (granted)
       OR (jsonb_typeof(run_scopes) = 'array' AND jsonb_array_length(run_scopes) > 0
           AND ARRAY(SELECT jsonb_array_elements_text(run_scopes)) <@ granted) $$;

ALTER TABLE runfleet.grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY grants_own ON runfleet.grants
    USING (pg_has_role(current_user, role::oid, 'MEMBER'));

ALTER TABLE runfleet.runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY runs_fleet ON runfleet.runs TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY runs_scoped ON runfleet.runs TO runfleet_producer, runfleet_operator
    USING (runfleet.covers(state->'scopes', (SELECT runfleet.granted_scopes())));

ALTER TABLE runfleet.journal ENABLE ROW LEVEL SECURITY;
CREATE POLICY journal_fleet ON runfleet.journal TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY journal_scoped ON runfleet.journal TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = journal.run_id));

ALTER TABLE runfleet.steps ENABLE ROW LEVEL SECURITY;
CREATE POLICY steps_fleet ON runfleet.steps TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY steps_scoped ON runfleet.steps TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = steps.run_id));

ALTER TABLE runfleet.attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY attempts_fleet ON runfleet.attempts TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY attempts_scoped ON runfleet.attempts TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = attempts.run_id));

ALTER TABLE runfleet.deferreds ENABLE ROW LEVEL SECURITY;
CREATE POLICY deferreds_fleet ON runfleet.deferreds TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY deferreds_scoped ON runfleet.deferreds TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = deferreds.run_id));

ALTER TABLE runfleet.clocks ENABLE ROW LEVEL SECURITY;
CREATE POLICY clocks_fleet ON runfleet.clocks TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY clocks_scoped ON runfleet.clocks TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = clocks.run_id));

-- An edge is visible only if both ends are: a parent's id is not shown to whoever can
-- see only the child, nor a child's to whoever can see only the parent.
ALTER TABLE runfleet.run_parents ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_parents_fleet ON runfleet.run_parents TO runfleet_worker
    USING (true) WITH CHECK (true);
CREATE POLICY run_parents_scoped ON runfleet.run_parents TO runfleet_producer, runfleet_operator
    USING (EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_parents.child_id)
           AND EXISTS (SELECT FROM runfleet.runs r WHERE r.id = run_parents.parent_id));
