"""A failed run's error as a type (``RunError``) over the stored JSON, which does not change."""

from __future__ import annotations

import json

from runfleet.store import Store, settlements
from runfleet.store.types import RunError, RunStatus
from tests.store.helpers import OWNER_A, OWNER_B, make_running, must_get


async def test_an_error_reads_back_as_the_one_written(store: Store) -> None:
    row = await make_running(store, "r")
    written = RunError(
        type="SystemExit",
        module="builtins",
        message="SystemExit raised by the run's own code: bye",
        traceback="Traceback ...\nSystemExit: bye\n",
        base_exception=True,
    )
    await store.lifecycle.settle(OWNER_A, settlements.failed("r", row.epoch, written))
    read = await must_get(store, "r")
    assert read.error == written
    assert read.state["error"] == {
        "type": "SystemExit",
        "module": "builtins",
        "message": "SystemExit raised by the run's own code: bye",
        "traceback": "Traceback ...\nSystemExit: bye\n",
        "base_exception": True,
    }, "the stored keys are the ones every version wrote"


async def test_keys_it_does_not_read_are_kept_and_handed_on_as_stored(store: Store) -> None:
    """A key this version does not know, or a known key of another type, is kept in
    ``extra``; the child's error a parent reads is the stored object, key order and all."""
    await make_running(store, "p")
    await make_running(store, "kid", OWNER_B, parent_id="p")
    stored = {"zz_newer": [1, 2], "type": "Boom", "message": 5, "id": "x", "base_exception": 0}
    await store.lifecycle.transition_owned(
        "kid", OWNER_B, 1, RunStatus.FAILED, state_patch={"error": stored}
    )
    kid = await must_get(store, "kid")
    assert kid.error == RunError(
        type="Boom", extra={"zz_newer": [1, 2], "message": 5, "id": "x", "base_exception": 0}
    )
    assert kid.error.to_json() == stored
    as_read = kid.state["error"]  # in the order jsonb keeps its keys
    assert json.dumps(kid.error.to_json()) == json.dumps(as_read)
    deferred = await store.deferreds.deferred("p", "child:kid")
    assert deferred is not None
    assert json.dumps(deferred.value["error"]) == json.dumps(as_read)


def test_no_error_reads_as_none_and_a_value_not_an_object_as_its_text() -> None:
    assert RunError.from_json(None) is None
    assert RunError.from_json("boom") == RunError(message="boom")
    assert RunError.from_json({}) == RunError()
    assert str(RunError(type="ValueError", message="bad")) == "ValueError: bad"
    assert str(RunError(type="KeyError")) == "KeyError"
