-- runfleet schema v26: a lost execution that made progress starts the recoveries in a row
-- again.
--
-- A run whose executions keep ending in a lost process is parked `dead` after
-- Settings.max_recoveries takeovers in a row (0012). Until now only a clean end of an
-- execution (a park, a release, a settlement) started the count again, so a healthy
-- run that kept recording steps while workers were killed around it could be parked
-- as poison: five-step runs under 30 SIGKILLs over three workers were seen taken over
-- four times each, and once buried on the sixth (tests/flows/test_crash_ledger.py).
-- Now the execution the takeover replaces is asked whether it recorded anything (a row
-- of runfleet.steps at its epoch: a step, a clock, a child, an answer). If it did, the
-- losses before it are not in a row with this one: the count starts again, this loss
-- being the first. A poison run re-runs from its records and ends its process before
-- it records anything new, so it still reaches the limit after as many executions as
-- before. The steal and the bury (store/sql/runs.sql) both read the count through this
-- function, under the run's row lock, so they agree on it.
-- Invoker's rights: a worker reads the steps of any run (steps_fleet); one probe of the
-- run's primary key range of runfleet.steps. A SQL function (its subquery keeps the
-- planner from inlining it: planned at each takeover, which is rare).
CREATE FUNCTION runfleet.recoveries_in_a_row(p_run_id text, p_epoch bigint, p_recoveries integer)
    RETURNS integer LANGUAGE sql STABLE AS
$$
    SELECT CASE WHEN EXISTS (SELECT FROM runfleet.steps s
                              WHERE s.run_id = p_run_id AND s.epoch = p_epoch)
                THEN 0 ELSE p_recoveries END
$$;
