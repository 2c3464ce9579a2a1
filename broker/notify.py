"""Cancel and settled fast paths over Redis pub/sub: hints that Postgres backs up.

``cancel`` lets an owner act on a durable cancel request in milliseconds rather
than at its next heartbeat poll; ``settled`` wakes producers blocked in
``run.wait()``. Pub/sub is fire-and-forget: a notice published while nobody
listens, or while Redis is away, is simply lost, so every consumer of these
notices also polls Postgres and a failure to publish is logged, never raised.

Anyone who can write to Redis can publish on these channels, so a payload is
parsed only after a size cap and any defect (non-UTF-8, deep nesting that would
exhaust the parser's recursion, wrong types) is dropped through
``broker.hostile``: counted, logged at a bounded rate, survived. No method here
lets a Redis problem or a hostile payload escape into a worker's task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeAlias

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from runfleet.broker import hostile
from runfleet.broker.client import require_binary
from runfleet.broker.keys import DEFAULT_PREFIX, Keys
from runfleet.runtime.service import Service, Signal, within
from runfleet.store.types import RunStatus

log = logging.getLogger("runfleet.broker.notify")

ChannelKind: TypeAlias = Literal["cancel", "settled"]
DEFAULT_TIMEOUT = 1.0
_BACKOFF_INITIAL = 0.1
_BACKOFF_MAX = 5.0
_POLL_S = 1.0
_MAX_PAYLOAD_BYTES = 4096
"""Far above any real notice (a run id of at most 255 characters and a status word)."""
_MAX_FIELD_CHARS = 255


@dataclass(frozen=True, slots=True)
class Notice:
    """One hint: run ``run_id`` was asked to cancel, or settled with ``status``."""

    kind: ChannelKind
    run_id: str
    status: RunStatus | None = None


Callback: TypeAlias = Callable[[Notice], Awaitable[None] | None]

RECENT_NOTICES = 16_384
"""The settled notices a shared subscription remembers (``SettledMark``): at a fleet's 5,000
settles a second, three seconds' worth; a wait that comes later reads Postgres first."""


@dataclass(frozen=True, slots=True, eq=False)
class SettledMark:
    """Where a loop's shared settled subscription stood just before an admission committed
    (``Notifier.settled_mark``): which hub, which confirmed subscription of it, how many
    notices it had received. While that subscription lasts and has forgotten none of the
    notices received since, it has every settle of the runs that admission created: a wait
    of one of them need not read Postgres before its notice comes (``SettledWatch.caught_up``).
    """

    hub: weakref.ref[_SettledHub]  # a job kept for long keeps no closed subscription alive
    subscription: int
    received: int


async def _close_quietly(pubsub: PubSub) -> None:
    """Release a pubsub connection; errors are moot, the connection is being dropped anyway."""
    with contextlib.suppress(Exception):
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # redis-py < 8 leaves it unannotated


class MalformedNotice(ValueError):
    """A channel payload runfleet did not write; ``str(exc)`` says why."""


def _decode(kind: ChannelKind, data: Any) -> Notice:
    """Parse a channel payload (JSON, so ``redis-cli subscribe`` shows it readably).

    Raises ``MalformedNotice`` and nothing else, whatever ``data`` is: the size is
    capped before parsing, and a nesting deep enough to exhaust the JSON parser's
    recursion (a ``RecursionError``, which once killed every worker) is a defect
    like any other.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedNotice(f"expected bytes, got {type(data).__name__}")
    if len(data) > _MAX_PAYLOAD_BYTES:
        raise MalformedNotice(f"{len(data)} bytes exceeds {_MAX_PAYLOAD_BYTES}")
    try:
        value = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError, MemoryError, TypeError, OverflowError) as exc:
        raise MalformedNotice(f"not JSON: {type(exc).__name__}") from exc
    if not isinstance(value, dict):
        raise MalformedNotice(f"not an object: JSON {type(value).__name__}")
    run, status = value.get("run"), value.get("status")
    if not isinstance(run, str) or not run or len(run) > _MAX_FIELD_CHARS:
        raise MalformedNotice("payload has no valid run id")
    if status is not None and (not isinstance(status, str) or len(status) > _MAX_FIELD_CHARS):
        raise MalformedNotice("status is not a short string")
    if kind == "settled" and status is None:
        raise MalformedNotice("settled payload has no status")
    if status is not None and status not in RunStatus._value2member_map_:
        raise MalformedNotice("status is not a run status")
    return Notice(kind, run, None if status is None else RunStatus(status))


def _notice_of(kind: ChannelKind, msg: Any) -> Notice | None:
    """The notice in a pubsub message; ``None`` for anything else (dropped and counted)."""
    if not isinstance(msg, dict) or msg.get("type") not in ("message", b"message"):
        return None
    try:
        return _decode(kind, msg.get("data"))
    except MalformedNotice as exc:
        hostile.dropped(log, kind, "notify.malformed", str(exc))
        return None


# Why a script: a worker settles runs in batches and announces each (one PUBLISH per run);
# redis-py packs, sends and parses every command in Python, a tenth of a draining
# worker's CPU when each notice is its own PUBLISH. One script call carries a batch's
# notices, published in order; subscribers receive exactly the messages single PUBLISHes
# would have sent.
SETTLED_SCRIPT = """
--[[ runfleet: PUBLISH each of ARGV[1..n] on the channel KEYS[1], in order.
KEYS[1]    = the settled channel ({prefix}:settled; named as a key so a cluster routes the
             call by the prefix's slot: PUBLISH itself reaches every node)
ARGV[1..n] = the notices (encoded messages)
Returns    the number of notices published
]]
for i = 1, #ARGV do
  redis.call('PUBLISH', KEYS[1], ARGV[i])
end
return #ARGV
"""


class Notifier:
    """Publishes and subscribes to the cancel and settled channels of one prefix."""

    def __init__(
        self, redis: Redis, prefix: str = DEFAULT_PREFIX, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._redis = require_binary(redis)
        self._keys = Keys(prefix)
        self._timeout = timeout
        self._settled_script = self._redis.register_script(SETTLED_SCRIPT)
        self._hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SettledHub] = (
            weakref.WeakKeyDictionary()
        )

    def channel(self, kind: ChannelKind) -> str:
        return self._keys.cancel_channel if kind == "cancel" else self._keys.settled_channel

    async def publish_cancel(self, run_id: str) -> bool:
        """Tell the owner of ``run_id`` to look at its (already durable) cancel request."""
        return await self._publish("cancel", {"run": run_id}, "notify.cancel_failed")

    async def publish_settled(self, run_id: str, status: RunStatus) -> bool:
        """Wake producers waiting on ``run_id``; call after the settling transaction committed."""
        payload = {"run": run_id, "status": status.value}
        return await self._publish("settled", payload, "notify.settled_failed")

    async def publish_settled_many(self, settled: Sequence[tuple[str, RunStatus]]) -> bool:
        """``publish_settled`` for every (run id, status), in order, in one script call
        (``SETTLED_SCRIPT``); never raises."""
        if not settled:
            return True
        notices = [
            json.dumps({"run": run_id, "status": status.value}) for run_id, status in settled
        ]
        try:
            async with asyncio.timeout(self._timeout):
                await self._settled_script(keys=[self.channel("settled")], args=notices)
        except Exception as exc:
            hostile.error_reply(
                log, "notify-publish", "notify.settled_failed", exc, run_id=settled[0][0]
            )
            return False
        return True

    async def _publish(self, kind: ChannelKind, payload: dict[str, str], event: str) -> bool:
        """Publish within ``timeout``; ``False`` (and a warning) if Redis did not take it.

        Never raises (callers announce after a commit and must not fail for a hint):
        an error reply (NOPERM, READONLY…) or a lost connection is counted and logged
        at a bounded rate.
        """
        try:
            async with asyncio.timeout(self._timeout):
                await self._redis.publish(self.channel(kind), json.dumps(payload))
        except Exception as exc:
            hostile.error_reply(log, "notify-publish", event, exc, run_id=payload["run"])
            return False
        return True

    async def _subscribe(self, pubsub: PubSub, channel: str) -> None:
        """Subscribe and wait for the server's confirmation: only then is nothing missed."""
        async with asyncio.timeout(self._timeout):
            await pubsub.subscribe(channel)
            while True:
                msg = await pubsub.get_message(timeout=self._timeout)
                if msg is not None and msg.get("type") in ("subscribe", b"subscribe"):
                    return

    async def listen(
        self,
        kind: ChannelKind,
        *,
        on_ready: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        max_backoff: float = _BACKOFF_MAX,
        log_subscribed: bool = True,
    ) -> AsyncGenerator[Notice, None]:
        """Yield notices forever, resubscribing with jittered backoff whenever Redis goes away.

        Notices published while disconnected are lost; ``on_ready`` runs after each
        (re)subscription so a caller can re-check Postgres for what it may have missed,
        ``on_lost`` when the connection drops.

        Never raises (only cancellation ends it): error replies (NOPERM, LOADING…),
        lost connections and anything unforeseen resubscribe after the backoff, and
        hostile payloads are dropped (``notify.malformed``), so this loop can live in
        a worker's task group without ever taking the worker down.
        """
        channel = self.channel(kind)
        backoff = _BACKOFF_INITIAL
        while True:
            pubsub = self._redis.pubsub()
            try:
                await self._subscribe(pubsub, channel)
                backoff = _BACKOFF_INITIAL
                if log_subscribed:  # a producer's watches come and go: not worth a line
                    log.info("notify.subscribed", extra={"channel": channel})
                if on_ready is not None:
                    on_ready()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_POLL_S)
                    notice = _notice_of(kind, msg)
                    if notice is not None:
                        yield notice
            except Exception as exc:
                if on_lost is not None:
                    with contextlib.suppress(Exception):
                        on_lost()
                hostile.error_reply(
                    log,
                    f"notify-{kind}",
                    "notify.subscription_lost",
                    exc,
                    channel=channel,
                    retry_in_s=backoff,
                )
            finally:
                await _close_quietly(pubsub)
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, max_backoff)

    def subscription(
        self, kind: ChannelKind, callback: Callback, *, signals: SubscriptionSignals | None = None
    ) -> Subscription:
        """A service that calls ``callback`` for each notice of ``kind``; see ``Subscription``."""
        return Subscription(self, kind, callback, signals=signals)

    def watch_settled(self, *run_ids: str) -> SettledWatch:
        """Subscribe before checking Postgres, so a settle between check and wait is not missed."""
        return SettledWatch(self, frozenset(run_ids))

    def settled_shared(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Whether the shared settled subscription of ``loop`` (default: the running loop)
        is up and confirmed: a ``watch_settled`` entered on it now costs no round trip
        (``AsyncRun.wait`` then skips its read before subscribing). Asked from another
        thread it is a hint: entering still waits for the subscription if it went down."""
        return self._live_hub(loop) is not None

    def settled_mark(self, loop: asyncio.AbstractEventLoop | None = None) -> SettledMark | None:
        """Where the shared settled subscription of ``loop`` (default: the running loop)
        stands now, if it is up and confirmed; taken before an admission commits
        (``SettledMark``). Read from another thread it may be stale, never wrong: a
        subscription lost meanwhile fails the mark's check at the wait."""
        hub = self._live_hub(loop)
        if hub is None:
            return None
        return SettledMark(weakref.ref(hub), hub.subscriptions, hub.received)

    def _live_hub(self, loop: asyncio.AbstractEventLoop | None) -> _SettledHub | None:
        """The shared settled subscription of ``loop`` (default: the running loop), if it is
        up and confirmed."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # driven inline, in a caller's thread (``store.inline``)
                return None
        hub = self._hubs.get(loop)
        return hub if hub is not None and hub.live else None

    def _settled_hub(self) -> _SettledHub:
        """The running loop's shared settled subscription (``SettledWatch``)."""
        loop = asyncio.get_running_loop()
        hub = self._hubs.get(loop)
        if hub is None:
            hub = self._hubs[loop] = _SettledHub(self)
        return hub

    def _drop_hub(self, hub: _SettledHub) -> None:
        for loop, found in list(self._hubs.items()):
            if found is hub:
                del self._hubs[loop]

    async def wait_settled(self, run_id: str, timeout: float) -> Notice | None:
        """Return the settled notice for ``run_id``, or ``None`` after ``timeout``.

        Subscribes on entry, so a settle that committed just before the call is missed;
        callers check Postgres after each return (or use ``watch_settled``).
        """
        async with self.watch_settled(run_id) as watch:
            return await watch.wait(timeout)


class SettledWatch:
    """A settled-channel watch scoped to some run ids.

    Usage: ``async with notifier.watch_settled(rid) as w:`` check Postgres, then
    ``await w.wait(t)`` and check again. The watches of one notifier on one event loop
    share one subscription (``_SettledHub``): entering waits until it is confirmed, so a
    notice published after that reaches the watch. If Redis is unavailable ``wait`` sleeps
    out its timeout and returns ``None``, so a caller's poll loop keeps its pace. Neither
    entering nor ``wait`` raises for Redis or for hostile payloads on the channel:
    ``run.wait()`` always reaches its next Postgres poll.
    """

    def __init__(self, notifier: Notifier, run_ids: frozenset[str]) -> None:
        self._notifier = notifier
        self.run_ids = run_ids
        self._hub: _SettledHub | None = None
        self._notices: list[Notice] = []
        self._arrived = asyncio.Event()

    def deliver(self, notice: Notice) -> None:
        self._notices.append(notice)
        self._arrived.set()

    def read_again(self) -> None:
        """End the current ``wait`` with no notice: its caller reads Postgres again."""
        self._arrived.set()

    async def __aenter__(self) -> SettledWatch:
        self._hub = await self._notifier._settled_hub().enter(self)
        return self

    def caught_up(self, mark: SettledMark | None) -> bool:
        """Whether this watch's notices are complete since ``mark``: the subscription it
        entered is the one ``mark`` saw, still up, and has forgotten none of the notices
        received since (those of its runs are handed to it now). True: a run admitted
        after ``mark`` has not settled unless a notice says so, and its caller may wait
        before reading Postgres. False: read first, as without a mark."""
        hub = self._hub
        if mark is None or hub is None or mark.hub() is not hub:
            return False
        return hub.caught_up(self, mark)

    async def wait(self, timeout: float) -> Notice | None:
        """The first settled notice for a watched run within ``timeout``, else ``None``."""
        if not self._notices:
            await within(self._arrived, max(0.0, timeout))
        notice = self._notices.pop(0) if self._notices else None
        if not self._notices:
            self._arrived.clear()
        return notice

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            await hub.leave(self)


class _SettledHub:
    """One subscription to the settled channel, shared by every ``SettledWatch`` entered
    while it runs (one notifier, one event loop): each notice goes to the watches of its
    run, where one subscription per watch had every watch receive (and parse) every
    notice of the fleet, and each pay a subscription's round trips. Started by the first
    watch and closed when the last one leaves; a resubscription after a lost connection
    wakes every watch (a notice may have been missed: its caller reads Postgres again).
    """

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier
        self._watches: dict[str, set[SettledWatch]] = {}
        self._users = 0
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._subscriptions = 0
        self._received = 0
        self._recent: dict[str, tuple[int, Notice]] = {}
        """The latest notices received, by run (``RECENT_NOTICES``), each with its number."""
        self._forgotten_through = 0
        """The number of the newest notice forgotten to keep ``_recent`` bounded."""

    @property
    def live(self) -> bool:
        """Listening, with its subscription confirmed."""
        return self._task is not None and self._ready.is_set()

    @property
    def subscriptions(self) -> int:
        """How many times the subscription was confirmed (a resubscription may have missed
        notices)."""
        return self._subscriptions

    @property
    def received(self) -> int:
        """How many notices it has received."""
        return self._received

    def caught_up(self, watch: SettledWatch, mark: SettledMark) -> bool:
        """``SettledWatch.caught_up``: hands ``watch`` the notices of its runs received
        since ``mark``."""
        if (
            not self.live
            or self._subscriptions != mark.subscription
            or self._forgotten_through > mark.received
        ):
            return False
        for run_id in watch.run_ids:
            seen = self._recent.get(run_id)
            if seen is not None and seen[0] > mark.received:
                watch.deliver(seen[1])
        return True

    def _remember(self, notice: Notice) -> None:
        self._received += 1
        self._recent.pop(notice.run_id, None)  # the newest last, in the order received
        self._recent[notice.run_id] = (self._received, notice)
        if len(self._recent) > RECENT_NOTICES:
            oldest = next(iter(self._recent))
            self._forgotten_through = self._recent.pop(oldest)[0]

    async def enter(self, watch: SettledWatch) -> _SettledHub:
        self._users += 1
        for run_id in watch.run_ids:
            self._watches.setdefault(run_id, set()).add(watch)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name="notify-settled-shared"
            )
        try:
            # Confirmed before the caller reads Postgres: nothing published after is missed.
            await within(self._ready, self._notifier._timeout)
        except BaseException:  # cancelled while entering: no exit will follow
            self._unregister(watch)
            raise
        return self

    async def leave(self, watch: SettledWatch) -> None:
        task = self._unregister(watch)
        if task is not None:
            await asyncio.wait({task})  # its subscription closed (a cancel of ours still raises)

    def _unregister(self, watch: SettledWatch) -> asyncio.Task[None] | None:
        """Forget ``watch``; with the last one gone, stop listening. Returns the stopping
        listener, if this was the last watch."""
        for run_id in watch.run_ids:
            watches = self._watches.get(run_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[run_id]
        self._users -= 1
        if self._users > 0:
            return None
        self._notifier._drop_hub(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    def _subscribed(self) -> None:
        self._ready.set()
        self._subscriptions += 1
        if self._subscriptions == 1:
            return
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.read_again()  # anything published while away was lost

    async def _listen(self) -> None:
        notices = self._notifier.listen(
            "settled", on_ready=self._subscribed, on_lost=self._ready.clear, log_subscribed=False
        )
        try:
            async for notice in notices:
                self._remember(notice)
                for watch in list(self._watches.get(notice.run_id, ())):
                    watch.deliver(notice)
        finally:
            await notices.aclose()


@dataclass(frozen=True)
class SubscriptionSignals:
    """Points of a subscription a test waits on instead of polling (``runtime.service.Signal``)."""

    subscribed: Signal[None] = field(default_factory=Signal)
    """A (re)subscription was confirmed by the server: from now on nothing is missed."""
    handled: Signal[Notice] = field(default_factory=Signal)
    """The callback for this notice returned (or raised, and that was logged)."""


class Subscription(Service):
    """Runs ``callback`` for every notice of one channel kind until stopped.

    A service (``runtime.service``): ``start``/``stop`` are idempotent, stopping before
    starting is harmless, ``wait_stopped`` waits until the listener closed its connection.
    Survives Redis restarts (``Notifier.listen`` resubscribes). A callback that
    raises is logged (``notify.callback_failed``) and the subscription goes on: a
    missed hint costs latency, never correctness. Callbacks run one at a time.
    """

    def __init__(
        self,
        notifier: Notifier,
        kind: ChannelKind,
        callback: Callback,
        *,
        signals: SubscriptionSignals | None = None,
    ) -> None:
        super().__init__()
        self.name = f"notify-{kind}"
        self._notifier = notifier
        self._kind = kind
        self._callback = callback
        self._signals = signals
        self._ready = asyncio.Event()

    @property
    def ready(self) -> bool:
        """Subscribed right now (false while reconnecting)."""
        return self._ready.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        """Wait until subscribed; ``False`` if that took longer than ``timeout``."""
        return await within(self._ready, timeout)

    async def _serve(self) -> None:
        try:
            await self._until_stopped(self._listen())
        finally:
            self._ready.clear()

    def _subscribed(self) -> None:
        self._ready.set()
        if self._signals is not None:
            self._signals.subscribed.fire(None)

    async def _listen(self) -> None:
        notices = self._notifier.listen(
            self._kind, on_ready=self._subscribed, on_lost=self._ready.clear
        )
        try:
            async for notice in notices:
                try:
                    result = self._callback(notice)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception(
                        "notify.callback_failed",
                        extra={"kind": self._kind, "run_id": notice.run_id},
                    )
                if self._signals is not None:
                    self._signals.handled.fire(notice)
        finally:
            await notices.aclose()
