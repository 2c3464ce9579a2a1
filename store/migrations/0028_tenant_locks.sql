-- runfleet schema v28: no worker statement waits on a lock a tenant can take.
--
-- A sweep tick took pg_try_advisory_xact_lock(732011, kind): any login of the database
-- may take any advisory lock, so a producer's or the read-only operator's session that
-- held (732011, 1..8) stopped every sweep of the fleet (no takeover of a killed worker's
-- runs, no delayed run started) for as long as it liked. Now a tick locks its kind's row
-- of runfleet.sweep_leases, FOR UPDATE SKIP LOCKED: locking a row in any mode needs
-- UPDATE on its table, and only runfleet_worker (every table but `grants`,
-- store/sql/roles.sql) and the owner have it; producers and operators have no privilege
-- on this table at all. The lock is still the tick's transaction's, released when it
-- ends or its session dies; the CAS keeps overlapping sweeps correct as before.
CREATE TABLE runfleet.sweep_leases (
    kind integer PRIMARY KEY,
    name text NOT NULL UNIQUE
);
INSERT INTO runfleet.sweep_leases (kind, name) VALUES
    (1, 'parked'), (2, 'stale_running'), (3, 'due_clocks'), (4, 'pending_cancellations'),
    (5, 'lost_pending'), (6, 'due_waits'), (7, 'deadline_passed'), (8, 'runnable_suspended');

-- A settlement never waits on a row lock either. runfleet.settle_owned (0025), which
-- runfleet.settle_alone (0027) calls, locked the batch's rows in id order and waited for
-- each: a producer holding its own run's row FOR UPDATE held every other run of the batch
-- (of any tenant) for as long as it liked. It now locks them SKIP LOCKED: a row locked
-- elsewhere is left out of the answer, as a lost fence is, and the caller, reading it
-- still owned at its epoch with no cancel asked, settles that run alone
-- (store/lifecycle.py, RowLocked). Otherwise the function is 0025's.
CREATE OR REPLACE FUNCTION runfleet.settle_owned(
    p_ids text[], p_epochs bigint[], p_statuses text[], p_patches jsonb[], p_results text[],
    p_guards boolean[], p_kinds text[], p_seqs bigint[], p_payloads jsonb[],
    p_digests text[], p_source_id text, p_host text, p_pid integer, p_nonce text)
    RETURNS TABLE (run runfleet.runs, now_ms bigint)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET jit = off AS
$$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT * FROM unnest(p_ids, p_epochs, p_statuses, p_patches, p_results, p_guards,
                             p_kinds, p_seqs, p_payloads, p_digests)
            AS w(id, epoch, to_status, patch, result, guard, kind, seq, payload, digest)
    ), locked AS MATERIALIZED (
        SELECT r.id FROM runfleet.runs r
         WHERE r.id = ANY(p_ids) ORDER BY r.id FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE runfleet.runs AS r SET
            status = w.to_status, state = r.state || w.patch,
            result = coalesce(w.result::json, r.result),
            owner_host = NULL, owner_pid = NULL, owner_nonce = NULL, heartbeat_at_ms = NULL,
            recoveries = 0,
            waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
            waiting_request = NULL, waiting_deferred = NULL,
            updated_at_ms = runfleet.now_ms()
          FROM wanted w JOIN locked l ON l.id = w.id
         WHERE r.id = w.id AND r.status = 'running'
           AND w.to_status IN ('completed', 'failed', 'cancelled')
           AND r.owner_host = p_host AND r.owner_pid = p_pid AND r.owner_nonce = p_nonce
           AND r.epoch = w.epoch
           AND (NOT w.guard OR r.cancel_requested_at_ms IS NULL)
        RETURNING r AS run, runfleet.now_ms() AS now_ms, r.id, w.kind AS journal_kind,
                  w.seq AS journal_seq, w.payload AS journal_payload,
                  w.digest AS journal_digest
    ), journaled AS (
        INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,
                                      at_ms)
        SELECT m.id, m.journal_kind, p_source_id, m.journal_seq, m.journal_payload,
               m.journal_digest, m.now_ms
          FROM moved m
    ), closed AS (
        UPDATE runfleet.clocks AS c SET completed_at_ms = runfleet.now_ms()
          FROM moved m
         WHERE c.run_id = m.id AND c.completed_at_ms IS NULL
    )
    SELECT m.run, m.now_ms FROM moved m;
END
$$;
