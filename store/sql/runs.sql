-- Run rows: admission, the claim/activate/steal CAS family, owned transitions,
-- heartbeats and cancellation. Every UPDATE states its whole precondition in its
-- WHERE clause, so zero rows returned means "lost the race", never "half done".
--
-- The row decides which pool executes a run: every statement that claims, activates or
-- steals takes `serves`, the queues the claimant serves (NULL: a store that serves
-- every queue, as tools and tests open it), and touches a run only if its queue is one
-- of them, whatever message or sweep brought the run here. The one exception is a
-- pending run with a cancel request: closing it executes nothing (it never started, so
-- it has no steps to compensate), and any worker may close it (DESIGN §7.4).

-- name: get
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r WHERE r.id = %(id)s;

-- name: get_for_update
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r WHERE r.id = %(id)s FOR UPDATE;

-- name: get_for_update_by
-- get_for_update with who is asking: the authenticated role (session_user, not a role it
-- SET ROLE to), journaled as the actor of an operator's decision (resume).
SELECT r.*, runfleet.now_ms() AS now_ms, session_user::text AS session_role
  FROM runfleet.runs r WHERE r.id = %(id)s FOR UPDATE;

-- name: latest_round
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.lineage_id = %(lineage_id)s
 ORDER BY r.round_ordinal DESC LIMIT 1;

-- name: insert
-- Admits a batch (one row or many) from parallel arrays, in one statement.
-- No conflict target: every unique index is an arbiter. With only (id) as arbiter, two
-- concurrent identical admissions both pass the id pre-check and the loser then fails
-- on (lineage_id, round_ordinal) with a unique violation instead of joining. A row
-- whose id is taken (by another run, or earlier in the same batch) is not returned.
INSERT INTO runfleet.runs AS r (
    id, flow, queue, status, state, payload, lineage_id, round_ordinal, parent_run_id,
    created_at_ms, updated_at_ms, cancel_requested_at_ms,
    waiting_reason, waiting_wake_at_ms, priority, dedup_key)
SELECT b.id, b.flow, b.queue, 'pending',
    b.state || CASE WHEN b.timeout_ms IS NULL THEN '{}'::jsonb  -- the earlier deadline
               ELSE jsonb_build_object('deadline_ms', LEAST(t.now_ms + b.timeout_ms,
                                                             (b.state->>'deadline_ms')::bigint))
               END,
    b.payload::json,  -- canonical text, kept verbatim (store/values.py)
    b.lineage_id, b.round_ordinal, b.previous_round_id, t.now_ms, t.now_ms,
    CASE WHEN b.inherit_cancel THEN coalesce(%(inherit_at_ms)s::bigint, t.now_ms) END,
    CASE WHEN b.delay_until_ms IS NOT NULL THEN 'timer' END, b.delay_until_ms,
    b.priority, b.dedup_key  -- docs/how-to/queues.md: NULL priority = the queue's default
  FROM (SELECT runfleet.now_ms() AS now_ms) AS t,  -- one admission instant per batch
       unnest(%(id)s::text[], %(flow)s::text[], %(queue)s::text[], %(state)s::jsonb[],
              %(payload)s::text[], %(lineage_id)s::text[], %(round_ordinal)s::integer[],
              %(previous_round_id)s::text[], %(inherit_cancel)s::boolean[],
              %(delay_until_ms)s::bigint[], %(timeout_ms)s::bigint[],
              %(priority)s::integer[], %(dedup_key)s::text[])
       WITH ORDINALITY AS b(id, flow, queue, state, payload, lineage_id, round_ordinal,
                            previous_round_id, inherit_cancel, delay_until_ms, timeout_ms,
                            priority, dedup_key, n)
 ORDER BY b.n
ON CONFLICT DO NOTHING
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: claim_and_activate
-- The fast path: claim, activation and its journal record in one statement (so
-- one round trip, and atomic without a transaction block). Only a runnable row
-- (pending or suspended, nobody's wait pending, no stranded claim) qualifies, and
-- only if nothing in the caller's snapshot moved. The record's digest is computed
-- here from jsonb's own canonical text: CAS records are never compared by digest.
--
-- The queue's slot (and its rate's token) is asked once, before the run row is locked
-- (``slots``), for a row with no cancel and no key as this statement's snapshot has it;
-- a token taken for a run this statement then did not start (a concurrent claim of it
-- committed first, the caller's snapshot was stale) goes back (runfleet.rate_refund, 0032).
-- Asked inside the UPDATE's WHERE, it was taken again at each re-check of a changed row,
-- and kept when the re-check failed.
WITH seen AS MATERIALIZED (
    SELECT r.queue FROM runfleet.runs r
     WHERE r.id = %(id)s AND r.cancel_requested_at_ms IS NULL AND r.concurrency_key IS NULL
), slots AS MATERIALIZED (
    SELECT s.queue, runfleet.queue_free_slots(s.queue) AS free FROM seen s
), activated AS (
    UPDATE runfleet.runs AS r SET
        status = 'running', owner_host = %(host)s, owner_pid = %(pid)s,
        owner_nonce = %(nonce)s, epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
        claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
        updated_at_ms = runfleet.now_ms()
     WHERE r.id = %(id)s AND r.status IS NOT DISTINCT FROM %(status)s
       AND r.status IN ('pending', 'suspended')
       AND r.waiting_reason IS NOT DISTINCT FROM NULL AND r.claim_host IS NOT DISTINCT FROM NULL
       AND r.owner_host IS NOT DISTINCT FROM %(exp_owner_host)s
       AND r.owner_pid IS NOT DISTINCT FROM %(exp_owner_pid)s
       AND r.owner_nonce IS NOT DISTINCT FROM %(exp_owner_nonce)s
       AND r.heartbeat_at_ms IS NOT DISTINCT FROM %(exp_heartbeat_at_ms)s
   AND (%(exp_epoch)s::bigint IS NULL OR r.epoch = %(exp_epoch)s)
       AND (%(serves)s::text[] IS NULL OR r.queue = ANY(%(serves)s::text[])
            OR (r.status = 'pending' AND r.cancel_requested_at_ms IS NOT NULL))
       -- the queue's fleet-wide limit and its key's (docs/how-to/queues.md); a cancel closes
       -- without a slot
       AND (r.cancel_requested_at_ms IS NOT NULL OR CASE
            WHEN r.concurrency_key IS NULL  -- no key: the queue's own limit, asked in slots
            THEN coalesce((SELECT s.free FROM slots s), 1) > 0
            ELSE runfleet.start_grant(%(id)s) END)
    RETURNING r.*, runfleet.now_ms() AS now_ms,
              EXISTS (SELECT FROM runfleet.queues q
                       WHERE q.name = r.queue
                         AND (q.concurrency IS NOT NULL OR q.keyed)) AS limited
), record AS (
    SELECT a.id, jsonb_build_object('owner', %(owner_key)s::text, 'epoch', a.epoch,
                                    'from', %(status)s::text) AS payload, a.now_ms
      FROM activated a
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT id, %(journal_kind)s, %(source_id)s, %(source_seq)s, payload,
           left(encode(sha256(convert_to(payload::text, 'UTF8')), 'hex'), 32), now_ms
      FROM record
), refunded AS MATERIALIZED (
    SELECT runfleet.rate_refund(s.queue, 1) AS n FROM slots s
     WHERE s.free > 0 AND NOT EXISTS (SELECT FROM activated)
)
SELECT * FROM activated WHERE (SELECT count(*) FROM refunded) >= 0;

-- name: claim_if_fresh
-- A stream delivery's read and claim in one statement (an idle worker's start latency is
-- its round trips). ``seen`` is the row as this statement's snapshot has it, as a read
-- would; ``activated`` is its claim, activation and record, made only when the row is a
-- fresh admission of the flow the message named: pending, never started (no owner,
-- lease or claim), not waiting, no cancel asked. All of it is checked by the UPDATE on
-- the newest row version, so a concurrent claim that commits first (the UPDATE waits for
-- its row lock, then re-checks) leaves ``activated`` empty while ``seen`` still shows the
-- row fresh: the caller's lost race. Both rows come back, told apart by ``activated``.
--
-- Priorities (docs/how-to/queues.md): the delivery is a slot offered to the queue, not only to
-- the run it names. ``ahead`` is the queue's best fresh admission of a strictly higher
-- priority (one probe of runs_ready_priority_idx: nothing when every priority is equal),
-- among the flows the caller runs (``ahead_flows``; NULL: no look-ahead); it takes the
-- slot unless the named run has out-aged it (a smaller rank_ms). The named run then stays
-- pending and the caller re-publishes its wake. The pick reads without a lock and the
-- winner is then locked SKIP LOCKED (a run another claimant is taking is that claimant's:
-- the named run is claimed instead), so this statement holds a look-ahead lock only when
-- it will update that row and never waits while holding one: with the batch claim (which
-- waits only for rows it names, in id order, before any look-ahead) there is no cycle.
-- The statement runs inside runfleet.claim_fresh (migration 0033), whose generic plan is
-- made once per connection: as a prepared statement Postgres planned it again for every
-- call (0.7 ms of an idle start).
SELECT c.activated, (c.run).*, c.now_ms, c.limited
  FROM runfleet.claim_fresh(%(id)s::text, %(flow)s::text, %(ahead_flows)s::text[],
                            %(serves)s::text[], %(host)s::text, %(pid)s::integer,
                            %(nonce)s::text, %(owner_key)s::text, %(journal_kind)s::text,
                            %(source_id)s::text, %(source_seq)s::bigint) AS c;

-- name: claim_and_activate_many
-- claim_and_activate for every fresh admission a stream read delivered, in one statement:
-- only a row still pending, never started by anyone (no owner, no lease, no claim, no
-- wait) and at the epoch the caller read qualifies, each with its own record. Rows are
-- locked in id order first, SKIP LOCKED: the statement never waits on a row lock, so a
-- run its producer holds locked (`SELECT ... FOR UPDATE` with its own login) is left out
-- of the batch instead of holding everyone's runs in it, and two workers handed
-- overlapping batches (a redelivery) cannot deadlock. A row missing from the answer lost
-- its race or was locked: the caller reads it (still fresh: ``AtLimit``, its wake comes
-- back through the queue's gate or the lost-wake sweep).
--
-- Priorities (docs/how-to/queues.md), as in claim_if_fresh: per queue, the delivered runs in
-- ascending effective order (lowest priority, newest first) are paired with the queue's
-- best fresh admissions of a higher priority than the lowest delivered one, best first
-- (``ahead``: SKIP LOCKED, like the named rows); a pair
-- whose candidate has the higher priority and a smaller rank_ms claims the candidate in
-- the delivered run's place. ``named_id`` says whose slot each activated row took.
--
-- Concurrency keys (docs/how-to/queues.md): a keyed queue's keyed runs do not look ahead by
-- priority; the slots granted to them go to their keys' turns, one runfleet.key_pick_many
-- call per keyed queue of the batch (``turns``, after every named row is locked; its
-- picks are locked SKIP LOCKED, like ``ahead``): K per key, round-robin across keys, the
-- per-key rate and priority within a key, the rule the single claims use.
--
-- The UPDATE states "pending, no wait, no claim" as IS NOT DISTINCT FROM, which the
-- planner cannot read as the predicate of the pending partial indexes: with statistics
-- from before a bulk admission it took those for empty and scanned all of one (92,000
-- entries, ~480 ms a claim at a 100,000-run backlog) instead of probing the primary key
-- for the batch's ids (docs/backlog.md). The rows it updates are named as an array too
-- (``r.id = ANY(ARRAY(...))``, an index condition on the primary key) beside the join to
-- ``chosen``: on a table never analyzed, a batch's custom plan estimated the pending rows
-- at one and ``chosen`` at hundreds, and joined them as a nested loop over a sequential
-- scan of all of runs (30,000 rows x 64 ids, ~2 s a claim at a 30,000-run backlog).
WITH wanted AS (
    SELECT w.id, w.epoch, w.seq
      FROM unnest(%(ids)b::text[], %(epochs)b::bigint[], %(seqs)b::bigint[]) AS w(id, epoch, seq)
), limits AS MATERIALIZED (
    -- Each queue's fleet-wide limit (docs/how-to/queues.md), its lock taken before any run row's,
    -- in queue order (two batches lock the same queues in the same order).
    SELECT q.queue, runfleet.queue_free_slots(q.queue, q.want::integer) AS free,
           EXISTS (SELECT FROM runfleet.queues k WHERE k.name = q.queue AND k.keyed) AS keyed
      FROM (SELECT r.queue, count(*) FILTER (
                        WHERE r.status = 'pending' AND r.owner_host IS NULL
                          AND r.claim_host IS NULL AND r.waiting_reason IS NULL) AS want
              FROM runfleet.runs r WHERE r.id = ANY(%(ids)b::text[])
             GROUP BY r.queue ORDER BY r.queue) AS q
), locked AS MATERIALIZED (
    SELECT r.id, r.queue, r.priority, r.rank_ms,
           r.status = 'pending' AND r.waiting_reason IS NULL AND r.claim_host IS NULL
           AND r.owner_host IS NULL AND r.heartbeat_at_ms IS NULL
           AND r.cancel_requested_at_ms IS NULL
           AND (%(serves)b::text[] IS NULL OR r.queue = ANY(%(serves)b::text[])) AS fresh,
           r.concurrency_key IS NOT NULL
           AND (SELECT m.keyed FROM limits m WHERE m.queue = r.queue) AS keyed
      FROM runfleet.runs r
     WHERE r.id = ANY(%(ids)b::text[]) AND (SELECT count(*) FROM limits) >= 0  -- after limits
     ORDER BY r.id FOR UPDATE SKIP LOCKED
), named AS MATERIALIZED (
    SELECT l.*, row_number() OVER (PARTITION BY l.queue
                                   ORDER BY l.priority, l.rank_ms DESC, l.id DESC) AS k
      FROM locked l WHERE l.fresh AND NOT l.keyed  -- a keyed run looks ahead by its key
), floors AS (
    SELECT n.queue, min(n.priority) AS priority, count(*) AS slots, m.keyed FROM named n
      JOIN limits m ON m.queue = n.queue
     WHERE %(ahead_flows)b::text[] IS NOT NULL GROUP BY n.queue, m.keyed
), ahead AS MATERIALIZED (
    SELECT c.id, c.queue, c.priority, c.rank_ms,
           row_number() OVER (PARTITION BY c.queue ORDER BY c.priority DESC, c.rank_ms, c.id) AS k
      FROM floors f, LATERAL (
          SELECT c.id, c.queue, c.priority, c.rank_ms FROM runfleet.runs c
           WHERE c.queue = f.queue AND c.status = 'pending' AND c.waiting_reason IS NULL
             AND c.owner_host IS NULL AND c.claim_host IS NULL AND c.priority > f.priority
             AND c.heartbeat_at_ms IS NULL AND c.cancel_requested_at_ms IS NULL
             AND c.flow = ANY(%(ahead_flows)b::text[]) AND c.id <> ALL(%(ids)b::text[])
             AND (c.concurrency_key IS NULL OR NOT f.keyed)  -- a keyed run starts in its turn
           ORDER BY c.priority DESC, c.rank_ms, c.id LIMIT f.slots
             FOR UPDATE SKIP LOCKED) AS c
), paired AS (
    SELECT w.id AS named_id, coalesce(a.id, w.id) AS id,
           CASE WHEN a.id IS NULL THEN w.epoch END AS epoch, w.seq, l.queue, l.fresh, l.keyed,
           coalesce(a.priority, l.priority) AS priority, coalesce(a.rank_ms, l.rank_ms) AS rank_ms
      FROM wanted w JOIN locked l ON l.id = w.id  -- every named row locked first
      LEFT JOIN named n ON n.id = w.id
      LEFT JOIN ahead a ON a.queue = n.queue AND a.k = n.k
                       AND a.priority > n.priority AND a.rank_ms < n.rank_ms
), slots AS MATERIALIZED (
    -- A limited queue's free slots go to its best runs of the batch; the rest wait.
    SELECT p.*, m.free FROM (
        SELECT p.*, row_number() OVER (PARTITION BY p.queue
                                       ORDER BY p.priority DESC, p.rank_ms, p.id) AS place
          FROM paired p) AS p
      JOIN limits m ON m.queue = p.queue
     WHERE m.free IS NULL OR p.place <= m.free
), turns AS MATERIALIZED (
    -- A keyed queue's slots granted to keyed runs: its keys' turns, in queue order.
    SELECT t.named_id, t.pick_id FROM (
        SELECT s.queue, array_agg(s.named_id ORDER BY s.place) AS ids FROM slots s
         WHERE s.keyed AND s.fresh GROUP BY s.queue ORDER BY s.queue) AS g,
      LATERAL runfleet.key_pick_many(g.queue, g.ids, %(ahead_flows)b::text[]) AS t
), chosen AS (
    SELECT s.named_id, s.id, s.epoch, s.seq, s.free FROM slots s WHERE NOT s.keyed
    UNION ALL
    SELECT s.named_id, t.pick_id, CASE WHEN t.pick_id = s.named_id THEN s.epoch END,
           s.seq, s.free
      FROM slots s JOIN turns t ON t.named_id = s.named_id
), activated AS (
    UPDATE runfleet.runs AS r SET
        status = 'running', owner_host = %(host)s, owner_pid = %(pid)s,
        owner_nonce = %(nonce)s, epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
        updated_at_ms = runfleet.now_ms()
      FROM chosen w
     WHERE r.id = w.id AND r.id = ANY(ARRAY(SELECT c.id FROM chosen c))
       AND r.status IS NOT DISTINCT FROM 'pending'
       AND (w.epoch IS NULL OR r.epoch = w.epoch)
       AND r.waiting_reason IS NOT DISTINCT FROM NULL
       AND r.claim_host IS NOT DISTINCT FROM NULL AND r.owner_host IS NULL
       AND r.heartbeat_at_ms IS NULL
       AND (w.epoch IS NOT NULL OR r.cancel_requested_at_ms IS NULL)  -- a look-ahead's
       AND (%(serves)b::text[] IS NULL OR r.queue = ANY(%(serves)b::text[])
            OR (r.status = 'pending' AND r.cancel_requested_at_ms IS NOT NULL))
    RETURNING r.*, runfleet.now_ms() AS now_ms, w.seq AS journal_seq, w.named_id,
              w.free IS NOT NULL AS limited
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT a.id, %(journal_kind)s, %(source_id)s, a.journal_seq, p.payload,
           left(encode(sha256(convert_to(p.payload::text, 'UTF8')), 'hex'), 32), a.now_ms
      FROM activated a,
           LATERAL (SELECT jsonb_build_object('owner', %(owner_key)s::text, 'epoch', a.epoch,
                                              'from', 'pending')
                           || CASE WHEN a.id <> a.named_id  -- took a lower priority's slot
                                   THEN jsonb_build_object('ahead_of', a.named_id)
                                   ELSE '{}'::jsonb END AS payload) AS p
), refunded AS MATERIALIZED (
    -- A rate's tokens taken for runs this statement did not start (a concurrent claim
    -- committed first, a row skipped locked, a look-ahead lost) go back
    -- (runfleet.rate_refund, 0032), per queue, before the answer is read.
    SELECT runfleet.rate_refund(m.queue, (m.free - coalesce(u.used, 0))::integer) AS n
      FROM limits m
      LEFT JOIN (SELECT a.queue, count(*) AS used FROM activated a GROUP BY a.queue) AS u
        ON u.queue = m.queue
     WHERE m.free > coalesce(u.used, 0)
)
SELECT * FROM activated WHERE (SELECT count(*) FROM refunded) >= 0;

-- name: claim
UPDATE runfleet.runs AS r SET
    claim_host = %(host)s, claim_pid = %(pid)s, claim_nonce = %(nonce)s,
    claimed_at_ms = runfleet.now_ms(), updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status IS NOT DISTINCT FROM %(status)s
   AND r.status IN ('pending', 'suspended')
   AND r.waiting_reason IS NOT DISTINCT FROM NULL AND r.claim_host IS NOT DISTINCT FROM NULL
   AND r.owner_host IS NOT DISTINCT FROM %(exp_owner_host)s
   AND r.owner_pid IS NOT DISTINCT FROM %(exp_owner_pid)s
   AND r.owner_nonce IS NOT DISTINCT FROM %(exp_owner_nonce)s
   AND r.heartbeat_at_ms IS NOT DISTINCT FROM %(exp_heartbeat_at_ms)s
   AND (%(exp_epoch)s::bigint IS NULL OR r.epoch = %(exp_epoch)s)
   AND (%(serves)s::text[] IS NULL OR r.queue = ANY(%(serves)s::text[])
        OR (r.status = 'pending' AND r.cancel_requested_at_ms IS NOT NULL))
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: activate
UPDATE runfleet.runs AS r SET
    status = 'running', owner_host = r.claim_host, owner_pid = r.claim_pid,
    owner_nonce = r.claim_nonce, epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
    claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status IN ('pending', 'suspended') AND r.waiting_reason IS NULL
   AND r.claim_host = %(host)s AND r.claim_pid = %(pid)s AND r.claim_nonce = %(nonce)s
   AND r.claimed_at_ms = %(claimed_at_ms)s
   AND (%(serves)s::text[] IS NULL OR r.queue = ANY(%(serves)s::text[])
        OR (r.status = 'pending' AND r.cancel_requested_at_ms IS NOT NULL))
   -- the queue's fleet-wide limit and its key's (docs/how-to/queues.md); a cancel closes
   -- without a slot
   AND (r.cancel_requested_at_ms IS NOT NULL OR CASE
            WHEN r.concurrency_key IS NULL  -- no key: the queue's own limit, from this row
            THEN coalesce(runfleet.queue_free_slots(r.queue), 1) > 0
            ELSE runfleet.start_grant(%(id)s) END)
RETURNING r.*, runfleet.now_ms() AS now_ms,
          EXISTS (SELECT FROM runfleet.queues q
                   WHERE q.name = r.queue AND (q.concurrency IS NOT NULL OR q.keyed)) AS limited;

-- name: recover_claim
-- A claim whose claimant died between claim and activation; the caller has
-- already probed the claimant. Database time decides staleness.
UPDATE runfleet.runs AS r SET
    claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.claim_nonce = %(exp_claim_nonce)s
   AND r.claimed_at_ms = %(exp_claimed_at_ms)s
   AND r.claimed_at_ms < runfleet.now_ms() - %(stale_after_ms)s
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: abandon_claim
UPDATE runfleet.runs AS r SET
    claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.claim_host = %(host)s AND r.claim_pid = %(pid)s
   AND r.claim_nonce = %(nonce)s
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: steal
-- Takeover needs the stale lease to be judged by the database clock here, in the
-- same statement that moves ownership; the liveness probe was the caller's part.
-- A counted takeover (the previous owner's process was lost) is one more recovery in a
-- row, allowed only below `max_recoveries`: the count is read and written under the
-- row's lock by the statement that wins the CAS, so two stealers cannot both count.
-- A lost execution that recorded anything (a step, a clock, a child: a row of `steps`
-- at the lost epoch, one probe of the run's primary key range) made progress: the
-- losses before it are not "in a row" with this one, so the count starts again at this
-- one (docs/how-to/failure-handling.md). A poison run records nothing new before it
-- ends its process again, so it still reaches the limit.
-- A row at the limit is not stolen: the caller buries it (`bury`, same transaction).
-- The limit is the run's flow's (`@flow(max_recoveries=)`) or the fleet's; NULL for a
-- flow that never dead-letters.
UPDATE runfleet.runs AS r SET
    owner_host = %(host)s, owner_pid = %(pid)s, owner_nonce = %(nonce)s,
    epoch = r.epoch + 1, heartbeat_at_ms = runfleet.now_ms(),
    claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
    recoveries = CASE WHEN NOT %(counted)s THEN r.recoveries
                      ELSE runfleet.recoveries_in_a_row(r.id, r.epoch, r.recoveries) + 1 END,
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status = 'running'
   AND r.owner_nonce = %(exp_owner_nonce)s AND r.owner_pid = %(exp_owner_pid)s
   AND r.owner_host = %(exp_owner_host)s
   AND r.heartbeat_at_ms = %(exp_heartbeat_at_ms)s
   AND (%(exp_epoch)s::bigint IS NULL OR r.epoch = %(exp_epoch)s)
   AND r.heartbeat_at_ms < runfleet.now_ms() - %(stale_after_ms)s
   AND (NOT %(counted)s OR %(max_recoveries)s::integer IS NULL  -- NULL: never dead-letters
        OR runfleet.recoveries_in_a_row(r.id, r.epoch, r.recoveries) < %(max_recoveries)s)
   AND (%(serves)s::text[] IS NULL OR r.queue = ANY(%(serves)s::text[]))
RETURNING r.*, runfleet.now_ms() AS now_ms,
          -- a takeover keeps the run's slot of a limited queue (docs/how-to/queues.md)
          EXISTS (SELECT FROM runfleet.queues q
                   WHERE q.name = r.queue AND q.concurrency IS NOT NULL) AS limited;

-- name: bury
-- A poison run: a steal's whole precondition holds (running, the same stale lease of the
-- same owner) but it was already re-activated `max_recoveries` times in a row after lost
-- processes. Instead of a takeover it is parked `dead` with the evidence as its request:
-- no owner (every write of the lost one stays fenced), no wake time, so no sweep moves
-- it; only an operator's resume (`revive`) or a cancel does.
UPDATE runfleet.runs AS r SET
    status = 'suspended', owner_host = NULL, owner_pid = NULL, owner_nonce = NULL,
    heartbeat_at_ms = NULL,
    claim_host = NULL, claim_pid = NULL, claim_nonce = NULL, claimed_at_ms = NULL,
    waiting_reason = 'dead', waiting_wake_at_ms = NULL, waiting_token = NULL,
    waiting_request = %(evidence)s::jsonb || jsonb_build_object(
        'recoveries', runfleet.recoveries_in_a_row(r.id, r.epoch, r.recoveries)),
    waiting_deferred = NULL,
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status = 'running'
   AND r.owner_nonce = %(exp_owner_nonce)s AND r.owner_pid = %(exp_owner_pid)s
   AND r.owner_host = %(exp_owner_host)s
   AND r.heartbeat_at_ms = %(exp_heartbeat_at_ms)s
   AND (%(exp_epoch)s::bigint IS NULL OR r.epoch = %(exp_epoch)s)
   AND r.heartbeat_at_ms < runfleet.now_ms() - %(stale_after_ms)s
   AND runfleet.recoveries_in_a_row(r.id, r.epoch, r.recoveries) >= %(max_recoveries)s
   AND (%(serves)s::text[] IS NULL OR r.queue = ANY(%(serves)s::text[]))
RETURNING r.*, runfleet.now_ms() AS now_ms;

-- name: lost_owners
-- The owners whose executions of the run were lost before the current one, newest first:
-- the previous owner of each counted takeover (`stolen-and-activated`, not self-orphaned).
SELECT j.payload->>'previous_owner' AS owner, j.at_ms FROM runfleet.journal j
 WHERE j.run_id = %(id)s AND j.kind = 'stolen-and-activated'
   AND coalesce(j.payload->>'probe', '') <> 'self-orphaned'
 ORDER BY j.seq DESC LIMIT %(limit)s;

-- name: revive
-- An operator moves a dead run on: the wait is cleared and the count starts again, so
-- the next lost process is recovery 1 of `max_recoveries`. The body replays from its
-- records. session_role (the authenticated role) is journaled as who decided.
WITH before AS (
    SELECT id, recoveries, waiting_request FROM runfleet.runs
     WHERE id = %(id)s AND status = 'suspended' AND waiting_reason = 'dead' FOR UPDATE
)
UPDATE runfleet.runs AS r SET
    recoveries = 0, waiting_reason = NULL, waiting_wake_at_ms = NULL, waiting_token = NULL,
    waiting_request = NULL, waiting_deferred = NULL, updated_at_ms = runfleet.now_ms()
  FROM before
 WHERE r.id = before.id AND r.status = 'suspended' AND r.waiting_reason = 'dead'
RETURNING r.*, runfleet.now_ms() AS now_ms, session_user::text AS session_role,
          before.recoveries AS recoveries_before, before.waiting_request AS dead_evidence;

-- name: transition_owned
-- Leaving 'running' drops the owner (the epoch stays as the fence history).
-- With the guard on, a pending cancel request makes a settlement lose. The journal
-- record and, for a terminal status, the closing of the run's clocks are part of
-- the same statement: one round trip, and nothing lands unless the CAS won.
-- A result is canonical JSON text (store/values.py), kept verbatim by the json column.
-- The execution ended cleanly, so the run's recoveries in a row start again.
WITH moved AS (
    UPDATE runfleet.runs AS r SET
        status = %(to_status)s, state = r.state || %(state_patch)s,
        result = coalesce(%(result)s::json, r.result),
        owner_host = NULL, owner_pid = NULL, owner_nonce = NULL, heartbeat_at_ms = NULL,
        recoveries = 0,
        waiting_reason = %(waiting_reason)s, waiting_wake_at_ms = %(waiting_wake_at_ms)s,
        waiting_token = %(waiting_token)s, waiting_request = %(waiting_request)s,
        waiting_deferred = %(waiting_deferred)s,
        updated_at_ms = runfleet.now_ms()
     WHERE r.id = %(id)s AND r.status = 'running'
       AND r.owner_host = %(host)s AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s
       AND r.epoch = %(epoch)s
       AND (NOT %(guard)s OR r.cancel_requested_at_ms IS NULL)
    RETURNING r.*, runfleet.now_ms() AS now_ms
), journaled AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT id, %(kind)s, %(source_id)s, %(source_seq)s, %(payload)s, %(digest)s, now_ms
      FROM moved
), closed AS (
    UPDATE runfleet.clocks AS c SET completed_at_ms = runfleet.now_ms()
      FROM moved
     WHERE c.run_id = moved.id AND %(to_status)s IN ('completed', 'failed', 'cancelled')
       AND c.completed_at_ms IS NULL
)
SELECT * FROM moved;

-- name: settle_many
-- transition_owned for a batch of terminal settlements (completed or failed) of one
-- owner, in one statement: runfleet.settle_owned (migration 0025; the statement, its
-- rules, and why it is a function with generic plans). Each row keeps its own fence
-- (owner and the epoch it was activated at) and its own cancel guard, its own record and
-- its clocks closed; rows are locked in id order first, SKIP LOCKED (migration 0028: a
-- row locked elsewhere is left out and answered RowLocked, settled alone). A row missing
-- from the answer lost its fence or its guard: the caller reads it to learn which.
SELECT (s.run).*, s.now_ms
  FROM runfleet.settle_owned(%(ids)b::text[], %(epochs)b::bigint[], %(statuses)b::text[],
                             %(patches)b::jsonb[], %(results)b::text[], %(guards)b::boolean[],
                             %(kinds)b::text[], %(seqs)b::bigint[], %(payloads)b::jsonb[],
                             %(digests)b::text[], %(source_id)s::text, %(host)s::text,
                             %(pid)s::integer, %(nonce)s::text) AS s;

-- name: settle_alone
-- settle_many in one autocommitted statement when the batch hands nothing over:
-- runfleet.settle_alone (migration 0027). When a run of the batch has a parent edge on
-- its lineage or an open attached descendant it writes nothing and answers one row,
-- `refused`; the caller then settles the batch with settle_many in a transaction with
-- the walk and the hand-over.
SELECT s.refused, (s.run).*, s.now_ms
  FROM runfleet.settle_alone(%(ids)b::text[], %(epochs)b::bigint[], %(statuses)b::text[],
                             %(patches)b::jsonb[], %(results)b::text[], %(guards)b::boolean[],
                             %(kinds)b::text[], %(seqs)b::bigint[], %(payloads)b::jsonb[],
                             %(digests)b::text[], %(source_id)s::text, %(host)s::text,
                             %(pid)s::integer, %(nonce)s::text) AS s;

-- name: attached_descendants_many
-- For several settling runs at once, every unsettled run each one's lineage reaches
-- through attached edges, as (root, descendant) pairs: runfleet.attached_descendants
-- (migration 0024; the walk, its rules and why it is a function with generic plans).
SELECT d.root, d.id FROM runfleet.attached_descendants(%(ids)b::text[]) AS d
 ORDER BY d.root, d.id;

-- name: heartbeat
-- One statement renews every run a process owns; the answer is the confirmed
-- set (a run missing from it lost its fence) plus which of them a cancel hit.
-- Rows are locked in id order, SKIP LOCKED: the renewal never waits on a row lock,
-- whoever holds it (a producer may `SELECT ... FOR UPDATE` its own run; docs/explanation/
-- trust-model.md). A row still ours in this statement's snapshot but locked elsewhere is
-- answered in ``skipped``: not renewed this beat, not lost either (the caller retries it
-- next beat and lapses that run alone if it stays locked; worker/lease.py).
-- A renewal sent after a lapse (re_ids non-empty) journals lease-reconfirmed in this
-- same statement, and only on the runs it renewed at the epoch the process holds them
-- at (re_epochs[i] for re_ids[i], at address re_seqs[i]): a run stolen meanwhile is not
-- renewed, so a cut-off owner never writes on the new owner's run.
WITH locked AS MATERIALIZED (
    SELECT r.id FROM runfleet.runs r
     WHERE r.id = ANY(%(ids)s) AND r.status = 'running'
       AND r.owner_host = %(host)s AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s
     ORDER BY r.id FOR UPDATE SKIP LOCKED
), skipped AS MATERIALIZED (
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}') AS ids FROM runfleet.runs r
     WHERE r.id = ANY(%(ids)s) AND r.status = 'running'
       AND r.owner_host = %(host)s AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s
       AND r.id NOT IN (SELECT l.id FROM locked l)
), t AS MATERIALIZED (
    -- One instant for the whole renewal, read after the locks: every heartbeat it writes,
    -- every lease-reconfirmed record's confirmed_ms and the now_ms it answers agree.
    SELECT runfleet.now_ms() AS now_ms FROM (SELECT count(*) FROM locked) AS after_locks
), renewed AS (
    UPDATE runfleet.runs AS r SET heartbeat_at_ms = t.now_ms
      FROM locked l, t
     WHERE r.id = l.id AND r.status = 'running'
       AND r.owner_host = %(host)s AND r.owner_pid = %(pid)s AND r.owner_nonce = %(nonce)s
    RETURNING r.id, r.epoch, r.heartbeat_at_ms,
              r.cancel_requested_at_ms IS NOT NULL AS cancel_requested
), reconfirmed AS (
    INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
    SELECT n.id, %(journal_kind)s, %(source_id)s, c.seq, p.payload,
           left(encode(sha256(convert_to(p.payload::text, 'UTF8')), 'hex'), 32),
           runfleet.now_ms()
      FROM renewed n
      JOIN unnest(%(re_ids)s::text[], %(re_epochs)s::bigint[], %(re_seqs)s::bigint[])
           AS c(id, epoch, seq) ON c.id = n.id AND c.epoch = n.epoch
     CROSS JOIN LATERAL (
         SELECT jsonb_build_object('owner', %(owner_key)s::text, 'epoch', n.epoch,
                                   'confirmed_ms', n.heartbeat_at_ms,
                                   'unconfirmed_ms', %(unconfirmed_ms)s::bigint) AS payload
     ) AS p
    RETURNING run_id
)
SELECT renewed.id, renewed.cancel_requested, t.now_ms,
       renewed.id IN (SELECT run_id FROM reconfirmed) AS reconfirmed, skipped.ids AS skipped
  FROM t CROSS JOIN skipped LEFT JOIN renewed ON true;

-- name: request_cancel
-- A cancel is asked of the logical run: every unsettled round of the run's lineage gets
-- it (first writer wins), so cancelling the root id reaches the round now live. The
-- caller repeats it while a fresh read still finds a live round without it: a handoff
-- committing while it waited on the old round's lock leaves a successor it could not see.
-- session_role (the authenticated role, not a free-text actor) is journaled as who asked.
UPDATE runfleet.runs AS r SET cancel_requested_at_ms = runfleet.now_ms(),
    updated_at_ms = runfleet.now_ms()
 WHERE r.lineage_id = (SELECT l.lineage_id FROM runfleet.runs l WHERE l.id = %(id)s)
   AND r.cancel_requested_at_ms IS NULL
   AND r.status NOT IN ('completed', 'failed', 'cancelled')
RETURNING r.*, runfleet.now_ms() AS now_ms, session_user::text AS session_role;

-- name: lineage_rounds
-- Every round of the run's lineage, oldest first.
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r
 WHERE r.lineage_id = (SELECT l.lineage_id FROM runfleet.runs l WHERE l.id = %(id)s)
 ORDER BY r.round_ordinal;

-- name: attached_descendants
-- Every unsettled run a cancellation or a final settlement of this run's lineage reaches:
-- the same walk for one run (runfleet.attached_descendants, migration 0024). The run's
-- own lineage is not listed: its rounds are the caller's.
SELECT d.id FROM runfleet.attached_descendants(ARRAY[%(id)s::text]) AS d ORDER BY d.id;

-- name: cascade_cancel
-- The cascade only ASKS: each descendant closes through its own cancel path (claimed,
-- its compensations run, then `cancelled`), exactly as if it had been cancelled itself.
-- Closing parked or pending children here would skip their compensations.
UPDATE runfleet.runs AS r SET
    cancel_requested_at_ms = coalesce(r.cancel_requested_at_ms, runfleet.now_ms()),
    updated_at_ms = runfleet.now_ms()
 WHERE r.id = ANY(%(ids)s) AND r.status NOT IN ('completed', 'failed', 'cancelled')
   AND r.cancel_requested_at_ms IS NULL
RETURNING r.id, r.status, session_user::text AS session_role;

-- name: inherit_cancel
-- A late child (or a diamond's joined child) takes its parent's request, timestamp kept,
-- so it reads as the same operator intent rather than a later, independent one.
UPDATE runfleet.runs AS r SET
    cancel_requested_at_ms = %(at_ms)s::bigint, updated_at_ms = runfleet.now_ms()
 WHERE r.id = %(id)s AND r.status NOT IN ('completed', 'failed', 'cancelled')
   AND r.cancel_requested_at_ms IS NULL
RETURNING r.*, runfleet.now_ms() AS now_ms, session_user::text AS session_role;

-- name: close_clocks
UPDATE runfleet.clocks SET completed_at_ms = runfleet.now_ms()
 WHERE run_id = ANY(%(ids)s) AND completed_at_ms IS NULL;

-- name: get_many
SELECT r.*, runfleet.now_ms() AS now_ms FROM runfleet.runs r WHERE r.id = ANY(%(ids)b);
