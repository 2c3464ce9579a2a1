"""Bad input raises InvalidInput naming the field, and nothing durable is written."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import (
    AdmissionOptions,
    Created,
    NewRun,
    RqOptions,
    RunStatus,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import OWNER_A, counts, create, make_running, must_get

GOOD = NewRun(id="r-new", flow="tests.flow", queue="default", payload={"ok": True})

BAD_IDS: list[Any] = ["", "x" * 256, "line\nbreak", "tab\there", "nul\x00", "del\x7f", 42, None]
BAD_JSON: list[Any] = [
    {1, 2},
    object(),
    float("nan"),
    {"nested": [float("inf")]},
    {"k": b"bytes"},
    "nul \x00 inside",
    {"key\x00": 1},
]


async def _refused(
    database_url: str, field: str, action: Callable[[], Awaitable[object]], case: object = None
) -> InvalidInput:
    """Run ``action``, insist it raises InvalidInput for ``field``, and wrote nothing."""
    before = await counts(database_url)
    try:
        await action()
    except InvalidInput as error:
        assert error.field == field, (case, error)
        assert field in str(error), case
        assert await counts(database_url) == before, f"{case!r} wrote something"
        return error
    raise AssertionError(f"{case!r} was accepted; expected InvalidInput({field!r})")


# ---- admission ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "field"), [("id", "run_id"), ("flow", "flow"), ("queue", "queue")]
)
async def test_create_refuses_bad_identifiers(
    store: Store, database_url: str, attr: str, field: str
) -> None:
    for bad in BAD_IDS:
        new = replace(GOOD, **{attr: bad})
        await _refused(database_url, field, partial(store.admission.create, new), bad)


async def test_create_refuses_a_payload_that_is_not_json(store: Store, database_url: str) -> None:
    for bad in BAD_JSON:
        new = replace(GOOD, payload=bad)
        await _refused(database_url, "payload", partial(store.admission.create, new), bad)


async def test_create_refuses_an_oversized_payload(
    store: Store, settings: Settings, database_url: str
) -> None:
    too_big = "x" * settings.max_payload_bytes  # plus two quotes once encoded
    error = await _refused(
        database_url, "payload", partial(store.admission.create, replace(GOOD, payload=too_big))
    )
    assert str(settings.max_payload_bytes) in error.problem
    just_fits = "x" * (settings.max_payload_bytes - 2)
    assert isinstance(await store.admission.create(replace(GOOD, payload=just_fits)), Created)


async def test_create_refuses_oversized_or_non_json_options(
    store: Store, settings: Settings, database_url: str
) -> None:
    for meta in ({"blob": "y" * settings.max_payload_bytes}, {"s": {1}}):
        new = replace(GOOD, options=AdmissionOptions(rq=RqOptions(meta=meta)))
        await _refused(database_url, "options", partial(store.admission.create, new))


async def test_create_accepts_the_longest_identifier_and_odd_but_legal_json(store: Store) -> None:
    longest = "x" * 255
    row = await create(store, longest, flow="f" * 255, payload="C:\\u0000 is text, not NUL")
    assert row.id == longest
    assert row.payload == "C:\\u0000 is text, not NUL"


async def test_create_refuses_bad_identity_fields(store: Store, database_url: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"scopes": ("ok", "")}, "scopes"),
        ({"scopes": ("bad\nscope",)}, "scopes"),
        ({"parent_id": ""}, "parent_id"),
        ({"parent_id": "r-new"}, "parent_id"),
        ({"lineage_id": "x" * 256}, "lineage_id"),
        ({"round_ordinal": -1}, "round_ordinal"),
        ({"max_rounds": 0}, "max_rounds"),
    ]
    for changes, field in cases:
        new = replace(GOOD, **changes)
        await _refused(database_url, field, partial(store.admission.create, new), changes)


# ---- owned writes ------------------------------------------------------------


async def test_transition_refuses_an_unknown_status(store: Store, database_url: str) -> None:
    running = await make_running(store, "r1")
    unknown: list[Any] = ["finished", "", "RUNNING!", 3, None]
    for bad in unknown:
        await _refused(
            database_url,
            "to_status",
            partial(store.lifecycle.transition_owned, "r1", OWNER_A, 1, bad),
            bad,
        )
    after = await must_get(store, "r1")
    assert after.status is RunStatus.RUNNING and after.updated_at_ms == running.updated_at_ms


async def test_transition_refuses_a_state_patch_that_is_not_json(
    store: Store, database_url: str
) -> None:
    await make_running(store, "r1")
    for bad in BAD_JSON:
        await _refused(
            database_url,
            "state",
            partial(
                store.lifecycle.transition_owned,
                "r1",
                OWNER_A,
                1,
                RunStatus.COMPLETED,
                state_patch={"result": bad},
            ),
            bad,
        )
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING


async def test_park_refuses_a_bad_reason_or_request(store: Store, database_url: str) -> None:
    await make_running(store, "r1")
    for word in ("", "lunch"):  # what an untyped caller could pass: no WaitingReason
        bad = Waiting(cast(WaitingReason, word))
        park = partial(store.waits.park, "r1", OWNER_A, 1, bad)
        await _refused(database_url, "waiting.reason", park, word)
    await _refused(
        database_url,
        "waiting.request",
        partial(
            store.waits.park, "r1", OWNER_A, 1, Waiting(WaitingReason.APPROVAL, request={1, 2})
        ),
    )
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING


async def test_complete_deferred_refuses_bad_name_value_or_metadata(
    store: Store, settings: Settings, database_url: str
) -> None:
    await create(store, "r1")
    waits = store.deferreds
    await _refused(database_url, "deferred name", partial(waits.complete_deferred, "r1", ""))
    await _refused(database_url, "value", partial(waits.complete_deferred, "r1", "d", float("nan")))
    await _refused(
        database_url,
        "value",
        partial(waits.complete_deferred, "r1", "d", "v" * settings.max_payload_bytes),
    )
    await _refused(database_url, "metadata", partial(waits.complete_deferred, "r1", "d", 1, {3}))
    assert await waits.deferred("r1", "d") is None


async def test_schedule_clock_refuses_bad_input(store: Store, database_url: str) -> None:
    await make_running(store, "r1")
    cases: list[tuple[str, str, Any, str]] = [
        ("", "d", 1, "clock name"),
        ("c", "", 1, "deferred name"),
        ("c", "bad\nname", 1, "deferred name"),
        ("c", "d", float("nan"), "due_at_ms"),
        ("c", "d", float("inf"), "due_at_ms"),
        ("c", "d", True, "due_at_ms"),
        ("c", "d", "soon", "due_at_ms"),
    ]
    for name, deferred, due, field in cases:
        await _refused(
            database_url,
            field,
            partial(store.waits.schedule_clock, "r1", name, deferred, due, OWNER_A, 1),
            (name, deferred, due),
        )
    assert await store.waits.pending_clocks("r1") == []


# ---- unowned writes ----------------------------------------------------------


async def test_request_cancel_refuses_a_bad_run_id(store: Store, database_url: str) -> None:
    for bad in BAD_IDS:
        await _refused(database_url, "run_id", partial(store.lifecycle.request_cancel, bad), bad)


async def test_record_parent_refuses_bad_ids(store: Store, database_url: str) -> None:
    for bad in BAD_IDS:
        await _refused(database_url, "child_id", partial(store.dag.record_parent, bad, "p"), bad)
        await _refused(database_url, "parent_id", partial(store.dag.record_parent, "c", bad), bad)
