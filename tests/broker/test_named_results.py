"""The producer's checks answer named results (no positional tuples across modules)."""

from __future__ import annotations

from runfleet.declaration import FlowDeclaration, flow_target
from runfleet.producer.admission import (
    Dependencies,
    RqAdmission,
    RqCall,
    dependencies,
    rq_options,
    split_rq_call,
)
from runfleet.rqface.registries import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from runfleet.store.registries import RegistryKind


def plain(a: int, b: int = 0) -> int:
    return a + b


def test_flow_target_names_its_parts() -> None:
    target = flow_target(plain)
    assert isinstance(target, FlowDeclaration)
    assert target.name.endswith("plain") and target.queue is None
    assert target.fn is plain and not target.takes_context
    late = flow_target("mod:fn")
    assert (late.name, late.fn, late.takes_context) == ("mod:fn", None, False)


def test_split_rq_call_names_arguments_and_options() -> None:
    call = split_rq_call((1,), {"b": 2, "job_timeout": 5, "at_front": True})
    assert isinstance(call, RqCall)
    assert call.args == (1,) and call.kwargs == {"b": 2}
    assert call.options == {"job_timeout": 5, "at_front": True}


def test_rq_options_and_dependencies_name_their_parts() -> None:
    options = rq_options(job_timeout=3, meta={"k": 1})
    assert isinstance(options, RqAdmission)
    assert options.timeout_ms == 3000 and options.options.meta == {"k": 1}
    assert options.options.state() == {"job_timeout": 3, "meta": {"k": 1}}
    deps = dependencies(["a", "b", "a"])
    assert isinstance(deps, Dependencies)
    assert deps == Dependencies(["a", "b"], False)


def test_each_rq_registry_is_the_one_class_with_its_kind() -> None:
    kinds = {
        StartedJobRegistry: RegistryKind.STARTED,
        FinishedJobRegistry: RegistryKind.FINISHED,
        FailedJobRegistry: RegistryKind.FAILED,
        DeferredJobRegistry: RegistryKind.DEFERRED,
        ScheduledJobRegistry: RegistryKind.SCHEDULED,
        CanceledJobRegistry: RegistryKind.CANCELED,
    }
    assert {cls.kind for cls in kinds} == set(RegistryKind)
    for cls, kind in kinds.items():
        assert cls.kind is kind
