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

-- name: one
-- One parentless run (a single enqueue): runfleet.admit_one (migration 0022), the same
-- rules and the same answer as `batch` for a batch of one, with scalar parameters. The
-- casts pin each parameter's type, so the prepared statement does not vary with the
-- values (psycopg dumps a Python int as the smallest integer type that holds it).
SELECT a.inserted, (a.run).*, runfleet.now_ms() AS now_ms
  FROM runfleet.admit_one(%(id)s::text, %(flow)s::text, %(queue)s::text, %(state)s::jsonb,
                          %(payload)s::text, %(lineage_id)s::text, %(round_ordinal)s::integer,
                          %(previous_round_id)s::text, %(delay_until_ms)s::bigint,
                          %(timeout_ms)s::bigint, %(priority)s::integer, %(dedup_key)s::text,
                          %(source_seq)s::bigint, %(record)s::jsonb, %(digest)s::text,
                          %(kind)s::text, %(source_id)s::text) AS a;
