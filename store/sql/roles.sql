-- Database roles, their privileges, and the scope grants row-level security reads.
-- The group roles themselves are created by migration 0005 (its policies name them);
-- `runfleet roles --apply` runs `privileges` in one database, as the schema's owner or
-- a superuser, after every migration (a new table gets its privileges here).
--   runfleet_migrator  owns the schema: DDL, grants; not subject to row-level security
--   runfleet_worker    every run (policies `true`), every row it needs; not `grants`
--   runfleet_producer  admit, read, cancel, answer (runfleet.answer only) and, once
--                      settled, delete runs of its granted scopes, within runfleet.limits
--   runfleet_operator  read runs of its granted scopes; writes nothing

-- name: privileges
-- Idempotent: ownership moves to runfleet_migrator (whoever applies this must be the
-- owner and a member of runfleet_migrator, or a superuser), then every privilege is
-- revoked and granted afresh, so a privilege removed from this file is removed from
-- the database too. Table lists are explicit for the scoped roles (least privilege);
-- the worker gets every table but `grants`.
-- Only what runfleet_migrator does not own yet changes owner: ALTER TABLE ... OWNER takes
-- an ACCESS EXCLUSIVE lock on each table in turn, and a live fleet writing two of those
-- tables in one transaction would deadlock with it. Once owned, re-applying takes no
-- table lock (GRANT and REVOKE do not lock the tables they name).
DO $$
DECLARE
    obj record;
    run_tables text := 'runfleet.runs, runfleet.journal, runfleet.steps, runfleet.attempts,'
                       ' runfleet.deferreds, runfleet.clocks, runfleet.run_parents';
BEGIN
    EXECUTE 'ALTER SCHEMA runfleet OWNER TO runfleet_migrator';
    FOR obj IN
        SELECT c.relkind, c.relname FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'runfleet' AND c.relkind IN ('r', 'p', 'v', 'm')
           AND c.relowner <> 'runfleet_migrator'::regrole
         ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE runfleet.%I OWNER TO runfleet_migrator', obj.relname);
    END LOOP;
    FOR obj IN
        SELECT p.oid::regprocedure AS fn FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'runfleet' AND p.proowner <> 'runfleet_migrator'::regrole
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO runfleet_migrator', obj.fn);
    END LOOP;

    REVOKE ALL ON SCHEMA runfleet FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA runfleet
        FROM PUBLIC, runfleet_worker, runfleet_producer, runfleet_operator;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA runfleet
        FROM PUBLIC, runfleet_worker, runfleet_producer, runfleet_operator;
    GRANT USAGE ON SCHEMA runfleet TO runfleet_worker, runfleet_producer, runfleet_operator;

    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA runfleet TO runfleet_worker;
    REVOKE ALL ON runfleet.grants FROM runfleet_worker;
    REVOKE INSERT, UPDATE, DELETE ON runfleet.limits FROM runfleet_worker;
    -- The journal is append-only, and its order (seq) and each record's writer are the
    -- database's (migration 0013): nobody's INSERT names them, and nobody updates a record.
    REVOKE INSERT, UPDATE ON runfleet.journal FROM runfleet_worker;
    GRANT INSERT (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        ON runfleet.journal TO runfleet_worker;
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA runfleet TO runfleet_worker;

    EXECUTE 'GRANT SELECT ON ' || run_tables || ', runfleet.flows, runfleet.grants, runfleet.queues,'
            ' runfleet.limits, runfleet.schema_migrations TO runfleet_producer,'
            ' runfleet_operator';
    -- A producer admits, cancels (with the cascade to attached children) and answers:
    -- only the columns those statements write. Owner, lease, epoch, claim, result and the
    -- journal's seq and writer stay the workers' and the database's (a producer cannot
    -- forge a run's result or tenure, nor choose where a record sorts or whose it is).
    -- What it writes in them is held to runfleet.limits by the policies of migration 0013
    -- (no derived ids, sizes within the caps). No sequence privileges: the journal's seq
    -- is an identity, so a producer needs none and reads no fleet-wide counter from one.
    GRANT INSERT (id, flow, queue, status, state, payload, lineage_id, round_ordinal,
                  parent_run_id, created_at_ms, updated_at_ms, cancel_requested_at_ms,
                  waiting_reason, waiting_wake_at_ms, priority, dedup_key)
        ON runfleet.runs TO runfleet_producer;
    GRANT INSERT (run_id, kind, source_id, source_seq, payload, digest, at_ms)
        ON runfleet.journal TO runfleet_producer;
    -- Answers are written only by runfleet.answer (migration 0009: it checks what the run
    -- declared and journals the role that answered): no INSERT/UPDATE on deferreds, so raw
    -- SQL with a producer's credentials cannot skip those checks.
    REVOKE ALL ON FUNCTION runfleet.answer(text, text, text, boolean, json, text, text,
                                           integer, text, bigint)
        FROM PUBLIC, runfleet_worker, runfleet_producer, runfleet_operator;
    GRANT EXECUTE ON FUNCTION runfleet.answer(text, text, text, boolean, json, text, text,
                                              integer, text, bigint) TO runfleet_producer;
    -- The sweeper's statistics refresh (0025): ANALYZE as the tables' owner, workers only.
    REVOKE ALL ON FUNCTION runfleet.analyze_grown()
        FROM PUBLIC, runfleet_worker, runfleet_producer, runfleet_operator;
    GRANT EXECUTE ON FUNCTION runfleet.analyze_grown() TO runfleet_worker;
    -- recoveries: resuming a run parked dead starts its count again (runs.revive).
    GRANT UPDATE (status, state, cancel_requested_at_ms, updated_at_ms, waiting_reason,
                  waiting_wake_at_ms, waiting_token, waiting_request, waiting_deferred,
                  claim_host, claim_pid, claim_nonce, claimed_at_ms, recoveries)
        ON runfleet.runs TO runfleet_producer;
    GRANT UPDATE (completed_at_ms) ON runfleet.clocks TO runfleet_producer;
    -- A run's events and messages (0015) are read like the rest of the run (its policies);
    -- named here, not in run_tables above, so that the text before ALTER SCHEMA stays
    -- within pg_stat_activity's 1 KB of query (tests/security/test_apply_live.py reads it).
    GRANT SELECT ON runfleet.run_events, runfleet.run_messages
        TO runfleet_producer, runfleet_operator;
    -- Concurrency keys (0019): fleet bookkeeping like runfleet.queues (explain, queue show).
    GRANT SELECT ON runfleet.queue_keys, runfleet.flow_keys TO runfleet_producer, runfleet_operator;
    -- send a message to a run (store/events.py): the message, never its consumption
    -- (the RESTRICTIVE policy of migration 0015 holds the value to the payload cap).
    GRANT INSERT (run_id, topic, message_id, value, digest, sent_at_ms)
        ON runfleet.run_messages TO runfleet_producer;
    -- resume a quarantined run: accept the recorded output, or drop it to re-run the step
    GRANT UPDATE (digest), DELETE ON runfleet.steps TO runfleet_producer;
    -- delete a settled run it can see and all that is its: runfleet.delete_settled (0030)
    -- checks both; no DELETE on any table for producers.
    REVOKE ALL ON FUNCTION runfleet.delete_settled(text[])
        FROM PUBLIC, runfleet_worker, runfleet_producer, runfleet_operator;
    GRANT EXECUTE ON FUNCTION runfleet.delete_settled(text[])
        TO runfleet_worker, runfleet_producer;

    -- Statistics that count every scope's rows (per-table tuple counters and scans, table
    -- and database sizes, database-wide commit counts) are readable by PUBLIC in a stock
    -- cluster, and only a superuser may change that: pg_catalog belongs to the bootstrap
    -- superuser. Applied by a superuser, they are taken from PUBLIC in this database and
    -- left to pg_read_all_stats (monitoring roles, via pg_monitor) and the migrator;
    -- applied by the owner alone, nothing changes here (`runfleet roles` says which).
    -- What stays visible whatever is done: docs/explanation/trust-model.md.
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = current_user AND rolsuper) THEN
        FOR obj IN
            SELECT c.oid::regclass::text AS name FROM pg_class c
             WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'v'
               AND (c.relname ~ ('^pg_stat(io)?_(all|user|sys|xact_all|xact_user|xact_sys)_'
                                 '(tables|indexes|sequences|functions)$')
                    OR c.relname IN ('pg_stat_database', 'pg_stat_database_conflicts'))
             ORDER BY 1
        LOOP
            EXECUTE format('REVOKE ALL ON %s FROM PUBLIC', obj.name);
            EXECUTE format('GRANT SELECT ON %s TO pg_read_all_stats, runfleet_migrator',
                           obj.name);
        END LOOP;
        FOR obj IN
            SELECT p.oid::regprocedure::text AS name FROM pg_proc p
             WHERE p.pronamespace = 'pg_catalog'::regnamespace
               AND ((p.proname LIKE 'pg\_stat\_get\_%' AND p.pronargs = 1
                     AND p.proargtypes[0] = 'oid'::regtype)
                    OR p.proname IN ('pg_relation_size', 'pg_table_size', 'pg_indexes_size',
                                     'pg_total_relation_size', 'pg_database_size'))
             ORDER BY 1
        LOOP
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', obj.name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pg_read_all_stats,'
                           ' runfleet_migrator', obj.name);
        END LOOP;
    END IF;
END
$$;

-- name: limits
-- The limits producers are held to in the database (migration 0013), from the settings
-- of whoever applies the privileges; a row changes only when its value does.
INSERT INTO runfleet.limits AS l (name, value, updated_at_ms)
SELECT w.name, w.value, runfleet.now_ms()
  FROM unnest(%(names)s::text[], %(values)s::bigint[]) AS w(name, value)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms
 WHERE l.value IS DISTINCT FROM excluded.value;

-- name: visibility
-- Whether the catalog's statistics are hidden from the scoped roles (a superuser applied
-- the privileges), and the limits producers are held to.
SELECT NOT has_table_privilege('runfleet_producer', 'pg_catalog.pg_stat_user_tables', 'SELECT')
       AS statistics_hidden,
       coalesce((SELECT jsonb_object_agg(l.name, l.value) FROM runfleet.limits l), '{}'::jsonb)
       AS limits;

-- name: status
-- The group roles as the cluster has them: exists, attributes, and their members.
SELECT w.name AS role, r.oid IS NOT NULL AS exists,
       coalesce(r.rolcanlogin, false) AS can_login,
       coalesce(r.rolbypassrls, false) AS bypass_rls,
       coalesce((SELECT array_agg(m.rolname::text ORDER BY m.rolname)
                   FROM pg_auth_members am JOIN pg_roles m ON m.oid = am.member
                  WHERE am.roleid = r.oid), '{}'::text[]) AS members
  FROM unnest(%(roles)s::text[]) WITH ORDINALITY AS w(name, n)
  LEFT JOIN pg_roles r ON r.rolname = w.name
 ORDER BY w.n;

-- name: member
-- Make a login role a member of a group role; identifiers are composed by store/roles.py.
GRANT {group} TO {member};

-- name: role_exists
-- Roles are named exactly as pg_roles spells them (no identifier folding or quoting).
SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %(role)s) AS exists;

-- name: grant
-- Only the schema owner (migrator) or a superuser may write grants: nobody else holds
-- INSERT or DELETE on the table. Scopes already granted are not returned.
INSERT INTO runfleet.grants (role, scope, granted_at_ms)
SELECT r.oid::regrole, s, runfleet.now_ms()
  FROM pg_roles r, unnest(%(scopes)s::text[]) AS s
 WHERE r.rolname = %(role)s
ON CONFLICT DO NOTHING
RETURNING scope;

-- name: revoke
-- By name, or by OID for the rows of a role since dropped (they list as the OID).
DELETE FROM runfleet.grants g
 WHERE (g.role::oid IN (SELECT oid FROM pg_roles WHERE rolname = %(role)s)
        OR g.role::oid::text = %(role)s)
   AND g.scope = ANY (%(scopes)s::text[])
RETURNING scope;

-- name: grants
-- Every grant this role may see: all of them for the owner, its own for anyone else.
-- A role since dropped shows as its OID.
SELECT coalesce(r.rolname::text, g.role::oid::text) AS role, g.scope, g.granted_at_ms
  FROM runfleet.grants g LEFT JOIN pg_roles r ON r.oid = g.role::oid
 ORDER BY 1, 2;
