"""``make mutate MODULE=worker/lease.py``: mutation testing of one module with mutmut.

Not part of ``make test``. One module at a time, against only the tests
``tests/mutation/targets.toml`` maps it to, one mutant at a time: it is sized for a 2-core
machine shared with other work (minutes per module, not hours).

How: a scratch project under ``build/mutate/<module>/`` links the package (every folder
``runfleet/`` links to, through it) and the tests, and carries a ``pyproject.toml`` whose
``[tool.mutmut]`` table names the one module to mutate and the selected tests. mutmut
copies all of it into ``mutants/`` there (the working tree is never touched), finds which
selected tests reach each mutated function, and runs those tests against each mutant in
a forked child. Postgres and Redis are
resolved once, as the test harness does, and shared by every mutant (each test still
gets its own database and Redis prefix).

The summary counts every mutant: killed (a test failed, or hung past ``timeout`` and was
stopped), survived, and "no tests" (no selected test reaches the function: a survivor
too). Survivors listed in ``tests/mutation/equivalent.md`` (a mutant that cannot change
behaviour, with the reason) are reported apart; the score is the share killed out of
all mutants not judged equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from runfleet.ops.servers.resolve import Endpoints, resolve

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "mutation" / "targets.toml"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.md"
LINKED = ("runfleet", "tests")
"""What the scratch project links to: the package (copied, one module mutated) and tests."""
SOURCES = (
    "runfleet/__init__.py",
    "runfleet/store",
    "runfleet/broker",
    "runfleet/producer",
    "runfleet/rqface",
    "runfleet/declaration",
    "runfleet/runtime",
    "runfleet/worker",
    "runfleet/ops",
)
"""Through runfleet/'s symlinks, so that mutmut names a mutant by the module's import path
(``runfleet.worker.lease.x_…``) and copies real files into ``mutants/runfleet/``."""

SURVIVED = {0}
NO_TESTS = {5, 33}
UNCHECKED = {None, 2, 34}
"""Not run (yet), interrupted, or skipped."""


def killed(code: int | None) -> bool:
    """Any other exit is a kill: a test failed, timed out (36, SIGXCPU) or the mutant
    crashed the test process (a signal, e.g. ``os.kill(pid, 1)`` sending itself SIGHUP)."""
    return code not in SURVIVED | NO_TESTS | UNCHECKED


class MutateError(Exception):
    """The run could not start: a module that is not a target, a missing tool."""


@dataclass(frozen=True)
class Target:
    module: str
    tests: tuple[str, ...]
    timeout: int

    @property
    def dotted(self) -> str:
        """The import path: targets.toml names the file (worker/lease.py), code imports
        ``runfleet.worker.lease``."""
        return "runfleet." + self.module.removesuffix(".py").replace("/", ".")

    @property
    def scratch_path(self) -> str:
        """The module's path in the scratch project (under its runfleet/ link)."""
        return f"runfleet/{self.module}"

    @property
    def slug(self) -> str:
        return self.module.removesuffix(".py").replace("/", "_")


@dataclass(frozen=True)
class Summary:
    killed: tuple[str, ...]
    survived: tuple[str, ...]
    no_tests: tuple[str, ...]
    unchecked: tuple[str, ...]
    equivalent: tuple[str, ...]
    """Survivors (or untested mutants) that equivalent.md judges equivalent."""

    @property
    def total(self) -> int:
        return len(self.killed) + len(self.survived) + len(self.no_tests) + len(self.unchecked)

    @property
    def counted(self) -> int:
        """Mutants that could be killed: all of them but those judged equivalent."""
        return self.total - len(self.equivalent)

    @property
    def score(self) -> float:
        return 100.0 * len(self.killed) / self.counted if self.counted else 100.0

    def unexplained(self) -> list[str]:
        left = set(self.survived) | set(self.no_tests) | set(self.unchecked)
        return sorted(left - set(self.equivalent))


def load_targets(path: Path = TARGETS) -> dict[str, Target]:
    data = tomllib.loads(path.read_text())
    targets: dict[str, Target] = {}
    for module, table in data.get("targets", {}).items():
        tests = tuple(str(t) for t in table.get("tests", ()))
        if not tests:
            raise MutateError(f"{path}: target {module!r} lists no tests")
        targets[module] = Target(module, tests, int(table.get("timeout", 30)))
    return targets


def equivalent_mutants(path: Path = EQUIVALENT) -> set[str]:
    """Mutant names equivalent.md lists (each as a backticked name at the start of a row)."""
    if not path.exists():
        return set()
    return set(re.findall(r"^\|\s*`([^`]+__mutmut_\d+)`", path.read_text(), flags=re.M))


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def mutmut_table(target: Target) -> str:
    """The ``[tool.mutmut]`` table of the scratch project for ``target``."""
    pytest_args = [f"--timeout={target.timeout}", "-p", "no:cacheprovider"]
    return "\n".join(
        [
            "",
            "# Generated by tests/mutation/mutate.py for one `make mutate` run.",
            "[tool.mutmut]",
            f"source_paths = {_toml_list(list(SOURCES))}",
            f"only_mutate = {_toml_list([target.scratch_path])}",
            f"pytest_add_cli_args_test_selection = {_toml_list(target.tests)}",
            f"pytest_add_cli_args = {_toml_list(pytest_args)}",
            "use_git_change_detection = false",
            "",
        ]
    )


def prepare(target: Target, where: Path, *, keep: bool) -> None:
    """Lay out the scratch project (fresh unless ``keep``: then mutmut resumes)."""
    if where.exists() and not keep:
        shutil.rmtree(where)
    where.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = where / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)
    pyproject = (ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in pyproject:
        raise MutateError("pyproject.toml has its own [tool.mutmut]: targets.toml says it all")
    (where / "pyproject.toml").write_text(pyproject + mutmut_table(target))


def mutmut_command(names: list[str] | None = None, children: int = 1) -> list[str]:
    """``mutmut run``, ``children`` mutants at a time (one by default); with ``names``, only
    those mutants again."""
    script = Path(sys.executable).with_name("mutmut")
    found = str(script) if script.exists() else shutil.which("mutmut")
    if found is None:
        raise MutateError("mutmut is not installed: pip install -e '.[dev]'")
    return [found, "run", "--max-children", str(children), *(names or [])]


def only_patterns(target: Target, functions: list[str]) -> list[str]:
    """mutmut's name patterns for the mutants of ``functions`` (``_unique``,
    ``Sweeper._lost_pending``): mutmut names a method's mutants ``xǁClassǁmethod__mutmut_N``
    and matches the patterns with fnmatch, against both the mutants' names and the mangled
    function names it maps to their tests (so no ``__mutmut_`` in the pattern)."""
    patterns = []
    for function in functions:
        owner, _, name = function.rpartition(".")
        mangled = f"xǁ{owner}ǁ{name}" if owner else f"x_{name}"
        patterns.append(f"{target.dotted}.{mangled}*")
    return patterns


def _meta(target: Target, where: Path) -> Path:
    return where / "mutants" / (target.scratch_path + ".meta")


def keep_earlier_kills(target: Target, where: Path, earlier: dict[str, int | None]) -> None:
    """After ``--retest``: a mutant killed before keeps its kill.

    mutmut forgets every result when the test selection changed (a test file added to
    ``targets.toml``), but a retest only re-runs the survivors; a kill by fewer tests is
    still a kill by more (tests are added, not weakened, to kill survivors).
    """
    meta = _meta(target, where)
    data = json.loads(meta.read_text())
    codes: dict[str, int | None] = data["exit_code_by_key"]
    for name, code in earlier.items():
        if name in codes and killed(code) and codes[name] is None:
            codes[name] = code
    meta.write_text(json.dumps(data, indent=4))


def refresh_tests(where: Path) -> None:
    """Copy the tests as they are now over the previous run's copy (``--retest``)."""
    copy = where / "mutants" / "tests"
    if not copy.exists():
        raise MutateError(f"no previous run in {where}: run without --retest first")
    shutil.copytree(ROOT / "tests", copy, dirs_exist_ok=True)


def run_mutmut(command: list[str], where: Path, env: dict[str, str]) -> int:
    """Run mutmut in its own process group; stopping this run (Ctrl-C, SIGTERM) ends the
    whole group (mutmut forks a child per mutant), so no mutant outlives it."""
    proc = subprocess.Popen(command, cwd=where, env=env, start_new_session=True)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(128 + signal.SIGTERM)  # unwinds: mutmut's group and the servers end


def services_env() -> tuple[dict[str, str], Endpoints]:
    """The environment every mutant's tests run with, and what to close afterwards."""
    endpoints = resolve("test")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RUNFLEET_TEST_DATABASE_URL"] = endpoints.database_url
    env["RUNFLEET_TEST_REDIS_URL"] = endpoints.redis_url
    return env, endpoints


def summarize(target: Target, where: Path, equivalent: set[str]) -> Summary:
    meta = _meta(target, where)
    if not meta.exists():
        raise MutateError(f"mutmut wrote no results for {target.module} ({meta})")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    groups: dict[str, list[str]] = {"killed": [], "survived": [], "no_tests": [], "unchecked": []}
    for name, code in sorted(codes.items()):
        if killed(code):
            groups["killed"].append(name)
        elif code in SURVIVED:
            groups["survived"].append(name)
        elif code in NO_TESTS:
            groups["no_tests"].append(name)
        else:
            groups["unchecked"].append(name)
    not_killed = set(groups["survived"]) | set(groups["no_tests"]) | set(groups["unchecked"])
    return Summary(
        killed=tuple(groups["killed"]),
        survived=tuple(groups["survived"]),
        no_tests=tuple(groups["no_tests"]),
        unchecked=tuple(groups["unchecked"]),
        equivalent=tuple(sorted(not_killed & equivalent)),
    )


def show(where: Path, names: list[str], env: dict[str, str]) -> None:
    """Print each mutant's diff (``mutmut show``) so a survivor can be judged at once."""
    command = mutmut_command()[0]
    for name in names:
        subprocess.run([command, "show", name], cwd=where, env=env, check=False)


def report(target: Target, summary: Summary, equivalent: set[str]) -> str:
    stale = sorted(
        name
        for name in equivalent
        if name.startswith(target.dotted + ".") and name in summary.killed
    )
    lines = [
        f"{target.module}: {len(summary.killed)} killed of {summary.counted} "
        f"({summary.score:.1f} %); {len(summary.equivalent)} judged equivalent "
        f"(tests/mutation/equivalent.md); {len(summary.unexplained())} unexplained survivors",
        f"  totals: {summary.total} mutants, "
        + ", ".join(
            f"{k} {v}"
            for k, v in Counter(
                {
                    "killed": len(summary.killed),
                    "survived": len(summary.survived),
                    "no tests": len(summary.no_tests),
                    "not checked": len(summary.unchecked),
                }
            ).items()
        ),
    ]
    for name in summary.unexplained():
        lines.append(f"  SURVIVED {name}")
    for name in stale:
        lines.append(f"  STALE equivalent.md lists {name}, but a test kills it now")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("module", nargs="?", help="e.g. worker/lease.py (see targets.toml)")
    parser.add_argument("--keep", action="store_true", help="resume the previous run")
    parser.add_argument(
        "--retest",
        action="store_true",
        help="re-run only the previous run's survivors, against the tests as they are now",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="FUNCTION",
        help="mutate only this function (a method as Class.method; repeatable); the "
        "other mutants stay not checked, or with --keep or --retest as the previous run "
        "left them",
    )
    parser.add_argument(
        "--children",
        type=int,
        default=1,
        help="mutants tested at once (each test still has its own database and Redis "
        "prefix; more than the machine's cores makes slow tests time out, which counts as "
        "killed)",
    )
    parser.add_argument("--no-diffs", action="store_true", help="do not print survivors' diffs")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        targets = load_targets()
        if args.list or not args.module:
            for listed in targets.values():
                print(f"{listed.module}: {' '.join(listed.tests)}")
            return 0 if args.list else 2
        target = targets.get(args.module)
        if target is None:
            known = ", ".join(sorted(targets))
            raise MutateError(f"{args.module!r} is not a target in {TARGETS} (known: {known})")
        for test in target.tests:
            if not (ROOT / test.split("::", 1)[0]).exists():
                raise MutateError(f"{TARGETS}: {target.module}: no such test file {test!r}")
        where = ROOT / "build" / "mutate" / target.slug
        earlier: dict[str, int | None] = {}
        if args.retest:
            survivors = summarize(target, where, equivalent_mutants()).unexplained()
            if args.only:
                patterns = only_patterns(target, args.only)
                survivors = [s for s in survivors if any(fnmatch(s, p) for p in patterns)]
            earlier = json.loads(_meta(target, where).read_text())["exit_code_by_key"]
            refresh_tests(where)
            prepare(target, where, keep=True)
            command = mutmut_command(survivors, args.children) if survivors else []
        else:
            prepare(target, where, keep=args.keep)
            only = only_patterns(target, args.only) if args.only else None
            command = mutmut_command(only, args.children)
        env, endpoints = services_env()
        try:
            returncode = run_mutmut(command, where, env) if command else 0
            if earlier:
                keep_earlier_kills(target, where, earlier)
            equivalent = equivalent_mutants()
            summary = summarize(target, where, equivalent)
            if not args.no_diffs:
                show(where, summary.unexplained(), env)
        finally:
            endpoints.close()
    except MutateError as exc:
        print(f"mutate: {exc}", file=sys.stderr)
        return 2
    print(report(target, summary, equivalent))
    print(f"  (results kept in {where.relative_to(ROOT)}; `cd` there and `mutmut browse`)")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
