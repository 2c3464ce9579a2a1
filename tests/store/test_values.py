"""Faithful values: what a step records, a run returns or a completion carries comes back
identical in value and type from real Postgres, and what cannot be stored is refused once.

jsonb rewrites numbers (``1e16`` -> ``10000000000000000``, ``-0.0`` -> ``0.0``), so these
tests would fail on any path that still stores a recorded value as jsonb.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runfleet.store import Store, values
from runfleet.store.errors import ExecutionIdentityConflict
from runfleet.store.types import (
    AdmissionOptions,
    Created,
    Joined,
    NewRun,
    RqOptions,
    RunStatus,
    Transitioned,
)
from runfleet.store.values import UnstorableValue, encode_canonical
from tests.store.helpers import OWNER_A, make_running, must_get

SPECIALS: list[Any] = [
    1e16,
    -0.0,
    2.0**60,
    1e21,
    5e-324,
    1.7976931348623157e308,
    2**63,
    -(2**70),
    10**30,
    1.5e300,
    0.1,
    'unicode é ☃ 𝄞 \u2028 \\u0000 "quoted" \\ back\nslash\t',
]

_TEXT = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**256), max_value=2**256)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(SPECIALS)
    | st.text(_TEXT)
)
_KEYS = st.text(_TEXT)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=25,
)


def _meta(meta: dict[str, Any]) -> AdmissionOptions:
    """Options carrying ``meta`` (any JSON the producer gave)."""
    return AdmissionOptions(rq=RqOptions(meta=meta))


def identical(a: Any, b: Any) -> bool:
    """Same value and same type all the way down (``-0.0`` is not ``0.0``, ``1.0`` not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    return bool(a == b)


def test_identical_tells_the_cases_jsonb_confuses_apart() -> None:
    assert not identical(-0.0, 0.0) and not identical(1.0, 1) and not identical(True, 1)
    assert identical({"a": [1e16]}, {"a": [1e16]})


# ---- the property: record -> read back -> identical, digest intact --------------


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=JSON)
@example(value=SPECIALS)
@example(value={"b": {"z": -0.0, "a": [2**63, 1e21]}, "a": 5e-324})
async def test_recorded_values_come_back_identical_with_their_digest_intact(
    store: Store, value: Any
) -> None:
    run_id = f"v-{uuid.uuid4().hex[:10]}"
    await make_running(store, run_id)
    recorded = await store.steps.record(
        run_id, OWNER_A, 1, key="step:v#1", name="v", kind="step", position=0, output=value
    )
    assert recorded is not None
    (replayed,) = await store.steps.of_run(run_id)
    assert identical(replayed.output, value), (replayed.stored, value)
    assert replayed.intact
    assert replayed.digest == values.text_digest(replayed.stored)
    assert replayed.stored == encode_canonical(value, 10**9, "x")

    # The same value as a deferred's completion and as the run's result.
    await store.deferreds.complete_deferred(run_id, "d", value)
    deferred = await store.deferreds.deferred(run_id, "d")
    assert deferred is not None and identical(deferred.value, value)
    done = await store.lifecycle.transition_owned(
        run_id, OWNER_A, 1, RunStatus.COMPLETED, state_patch={"result": value}
    )
    assert isinstance(done, Transitioned) and identical(done.row.result, value)
    assert identical((await must_get(store, run_id)).result, value)


async def test_dict_key_order_does_not_change_the_digest(store: Store) -> None:
    await make_running(store, "r1")
    await make_running(store, "r2")
    a = await store.steps.record(
        "r1", OWNER_A, 1, key="k", name="k", kind="step", position=0, output={"a": 1, "b": 2.0}
    )
    b = await store.steps.record(
        "r2", OWNER_A, 1, key="k", name="k", kind="step", position=0, output={"b": 2.0, "a": 1}
    )
    assert a is not None and b is not None and a.digest == b.digest and a.stored == b.stored


async def test_a_changed_stored_text_fails_the_digest(store: Store, database_url: str) -> None:
    """The check is over the stored text: the same number written differently is a change."""
    await make_running(store, "r1")
    await store.steps.record(
        "r1", OWNER_A, 1, key="k", name="k", kind="step", position=0, output=[1e16]
    )
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("UPDATE runfleet.steps SET output = '[10000000000000000]'")
    (record,) = await store.steps.of_run("r1")
    assert record.output == [10**16] and not record.intact


async def test_rows_recorded_before_the_migration_are_checked_as_before(
    store: Store, database_url: str
) -> None:
    """A pre-0004 row holds jsonb's rendering and a digest over the value: still intact."""
    await make_running(store, "r1")
    await store.steps.record(
        "r1", OWNER_A, 1, key="k", name="k", kind="step", position=0, output={"a": [1, "x"]}
    )
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # What ALTER ... TYPE json USING output::json leaves behind for an old jsonb row.
        await conn.execute("UPDATE runfleet.steps SET output = output::text::jsonb::json")
        cur = await conn.execute("SELECT output::text FROM runfleet.steps")
        row = await cur.fetchone()
    assert row is not None and row[0] == '{"a": [1, "x"]}'
    (record,) = await store.steps.of_run("r1")
    assert record.intact and record.output == {"a": [1, "x"]}


# ---- what cannot be stored is refused, naming what and where ---------------------


def _deep(levels: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(levels):
        child: list[Any] = []
        node.append(child)
        node = child
    return root


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("x" * 200, "bytes encoded, the limit is 100"),
        ({"a": ["ok", "nul\x00"]}, '$["a"][1] contains a NUL'),
        ({"a": "\ud800"}, '$["a"] contains a lone surrogate'),
        ({"\udfff": 1}, "a key of $ contains a lone surrogate"),
        (_deep(100_000), "nested deeper than 512"),
        (_cycle(), "nested deeper than 512"),
        ([1, float("nan")], "$[1] is nan"),
        ({"x": float("-inf")}, '$["x"] is -inf'),
        ({"s": {1, 2}}, '$["s"] is a set'),
        ([b"bytes"], "$[0] is a bytes"),
        ({1: "a"}, "has a int key 1"),
        (10**5000, "cannot be encoded as JSON"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_encode_canonical_refuses_naming_the_problem_and_path(value: Any, problem: str) -> None:
    with pytest.raises(UnstorableValue) as caught:
        encode_canonical(value, 100 if isinstance(value, str) else 10**9, "result")
    assert caught.value.field == "result"
    assert problem in caught.value.problem, caught.value.problem


_HOSTILE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(codec=None))
    | st.sampled_from(["\x00", "\ud800", "a\\u0000", "\\\x00", float("nan")]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text() | st.integers() | st.sampled_from(["\ud800", "\x00"]), inner)
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(value=_HOSTILE)
def test_the_fast_path_refuses_exactly_what_the_full_check_refuses(value: Any) -> None:
    """``encode_canonical`` skips the per-scalar walk for plain values: it must agree with it."""
    try:
        values.check(value, "x")
        accepted = True
    except UnstorableValue:
        accepted = False
    try:
        text = encode_canonical(value, 10**9, "x")
    except UnstorableValue:
        assert not accepted
        return
    assert accepted and identical(values.decode(text), value)


def test_the_deepest_accepted_nesting_decodes() -> None:
    text = encode_canonical(_deep(values.MAX_DEPTH - 1), 10**6, "x")
    assert values.decode(text) == _deep(values.MAX_DEPTH - 1)


async def test_an_unstorable_step_output_writes_nothing(store: Store) -> None:
    await make_running(store, "r1")
    for bad in ("nul\x00", "\ud800", _deep(100_000), float("nan"), object()):
        with pytest.raises(UnstorableValue) as caught:
            await store.steps.record(
                "r1", OWNER_A, 1, key="step:a#1", name="a", kind="step", position=0, output=bad
            )
        assert caught.value.field == "step output of step:a#1"
    assert await store.steps.of_run("r1") == []
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING


async def test_data_postgres_refuses_at_write_is_unstorable_not_a_retry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever slips past the check and is refused by Postgres itself (SQLSTATE 22/54)."""
    await make_running(store, "r1")
    monkeypatch.setattr(values, "encode_canonical", lambda *_: '{"unterminated": ')
    with pytest.raises(UnstorableValue) as caught:
        await store.steps.record(
            "r1", OWNER_A, 1, key="step:a#1", name="a", kind="step", position=0, output=1
        )
    assert "Postgres refused it" in caught.value.problem
    assert isinstance(caught.value.__cause__, psycopg.DataError)
    assert await store.steps.of_run("r1") == []


async def test_refused_by_database_tells_data_from_infrastructure(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as nul:
            await conn.execute("SELECT '\"\\u0000\"'::jsonb")
        with pytest.raises(psycopg.Error) as deep:
            await conn.execute("SELECT (repeat('[', 200000) || repeat(']', 200000))::jsonb")
    assert values.refused_by_database(nul.value)  # unsupported Unicode escape (22P05)
    assert values.refused_by_database(deep.value)  # stack depth limit exceeded (54001)
    assert isinstance(deep.value, psycopg.OperationalError)  # ...which is *not* transient
    assert not values.refused_by_database(psycopg.OperationalError("connection lost"))
    assert not values.refused_by_database(ConnectionError("reset"))


async def test_an_unstorable_result_settles_nothing(store: Store) -> None:
    await make_running(store, "r1")
    with pytest.raises(UnstorableValue) as caught:
        await store.lifecycle.transition_owned(
            "r1", OWNER_A, 1, RunStatus.COMPLETED, state_patch={"result": ["a", "\x00"]}
        )
    assert caught.value.field == "state" and '$["result"][1]' in caught.value.problem
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING


# ---- admission: a re-used run id joins when the payload is the same JSON value -----


async def test_payloads_compare_by_json_value(store: Store) -> None:
    payload = {"args": [-0.0, 1e16, 2**60, 1.5e300, 1e21, 5e-324], "kwargs": {"x": [2.0**60]}}
    first = await store.admission.create(NewRun(id="same", flow="tests.flow", payload=payload))
    again = await store.admission.create(NewRun(id="same", flow="tests.flow", payload=payload))
    assert isinstance(first, Created) and isinstance(again, Joined)
    batch = await store.admission.create_many(
        [NewRun(id="same", flow="tests.flow", payload=payload)] * 2
    )
    assert all(isinstance(outcome, Joined) for outcome in batch)


async def test_a_different_payload_still_conflicts(store: Store) -> None:
    await store.admission.create(
        NewRun(id="p", flow="tests.flow", payload={"args": [1.5e300, -0.0]})
    )
    for other in ([1.6e300, -0.0], [1.5e300, 5e-324], [1.5e300, "0"], [1.5e300, False]):
        with pytest.raises(ExecutionIdentityConflict) as caught:
            await store.admission.create(NewRun(id="p", flow="tests.flow", payload={"args": other}))
        assert caught.value.field == "payload"


async def test_one_point_zero_and_one_are_the_same_json_number(store: Store) -> None:
    """JSON has one number type: 1.0 and 1 denote the same value, so they join (README)."""
    await store.admission.create(NewRun(id="n", flow="tests.flow", payload={"args": [1.0]}))
    joined = await store.admission.create(NewRun(id="n", flow="tests.flow", payload={"args": [1]}))
    assert isinstance(joined, Joined)


async def test_a_payload_that_cannot_be_stored_is_a_typed_error_not_a_driver_error(
    store: Store,
) -> None:
    """The producer, a parent admitting a child or a handoff gets UnstorableValue, once:
    refused before writing (the payload), or refused by Postgres (jsonb rejects a lone
    surrogate in ``meta``, which only the JSON syntax check saw)."""
    with pytest.raises(UnstorableValue) as caught:
        await store.admission.create(NewRun(id="s", flow="tests.flow", payload={"s": "\ud800"}))
    assert caught.value.field == "payload" and "lone surrogate" in caught.value.problem
    with pytest.raises(UnstorableValue) as refused:
        await store.admission.create(
            NewRun(id="s", flow="tests.flow", options=_meta({"note": "\ud800"}))
        )
    assert "Postgres refused it" in refused.value.problem
    assert isinstance(refused.value.__cause__, psycopg.DataError)
    assert await store.runs.get("s") is None
    with pytest.raises(UnstorableValue):
        await store.admission.create_many(
            [
                NewRun(id=f"s{i}", flow="tests.flow", options=_meta({"x": ["\udc00"]}))
                for i in range(2)
            ]
        )
    assert await store.runs.get_many(["s0", "s1"]) == []


async def test_payloads_come_back_identical(store: Store) -> None:
    """A flow's arguments are what the producer passed: 1e16 stays a float, 2**70 an int."""
    payload = {"args": list(SPECIALS), "kwargs": {"z": -0.0, "a": {"deep": [1e21]}}}
    created = await store.admission.create(NewRun(id="p", flow="tests.flow", payload=payload))
    assert isinstance(created, Created) and identical(created.row.payload, payload)
    assert identical((await must_get(store, "p")).payload, payload)
