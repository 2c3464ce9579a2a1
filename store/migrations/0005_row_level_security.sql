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

-- The caller's scopes as a jsonb array: its own grants and those of every role it is a
-- member of. Policies call it as `(SELECT runfleet.granted_scopes())`, an InitPlan run
-- once per statement, not once per row. PL/pgSQL, not SQL: an aggregate keeps an SQL
-- function from being inlined, and then its body is planned again at every statement,
-- while PL/pgSQL keeps the plan for the session.
CREATE OR REPLACE FUNCTION runfleet.granted_scopes() RETURNS jsonb
    LANGUAGE plpgsql STABLE AS
$$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(DISTINCT g.scope), '[]'::jsonb)
              FROM runfleet.grants g
             WHERE pg_has_role(current_user, g.role::oid, 'MEMBER'));
END
$$;

ALTER TABLE runfleet.grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY grants_own ON runfleet.grants
    USING (pg_has_role(current_user, role::oid, 'MEMBER'));

ALTER TABLE runfleet.runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY runs_fleet ON runfleet.runs TO runfleet_worker
    USING (true) WITH CHECK (true);
-- The rule: '*' covers every run; otherwise the run must record at least one scope and
-- every one must be granted (jsonb array containment). Written out here rather than as a
-- function: a function taking the granted scopes as a subquery argument used twice is
-- never inlined, and calling it per row made a scan of 20,000 runs ~10x slower.
CREATE POLICY runs_scoped ON runfleet.runs TO runfleet_producer, runfleet_operator
    USING ((SELECT runfleet.granted_scopes()) ? '*'
           OR (jsonb_typeof(state->'scopes') = 'array'
               AND jsonb_array_length(state->'scopes') > 0
               AND (SELECT runfleet.granted_scopes()) @> (state->'scopes')));

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
