-- runfleet schema v3: recorded values keep their exact JSON text (store/values.py).
-- jsonb re-renders numbers (1e16 -> 10000000000000000, -0.0 -> 0.0), so a replayed
-- step saw an int where it had a float and failed its digest. A json column keeps
-- the canonical text it is given; digests are taken over that text.
-- Rows written before this migration keep jsonb's rendering (not canonical text):
-- their digest is still checked against the decoded value, as before.

ALTER TABLE runfleet.steps ALTER COLUMN output TYPE json USING output::json;
ALTER TABLE runfleet.deferreds ALTER COLUMN value TYPE json USING value::json;
-- A completed run's result in canonical text; NULL for runs settled before v3 (their
-- result stays in state->'result') and for runs that did not complete.
ALTER TABLE runfleet.runs ADD COLUMN result json;
