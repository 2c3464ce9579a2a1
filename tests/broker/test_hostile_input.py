"""Hostile bytes are dropped, not fatal: every broker decoder and loop.

Anyone who can write to Redis can publish on the cancel/settled channels, append
to a stream or overwrite a liveness key. The decoders are fuzzed with arbitrary
bytes (only the typed "malformed" outcome may come out), and the loops that read
the channels are fed the payloads that once killed every worker, plus Redis error
replies (NOPERM) while subscribing.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from runfleet.broker import hostile
from runfleet.broker.client import connect
from runfleet.broker.codec import MalformedMessage, decode
from runfleet.broker.liveness_keys import KeyRead, judge, unpack
from runfleet.broker.notify import MalformedNotice, Notice, Notifier, SubscriptionSignals, _decode
from runfleet.store.types import RunStatus
from tests.broker.helpers import acl
from tests.support.polling import until

DEEP_JSON = b"[" * 200_000 + b"]" * 200_000
"""The payload that raised RecursionError out of the cancel listener and killed workers."""
DEEP_MSGPACK = b"\x91" * 200_000 + b"\xc0"

HOSTILE_PAYLOADS: list[bytes] = [
    DEEP_JSON,
    b"[" * 3000 + b"]" * 3000,  # under the size cap, over the parser's recursion limit
    b'{"run": "' + b"\xff\xfe" * 10 + b'"}',  # not UTF-8
    b'{"run": "\\ud800"}'[:-1],  # truncated JSON
    b'{"run": ' + b"9" * 5000 + b"}",  # a huge number (and over the cap)
    b'{"run": 1, "status": []}',
    b'{"run": "' + b"r" * 300 + b'"}',  # a run id longer than any runfleet writes
    b'"just a string"',
    b"null",
    b"\x00\x01\x02",
    b"",
    b"x" * 1_000_000,
]


# ---- decoders, fuzzed ------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048))
@example(data=DEEP_JSON)
@example(data=DEEP_MSGPACK)
@example(data=b'{"run": "r1", "status": "completed"}')
def test_any_bytes_into_the_notice_decoder_raise_only_malformed(data: bytes) -> None:
    for kind in ("cancel", "settled"):
        try:
            notice = _decode(kind, data)
        except MalformedNotice:
            continue
        assert isinstance(notice, Notice) and notice.run_id
        assert notice.status is None or isinstance(notice.status, RunStatus)


def test_a_notice_with_a_status_no_run_has_is_malformed() -> None:
    with pytest.raises(MalformedNotice, match="not a run status"):
        _decode("settled", b'{"run": "r1", "status": "sideways"}')
    assert _decode("settled", b'{"run": "r1", "status": "failed"}').status is RunStatus.FAILED


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=30,
    )
)
def test_any_json_value_into_the_notice_decoder_raises_only_malformed(value: object) -> None:
    data = json.dumps(value).encode()
    try:
        _decode("settled", data)
    except MalformedNotice:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048))
@example(data=DEEP_MSGPACK)
@example(data=b"\xdd\xff\xff\xff\xff")
def test_any_bytes_into_the_stream_decoder_raise_only_malformed(data: bytes) -> None:
    try:
        decode(data)
    except MalformedMessage:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=20,
    )
)
def test_any_msgpack_value_into_the_stream_decoder_raises_only_malformed(value: object) -> None:
    try:
        decode(msgpack.packb(value))
    except MalformedMessage:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048), ttl=st.integers(-2, 10**9), hb=st.integers(-(2**70), 2**70))
@example(data=DEEP_MSGPACK, ttl=3000, hb=0)
def test_any_bytes_at_a_liveness_key_are_judged_never_raised(
    data: bytes, ttl: int, hb: int
) -> None:
    seen = judge(KeyRead(ttl, len(data), data), 30_000, hb, 2000)
    assert seen.state in {
        "absent",
        "malformed",
        "without-ttl",
        "ttl-implausible",
        "lapsed",
        "inconsistent",
        "consistent",
    }
    if seen.state == "consistent":
        unpack(data)  # vouching needs a value that decodes


# ---- the channel loops, against a real Redis ---------------------------------------


async def test_deep_json_on_the_cancel_channel_does_not_end_the_listener(
    notifier: Notifier, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    signals = SubscriptionSignals()
    sub = notifier.subscription("cancel", lambda n: seen.append(n.run_id), signals=signals)
    sub.start()
    before = hostile.HOSTILE_INPUT.labels("cancel")._value.get()
    try:
        assert await sub.wait_ready(3.0)
        with caplog.at_level(logging.WARNING, logger="runfleet.broker.notify"):
            for payload in HOSTILE_PAYLOADS:
                await redis.publish(notifier.channel("cancel"), payload)
            await notifier.publish_cancel("after-the-garbage")
            await signals.handled.wait(5.0)
        assert seen == ["after-the-garbage"]
        assert sub.ready
        dropped = hostile.HOSTILE_INPUT.labels("cancel")._value.get() - before
        assert dropped == len(HOSTILE_PAYLOADS)
        # Rate-limited: one line for the whole burst, not one per payload.
        lines = [r for r in caplog.records if r.getMessage() == "notify.malformed"]
        assert len(lines) == 1, [r.__dict__.get("reason") for r in lines]
    finally:
        sub.stop()
        await sub.wait_stopped(1.0)


async def test_deep_json_on_the_settled_channel_does_not_break_a_watch(
    notifier: Notifier, redis: Redis
) -> None:
    async with notifier.watch_settled("r1") as watch:
        for payload in HOSTILE_PAYLOADS:
            await redis.publish(notifier.channel("settled"), payload)
        await notifier.publish_settled("r1", RunStatus.COMPLETED)
        assert await watch.wait(5.0) == Notice("settled", "r1", RunStatus.COMPLETED)


@pytest.fixture
async def acl_user(redis: Redis, redis_url: str) -> AsyncIterator[tuple[str, Redis]]:
    """A Redis user that may run any command but subscribe to no channel (NOPERM)."""
    user = f"rft-{uuid.uuid4().hex[:8]}"
    await acl(redis, "SETUSER", user, "reset", "on", "nopass", "~*", "resetchannels", "+@all")
    base, db = redis_url.rsplit("/", 1)
    client = connect(base.replace("redis://", f"redis://{user}:x@") + f"/{db}")
    try:
        yield user, client
    finally:
        await client.aclose()
        await acl(redis, "DELUSER", user)


async def test_noperm_on_subscribe_is_retried_until_granted(
    acl_user: tuple[str, Redis], redis: Redis, redis_prefix: str
) -> None:
    user, client = acl_user
    restricted = Notifier(client, redis_prefix)
    before = sum(
        hostile.REDIS_ERRORS.labels("notify-cancel", code)._value.get()
        for code in ("NOPERM", "other")
    )
    signals = SubscriptionSignals()
    sub = restricted.subscription("cancel", lambda n: None, signals=signals)
    sub.start()
    try:

        async def refused() -> float:
            return sum(  # type: ignore[no-any-return]  # prometheus_client's private _value.get() is untyped
                hostile.REDIS_ERRORS.labels("notify-cancel", code)._value.get()
                for code in ("NOPERM", "other")
            )

        await until(refused, timeout=5.0, accept=lambda n: n >= before + 2)
        assert not sub.ready
        # publish_* never raises either, even refused.
        assert await restricted.publish_cancel("refused") is False
        await acl(redis, "SETUSER", user, "allchannels")
        assert await sub.wait_ready(10.0)
        await Notifier(redis, redis_prefix).publish_cancel("granted")
        await signals.handled.until(lambda n: n.run_id == "granted", 5.0)
    finally:
        sub.stop()
        await sub.wait_stopped(1.0)


async def test_noperm_on_a_watch_falls_back_to_polling(
    acl_user: tuple[str, Redis], redis_prefix: str
) -> None:
    _, client = acl_user
    restricted = Notifier(client, redis_prefix)
    async with restricted.watch_settled("r1") as watch:
        assert await watch.wait(0.3) is None  # slept out its timeout, raised nothing
