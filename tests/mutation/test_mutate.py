"""``make mutate``'s own choices that need no mutmut run: which mutants ``--only`` names."""

from __future__ import annotations

from fnmatch import fnmatch

from tests.mutation.mutate import Target, only_patterns


def test_only_names_a_methods_and_a_functions_mutants_as_mutmut_does() -> None:
    target = Target("worker/sweeper.py", ("tests/seed_rules/test_sweeps.py",), 30)
    method, function = only_patterns(target, ["Sweeper._lost_pending", "_unique"])
    assert fnmatch("runfleet.worker.sweeper.xǁSweeperǁ_lost_pending__mutmut_12", method)
    assert fnmatch("runfleet.worker.sweeper.xǁSweeperǁ_lost_pending", method), "its tests"
    assert not fnmatch("runfleet.worker.sweeper.xǁSweeperǁ_one__mutmut_1", method)
    assert fnmatch("runfleet.worker.sweeper.x__unique__mutmut_2", function)
    assert not fnmatch("runfleet.worker.sweeper.x__key__mutmut_1", function)
