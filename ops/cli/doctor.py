"""``runfleet doctor``: can this host operate the fleet, and is the fleet healthy?

Each check runs even when an earlier one failed (an unreachable Redis says nothing
about Postgres), and each answers ok / warn / fail with the fact behind it. The
exit status is 1 only for a ``fail``: a warning (no live worker, clock skew) is
worth reading but does not mean this host cannot work.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, assert_never

import typer

from runfleet.broker.codec import FIELD, MalformedMessage, decode
from runfleet.broker.liveness import FleetMember, Liveness
from runfleet.broker.stream_health import Fault, LaneHealth, StreamHealth
from runfleet.broker.streams import Lane, Streams
from runfleet.ops.cli import common as c
from runfleet.ops.cli.text import add_row, show, styled
from runfleet.ops.cli.text import table as table_of
from runfleet.ops.models import Check, DoctorView
from runfleet.store.config import Settings
from runfleet.store.migrate import migrations, schema_version
from runfleet.store.pooler import Path, probe
from runfleet.store.topology import Role, Topology, missing_runs, read_topology

SKEW_WARN_MS = 1000
"""Leases use database time, but ``enqueue_in``/``enqueue_at`` compute due times here."""

STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}

WAKES_CHECKED = 1000
"""The newest stream entries per lane whose runs ``lost admissions`` looks up."""
ASYNC_LOSS = (
    "a failover to it can lose commits the primary acknowledged (admissions producers "
    "saw succeed; step records, so those steps run again): set synchronous_standby_names "
    "(Patroni: synchronous_mode: true) with synchronous_commit = on"
)
UNKNOWN_SYNC = (
    "whether a commit waits for a standby is unknown, grant pg_monitor: this role cannot "
    "read the standbys' sync state (pg_stat_replication shows it only to pg_monitor "
    "members and superusers); GRANT pg_monitor TO <this role>"
)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    queue: Annotated[
        list[str] | None, typer.Option(help="Also measure this queue's stream lag (repeatable).")
    ] = None,
    as_json: c.AsJson = False,
    wide: c.Wide = False,
) -> None:
    """Connectivity, pooler, schema version, clock skew, stream lag per queue, live workers."""
    view = c.run(Doctor(c.settings(), queue or []).run())
    if as_json:
        c.emit(view)
    else:
        table = table_of("check", "status", "detail")
        for check in view.checks:
            add_row(table, check.name, styled(check.status, STYLE[check.status]), check.detail)
        show(table, wide=wide)
    if not view.ok:
        raise typer.Exit(1)


class Doctor:
    def __init__(self, cfg: Settings, queues: list[str]) -> None:
        self.cfg = cfg
        self.queues = queues
        self.checks: list[Check] = []
        self.version: int | None = None
        self.skew_ms: int | None = None
        self.lag: dict[str, int] = {}
        self.live: int | None = None
        self.fleet: list[FleetMember] | None = None
        self.active_queues: list[str] = []
        self.stranded: set[str] = set()

    def add(self, name: str, status: Literal["ok", "warn", "fail"], detail: str) -> None:
        self.checks.append(Check(name=name, status=status, detail=detail))

    async def guarded(self, name: str, check: Callable[[], Awaitable[None]]) -> bool:
        try:
            await check()
        except Exception as exc:
            text = str(exc).strip().splitlines()
            self.add(name, "fail", text[0] if text else type(exc).__name__)
            return False
        return True

    async def run(self) -> DoctorView:
        postgres_ok = await self.guarded("postgres", self._postgres)
        if postgres_ok:
            await self.guarded("pooler", self._pooler)
            await self.guarded("schema", self._schema)
            await self.guarded("topology", self._topology)
        redis_ok = await self.guarded("redis", self._redis)
        if redis_ok:
            await self.guarded("workers", self._workers)
            await self.guarded("streams", self._streams)
            await self.guarded("stream lag", self._lag)
            if postgres_ok and self.version is not None:
                await self.guarded("lost admissions", self._lost_admissions)
        return DoctorView(
            ok=all(ch.status != "fail" for ch in self.checks),
            checks=self.checks,
            schema_version=self.version,
            latest_migration=migrations()[-1].version,
            clock_skew_ms=self.skew_ms,
            stream_lag=self.lag,
            live_workers=self.live,
        )

    async def _postgres(self) -> None:
        async with c.connect(self.cfg) as conns:
            before = time.time()
            info = await conns.store.inspect.server_info()
            after = time.time()
        self.add("postgres", "ok", f"PostgreSQL {info.version}")
        # The midpoint of the round trip is when the server most likely read its clock.
        self.skew_ms = info.now_ms - int((before + after) / 2 * 1000)
        skew = c.seconds(abs(self.skew_ms))
        if abs(self.skew_ms) > SKEW_WARN_MS:
            ahead = "ahead of" if self.skew_ms > 0 else "behind"
            self.add(
                "clock skew",
                "warn",
                f"the database clock is {skew} {ahead} this host: leases are unaffected "
                "(database time), due times computed here (enqueue_in/at) are off by that much",
            )
        else:
            self.add("clock skew", "ok", f"{self.skew_ms} ms between this host and the database")

    async def _pooler(self) -> None:
        """Report a pooler, and what runfleet needs behind one (see store.pooler)."""
        seen = await probe(self.cfg)
        prepares = self.cfg.prepare_threshold is not None
        match seen.path:
            case Path.TRANSACTION_POOLER:
                pids = " then ".join(str(p) for p in seen.backend_pids)
                detail = (
                    f"a transaction pooler (PgBouncer?) serves this URL: one session ran on "
                    f"backends {pids}"
                )
                if prepares:
                    self.add(
                        "pooler",
                        "warn",
                        f"{detail}; RUNFLEET_PREPARE_THRESHOLD is {self.cfg.prepare_threshold}: "
                        "set it to `none` unless the pooler tracks prepared statements "
                        "(PgBouncer >= 1.21 with max_prepared_statements)",
                    )
                elif self.cfg.retention is not None:
                    self.add(
                        "pooler",
                        "warn",
                        f"{detail}; RUNFLEET_RETENTION is set, but the retention pass lock "
                        "is session-scoped and not exclusive through this pooler: unset it "
                        "and run `runfleet prune` from cron against Postgres directly",
                    )
                else:
                    self.add(
                        "pooler",
                        "ok",
                        f"{detail}; prepared statements off; run `runfleet migrate` and "
                        "`runfleet prune` against Postgres directly (session advisory locks)",
                    )
            case Path.MIDDLEMAN:
                self.add(
                    "pooler",
                    "ok",
                    f"a session pooler or proxy: the backend sees client port "
                    f"{seen.client_port}, this host's socket is {seen.local_port}",
                )
            case Path.DIRECT:
                self.add("pooler", "ok", "none: connected to the backend directly")
            case Path.UNKNOWN:
                self.add("pooler", "ok", "not determined (Unix socket or client_port hidden)")
            case _ as never:
                assert_never(never)

    async def _schema(self) -> None:
        latest = migrations()[-1].version
        self.version = await schema_version(self.cfg.database_url)
        if self.version >= latest:
            async with c.connect(self.cfg) as conns:
                self.active_queues = await conns.store.inspect.active_queues()
        if self.version == latest:
            self.add("schema", "ok", f"migration {self.version} of {latest}")
        elif self.version < latest:
            self.add(
                "schema",
                "fail",
                f"at migration {self.version}, {latest} exists: `runfleet migrate`",
            )
        else:
            self.add(
                "schema",
                "warn",
                f"at migration {self.version}, newer than this runfleet ({latest}): upgrade it",
            )

    async def _redis(self) -> None:
        client = c.redis_client(self.cfg)
        try:
            await client.ping()
            info = await client.info("server")
            self.fleet = await Liveness.for_settings(client, self.cfg).fleet(c.wall_ms())
        finally:
            await client.aclose()
        version = info.get("redis_version", b"?")
        text = version.decode() if isinstance(version, bytes) else str(version)
        self.add("redis", "ok", f"Redis {text}, prefix {self.cfg.redis_prefix!r}")

    async def _workers(self) -> None:
        fleet = self.fleet or []
        live = [m for m in fleet if m.live]  # a suspect key (a ghost) is no live worker
        self.live = len(live)
        lapsed = sum(m.lapsed for m in fleet)
        suspect = len(fleet) - len(live) - lapsed
        if not live:
            self.add("workers", "warn", "no live worker process: runs wait until one starts")
            return
        hosts = len({m.host for m in live})
        detail = f"{len(live)} live worker process(es) on {hosts} host(s)"
        if suspect:
            detail += f"; {suspect} SUSPECT liveness key(s): see `runfleet fleet`"
        if lapsed:
            self.add("workers", "warn", f"{detail}; {lapsed} LAPSED (cut off from the database)")
        elif suspect:
            self.add("workers", "warn", detail)
        else:
            self.add("workers", "ok", detail)

    def _queues_in_use(self) -> list[str]:
        """The queues asked for, the ones live workers read, and the ones runs name."""
        read = {q for m in self.fleet or [] if m.live for q in m.queues}
        return list(dict.fromkeys([*self.queues, *sorted(read), *self.active_queues]))

    async def _streams(self) -> None:
        """Whether each queue's lanes can deliver what is written to them (read-only).

        A group ahead of its stream or another type of key at a stream's name strands
        the queue's wakes (``broker.stream_health``): workers repair it within a sweep
        tick, and until then runs start only by the lost-wake sweep. Named as a failure:
        something other than runfleet wrote to these keys. A stream without its group is
        a warning: the next worker read recreates the group from id 0.
        """
        queues = self._queues_in_use()
        client = c.redis_client(self.cfg)
        found: list[tuple[str, Lane, LaneHealth]] = []
        try:
            streams = Streams(client, self.cfg.redis_prefix)
            health = StreamHealth(client)
            for queue in queues:
                for lane in Lane:
                    lane_health = await health.check(streams.stream_key(queue, lane))
                    if lane_health.fault not in (None, Fault.MISSING):
                        found.append((queue, lane, lane_health))
        finally:
            await client.aclose()
        for queue, lane, lane_health in found:
            assert lane_health.fault is not None
            if lane_health.fault.strands:
                self.stranded.add(queue)
                detail = f"STRANDED: {stranding(lane, lane_health)}"
                self.add(f"streams {queue}", "fail", detail)
            else:
                self.add(f"streams {queue}", "warn", stranding(lane, lane_health))
        if not found:
            self.add("streams", "ok", f"{len(queues)} queue(s): every lane can deliver")

    async def _lag(self) -> None:
        fleet = self.fleet or []
        read = {q for m in fleet if m.live for q in m.queues}
        queues = [q for q in self._queues_in_use() if q not in self.stranded]
        client = c.redis_client(self.cfg)
        try:
            streams = Streams(client, self.cfg.redis_prefix)
            for queue in queues:
                self.lag[queue] = await streams.lag(queue)
        finally:
            await client.aclose()
        for queue, lag in self.lag.items():
            if lag and queue not in read:
                self.add(f"lag {queue}", "warn", f"{lag} entries and no live worker reads {queue}")
            else:
                self.add(f"lag {queue}", "ok", f"{lag} entries waiting")
        if not queues:
            self.add("stream lag", "ok", "no queue in use")

    async def _topology(self) -> None:
        """Primary or standby, who streams, and whether a commit waits for a standby."""
        async with c.connect(self.cfg) as conns:
            seen = await read_topology(conns.store.db)
        self.add("topology", *topology_verdict(seen))

    async def _lost_admissions(self) -> None:
        """Wakes in Redis naming runs Postgres does not have.

        A wake is published after its run's admission commits, and Redis outlives a
        Postgres failover: a run it names that the database lacks was acknowledged and
        then lost (a promoted standby that never received it), unless it was pruned.
        """
        client = c.redis_client(self.cfg)
        ids: set[str] = set()
        try:
            streams = Streams(client, self.cfg.redis_prefix)
            for queue in self.active_queues or self.queues or ["default"]:
                for lane in Lane:
                    key = streams.stream_key(queue, lane)
                    for _, fields in await client.xrevrange(key, count=WAKES_CHECKED) or []:
                        data = fields.get(FIELD) if fields else None
                        if isinstance(data, bytes):
                            with contextlib.suppress(MalformedMessage):
                                ids.add(decode(data).run)
        finally:
            await client.aclose()
        async with c.connect(self.cfg) as conns:
            missing = await missing_runs(conns.store.db, sorted(ids))
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            self.add(
                "lost admissions",
                "warn",
                f"{len(missing)} run(s) named by wakes in Redis are not in Postgres ({shown}): "
                "acknowledged to a producer and then lost, as a failover to an asynchronous "
                "standby loses them (or pruned since); re-enqueue them from the producer's side",
            )
        else:
            detail = f"every run named by {len(ids)} recent wake(s) exists"
            self.add("lost admissions", "ok", detail)


def stranding(lane: Lane, found: LaneHealth) -> str:
    """What keeps one lane from delivering, in words (``runfleet doctor``)."""
    assert found.fault is not None
    where = f"{lane.value} lane {found.key}"
    match found.fault:
        case Fault.GROUP_AHEAD:
            return (
                f"{where}: group delivered up to {found.delivered}, past the stream's last id "
                f"{found.written}; nothing written up to there is delivered"
            )
        case Fault.NO_GROUP:
            return (
                f"{where}: the stream has no consumer group (the next worker read recreates "
                "it from id 0)"
            )
        case Fault.WRONG_TYPE:
            return f"{where}: a key of type {found.found} holds the stream's name"
        case Fault.MISSING:
            return f"{where}: no stream"
        case _:
            assert_never(found.fault)


def topology_verdict(seen: Topology) -> tuple[Literal["ok", "warn", "fail"], str]:
    timeline = f", timeline {seen.timeline}" if seen.timeline and seen.timeline > 1 else ""
    match seen.role:
        case Role.STANDBY:
            lag = "?" if seen.replay_lag_s is None else f"{seen.replay_lag_s:.1f} s"
            return "fail", (
                f"connected to a standby (read-only, from {seen.upstream or '?'}, replay lag "
                f"{lag}): RUNFLEET_DATABASE_URL must reach the primary "
                "(list every host with target_session_attrs=read-write)"
            )
        case Role.PRIMARY:
            if not seen.standbys:
                return "ok", f"primary, no standby streams from it{timeline}"
            parts = []
            for s in seen.standbys:
                lag = "?" if s.replay_lag_s is None else f"{s.replay_lag_s:.2f} s"
                behind = "" if s.replay_behind_bytes is None else f", {s.replay_behind_bytes} B"
                parts.append(f"{s.name or s.client} {s.sync_state or '?'} {s.state or '?'} "
                             f"(replay lag {lag}{behind})")  # fmt: skip
            detail = (
                f"primary{timeline}; standbys: {'; '.join(parts)}; synchronous_commit="
                f"{seen.synchronous_commit}, synchronous_standby_names="
                f"{seen.synchronous_standby_names!r}"
            )
            if seen.commits_wait_for_standby:
                return "ok", f"{detail}: a commit waits for a synchronous standby"
            if not seen.standbys_readable and seen.may_wait_for_standby:
                return "warn", f"{detail}: {UNKNOWN_SYNC}"
            return "warn", f"{detail}: replication is asynchronous; {ASYNC_LOSS}"
        case _ as never:
            assert_never(never)
