"""The stream message codec: exact round trips, and a typed error for every defect."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from pydantic import ValidationError

from runfleet.broker.codec import MalformedMessage, StreamMessage, decode, encode
from runfleet.broker.keys import Keys, glob_escape
from runfleet.store.errors import RunfleetError
from runfleet.store.types import Owner


def good(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1,
        "kind": "wake",
        "run": "order-42",
        "flow": "orders.fulfil",
        "reason": "timer",
        "at_ms": 1_700_000_000_000,
    }
    base.update(overrides)
    return base


def packed(value: object) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def test_round_trip() -> None:
    msg = StreamMessage(kind="schedule", run="r" * 255, flow="f", reason="", at_ms=0)
    data = encode(msg)
    assert isinstance(data, bytes)
    assert decode(data) == msg
    assert msgpack.unpackb(data) == msg.model_dump()


def test_message_is_frozen() -> None:
    msg = StreamMessage.model_validate(good())
    with pytest.raises(ValidationError):
        msg.run = "other"


def test_unknown_extra_keys_are_ignored() -> None:
    assert decode(packed(good(trace="abc"))) == StreamMessage.model_validate(good())


def test_malformed_is_a_runfleet_error() -> None:
    assert issubclass(MalformedMessage, RunfleetError)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not msgpack"),
        (b"\xc1", "not msgpack"),  # the one byte msgpack never uses
        (b"\xa2\xff\xfe", "not msgpack"),  # a str that is not UTF-8
        (packed(good()) + b"\x00", "not msgpack"),  # trailing bytes
        (b"\x81\x01\x02", "not msgpack"),  # integer map key
        (packed([1, "wake"]), "not a map"),
        (packed("wake"), "not a map"),
        (packed(7), "not a map"),
        (b"x" * 70_000, "exceeds"),
    ],
)
def test_undecodable_bytes(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage) as err:
        decode(data)
    assert reason in err.value.reason


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"v": 2}, "v"),
        ({"v": True}, "v"),
        ({"v": 1.0}, "v"),
        ({"kind": "explode"}, "kind"),
        ({"run": ""}, "run"),
        ({"run": "r" * 256}, "run"),
        ({"run": b"bytes-not-str"}, "run"),
        ({"flow": ""}, "flow"),
        ({"at_ms": -1}, "at_ms"),
        ({"at_ms": "5"}, "at_ms"),
        ({"at_ms": True}, "at_ms"),
        ({"at_ms": 1.5}, "at_ms"),
        ({"reason": None}, "reason"),
    ],
)
def test_invalid_fields(fields: dict[str, Any], where: str) -> None:
    with pytest.raises(MalformedMessage) as err:
        decode(packed(good(**fields)))
    assert err.value.reason.startswith("invalid fields")
    assert where in err.value.reason


@pytest.mark.parametrize("missing", ["kind", "run", "flow", "reason", "at_ms"])
def test_missing_field(missing: str) -> None:
    fields = good()
    del fields[missing]
    with pytest.raises(MalformedMessage, match=missing):
        decode(packed(fields))


def test_non_bytes_input() -> None:
    with pytest.raises(MalformedMessage, match="expected bytes"):
        decode("not bytes")  # type: ignore[arg-type]  # the point: a str must be refused


def test_key_names_from_one_prefix() -> None:
    keys = Keys("pfx")
    owner = Owner("web:1", 42, "ab12")
    assert keys.stream("default") == "pfx:q:default"
    assert keys.alive(owner) == "pfx:alive:web:1:42:ab12"
    assert keys.cancel_channel == "pfx:cancel"
    assert keys.settled_channel == "pfx:settled"
    # A host id may hold ':'; pid and nonce never do, so the key parses back exactly.
    assert keys.owner_of(keys.alive(owner)) == owner
    assert keys.owner_of("pfx:alive:nonsense") is None
    assert keys.owner_of("other:alive:h:1:n") is None


def test_default_prefix_and_pattern_escaping() -> None:
    assert Keys().stream("q") == "runfleet:q:q"
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    assert Keys("x[1]").alive_pattern == "x\\[1\\]:alive:*"
