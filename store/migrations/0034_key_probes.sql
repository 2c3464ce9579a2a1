-- runfleet schema v34: the hot path's functions read by key whatever the statistics.
--
-- These functions are planned once per connection (generic plans, 0022-0027 and 0033),
-- and a connection makes them in its first calls, often on a young database: a table of a
-- page or two, where a sequential scan is the cheaper plan. That plan is kept until the
-- table's statistics change, and runfleet.analyze_grown (0025) refreshes them only once
-- the committed rows doubled; rows made dead by updates never count, and a database with
-- producers and no worker has no sweeper to call it. Meanwhile every call read the whole
-- table: runfleet.admit's check for runs already recorded read all of the journal (2 ms a
-- batch of ten and growing with each round, producers alone admitting 12,000 runs), and
-- a settlement read all of runs twice (its lock's `id = ANY` and its parent check), and a
-- child's settlement walked its descendants by scans of runs and run_parents.
--
-- Every statement of these functions reaches its rows by key (an id, a run's records, a
-- child's edges, a queue's dedup key) through an index: with sequential scans off inside
-- them, the planner takes those indexes at any size, and a young table costs a probe of
-- a small index instead of a scan that grows. A statement with no index to use is
-- planned as before (the setting only makes a sequential scan the last resort).
-- The parents' hand-over also joins without hashing or merging: its last UPDATE joins the
-- woken parents to runs, and without a scan the planner hashed them against a walk of
-- the whole primary key; a nested loop probes each parent's row.
ALTER FUNCTION runfleet.admit(jsonb, jsonb, text, text) SET enable_seqscan = off;
ALTER FUNCTION runfleet.admit_one(text, text, text, jsonb, text, text, integer, text, bigint,
                                  bigint, integer, text, bigint, jsonb, text, text, text)
    SET enable_seqscan = off;
ALTER FUNCTION runfleet.settle_owned(text[], bigint[], text[], jsonb[], text[], boolean[], text[],
                                     bigint[], jsonb[], text[], text, text, integer, text)
    SET enable_seqscan = off;
ALTER FUNCTION runfleet.settle_alone(text[], bigint[], text[], jsonb[], text[], boolean[], text[],
                                     bigint[], jsonb[], text[], text, text, integer, text)
    SET enable_seqscan = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_seqscan = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_hashjoin = off;
ALTER FUNCTION runfleet.notify_parents(text[], text[], text) SET enable_mergejoin = off;
ALTER FUNCTION runfleet.attached_descendants(text[]) SET enable_seqscan = off;
ALTER FUNCTION runfleet.claim_fresh(text, text, text[], text[], text, integer, text, text, text,
                                    text, bigint)
    SET enable_seqscan = off;
