-- runfleet schema v11: the stranded-claims sweep (store/sql/sweeps.sql) reads claims by
-- age. Only rows with a claim in flight are in this index, so with none it is empty and
-- the sweep is one empty index probe instead of a scan of the whole runs table, however
-- much settled history it holds (tests/scale/test_history_plans.py proves the plan).
CREATE INDEX runs_stranded_claim_idx ON runfleet.runs (claimed_at_ms, id)
    WHERE claim_host IS NOT NULL;
