-- Admission of parentless runs (the producer's case): one statement, a call of
-- runfleet.admit (migration 0017), which inserts the rows and then their `created`
-- records as two statements of its own: the second sees the first's rows, so the journal's
-- row-level security (journal_scoped: the run must be visible) admits them, where one
-- statement with the journal insert in a sibling CTE would be refused for every scoped
-- producer. SECURITY INVOKER: every policy and column privilege of the caller applies.
-- Children keep runs.insert (they lock their parent first).

-- name: batch
-- %(runs)s: one jsonb array of records (one parameter to encode, where parallel arrays
-- cost the producer a type probe per element): {id, flow, queue, state, payload (canonical
-- text), lineage_id, round_ordinal, previous_round_id, delay_until_ms, timeout_ms}.
-- %(records)s: each run's `created` record {id, source_seq, record, digest}. Every batch
-- run this role can see comes back as it is after the insert, with `inserted` true for
-- the rows this statement wrote; a run it skipped (id or round taken) is joined or refused
-- by its caller.
SELECT a.inserted, (a.run).*, runfleet.now_ms() AS now_ms
  FROM runfleet.admit(%(runs)s::jsonb, %(records)s::jsonb, %(kind)s, %(source_id)s) AS a;
