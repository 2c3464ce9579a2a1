"""A flow's declaration: what ``@flow`` declares is what a producer admits with."""

from __future__ import annotations

import pytest

from runfleet import flow
from runfleet.declaration import FlowDeclaration, flow_target
from runfleet.store.errors import InvalidInput
from runfleet.worker.authoring.instances import FlowInstance


@flow(name="declared.charge", queue="billing", timeout=30, priority=7, max_rounds=3)
async def charge(ctx: object, amount: int, *, currency: str = "EUR") -> int:
    return amount


class Mailer(FlowInstance):
    @flow(name="declared.mailer.send")
    async def send(self, ctx: object, to: str) -> str:
        return to


def plain(a: int) -> int:
    return a


def test_a_flow_is_its_declaration() -> None:
    declared = flow_target(charge)
    assert isinstance(charge, FlowDeclaration) and declared is charge
    assert (declared.name, declared.queue, declared.timeout) == ("declared.charge", "billing", 30)
    assert (declared.priority, declared.max_rounds, declared.takes_context) == (7, 3, True)
    assert declared.version is None and declared.instance is None


def test_the_declaration_checks_arguments_after_ctx() -> None:
    flow_target(charge).check([5], {"currency": "USD"})
    with pytest.raises(InvalidInput, match="does not match"):
        flow_target(charge).check([], {"amount": 1, "colour": "red"})
    flow_target(plain).check([1], {})
    with pytest.raises(InvalidInput):
        flow_target(plain).check([1, 2], {})
    flow_target("mod:fn").check([1, 2, 3], {"any": 1})  # late bound: nothing to check


def test_a_plain_function_and_a_name_declare_no_queue_nor_ctx() -> None:
    declared = flow_target(plain)
    assert declared.name.endswith(":plain") and declared.fn is plain
    assert declared.queue is None and not declared.takes_context


def test_a_class_level_flow_needs_an_instance() -> None:
    assert Mailer.send.needs_instance
    with pytest.raises(InvalidInput, match="FlowInstance"):
        flow_target(Mailer.send)
    bound = Mailer(instance_name="eu", scopes=["tenant-a"]).send
    assert flow_target(bound).admitted_instance(["tenant-a"]) == "eu"
