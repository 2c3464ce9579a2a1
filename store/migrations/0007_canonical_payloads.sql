-- runfleet schema v7: a run's payload (its arguments) keeps its exact JSON text, like
-- recorded values since v4 (store/values.py): a flow enqueued with 1e16 receives a
-- float, not jsonb's 10000000000000000. NULL for runs admitted before v7, whose
-- payload stays in state->'payload'.

ALTER TABLE runfleet.runs ADD COLUMN payload json;
