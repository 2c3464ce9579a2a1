-- runfleet schema v12: poison runs stop. `recoveries` counts the takeovers in a row that
-- re-activated a run after its executing process was lost (os._exit, a segfault, an OOM
-- kill, a fail-stop exit): the steal that finds it at RUNFLEET_MAX_RECOVERIES parks the
-- run `dead` instead (store/sql/runs.sql: steal, bury), decided under the row's lock in
-- the steal's own statement, so two stealers cannot both count. A clean end of an
-- execution (any park: a wait, a release, quarantine) and an operator's resume of a dead
-- run set it back to 0. NOT NULL with a constant default: no table rewrite.
ALTER TABLE runfleet.runs
    ADD COLUMN recoveries integer NOT NULL DEFAULT 0 CHECK (recoveries >= 0);
