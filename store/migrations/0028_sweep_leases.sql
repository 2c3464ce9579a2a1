-- runfleet schema v28: who sweeps a kind is decided by a row only workers can lock.
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
