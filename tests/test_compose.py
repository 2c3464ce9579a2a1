"""``compose/``: the fleet's compose file and image, checked without a Docker engine.

Every ``runfleet`` command line in the file is parsed by the real CLI (so a renamed
flag fails here, not in a deploy), every ``RUNFLEET_*`` variable must be a setting,
images are pinned, and the stop grace period covers the worker's own.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
import typer.main
import yaml

import runfleet
from runfleet.ops.cli.app import app
from runfleet.store.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
COMPOSE_ONLY_VARS = {"RUNFLEET_PG_PORT", "RUNFLEET_REDIS_PORT"}
"""Interpolated by compose itself (host ports for ops/servers/resolve.py), not read by runfleet."""
PINNED = re.compile(r"^[\w./-]+:\d+\.\d+[\w.-]*$")
"""name:MAJOR.MINOR[...] — a moving tag like ``postgres:16`` or ``latest`` is not pinned."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


_SHELL_WORDS = {"do", "then", "else", "elif", "while", "until", "if", "!", "{", "}", "done", "fi"}


class CommandLineError(Exception):
    """A command line the real CLI refuses (unknown command or flag, bad value)."""


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script (split at ``;``, ``&&``, ``||``, ``|``).

    Compose turns ``$$`` into ``$`` before the shell sees it; reserved words that open
    a compound command (``do``, ``then``) are dropped so the command after them shows.
    """
    lexer = shlex.shlex(script.replace("$$", "$"), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set(";&|()"):
            commands.append([])
        elif commands[-1] or token not in _SHELL_WORDS:
            commands[-1].append(token)
    return [c for c in commands if c]


def _argvs(value: Any) -> list[list[str]]:
    """Every command line in a compose ``command`` or healthcheck ``test`` value."""
    if isinstance(value, str):
        return _shell_commands(value)
    argv = [str(v) for v in value]
    if argv[:1] == ["CMD-SHELL"]:
        return _shell_commands(" ".join(argv[1:]))
    if argv[:1] == ["CMD"]:
        argv = argv[1:]
    if argv[:2] == ["sh", "-c"]:
        return _shell_commands(argv[2])
    return [argv]


def _runfleet_argvs(services: dict[str, dict[str, Any]]) -> dict[str, list[list[str]]]:
    found: dict[str, list[list[str]]] = {}
    for name, service in services.items():
        values = [service.get("command"), (service.get("healthcheck") or {}).get("test")]
        for value in filter(None, values):
            for argv in _argvs(value):
                if argv[0] == "runfleet":
                    found.setdefault(name, []).append(argv[1:])
    return found


def _parse(argv: list[str]) -> dict[str, Any]:
    """Parse a command line with the real CLI (without running it): its parameters.

    Raises CommandLineError for anything the CLI would refuse.
    """
    command = typer.main.get_command(app)
    args = list(argv)
    while isinstance(command, typer.core.TyperGroup):
        if not args:
            raise CommandLineError(f"runfleet {shlex.join(argv)}: no subcommand")
        sub = command.get_command(typer.Context(command), args[0])
        if sub is None:
            raise CommandLineError(f"runfleet has no command {args[0]!r}")
        command, args = sub, args[1:]
    try:
        params: dict[str, Any] = command.make_context(command.name or "runfleet", args).params
        return params
    except Exception as exc:  # typer's vendored click errors: UsageError, BadParameter
        message = getattr(exc, "format_message", None)
        if message is None:
            raise
        raise CommandLineError(f"`runfleet {shlex.join(argv)}`: {message()}") from exc


def test_every_runfleet_command_line_parses(services: dict[str, dict[str, Any]]) -> None:
    argvs = _runfleet_argvs(services)
    assert argvs.keys() == {"migrate", "worker", "producer"}
    for name, lines in argvs.items():
        for argv in lines:
            try:
                _parse(argv)
            except CommandLineError as exc:
                pytest.fail(f"{name}: {exc}")
    # The schema first, then the least-privilege roles' privileges (README, trust model).
    assert argvs["migrate"][0] == ["migrate"]
    assert argvs["migrate"][1][:2] == ["roles", "--apply"]
    worker, health = argvs["worker"]
    assert worker[0] == "worker" and health[:2] == ["fleet", "--check"]
    assert argvs["producer"][0][0] == "enqueue"


def test_a_wrong_flag_would_be_caught() -> None:
    with pytest.raises(CommandLineError, match="No such option: --metrics-prot"):
        _parse(["worker", "--metrics-prot", "9100"])
    with pytest.raises(CommandLineError, match="Invalid value for '--concurrency'"):
        _parse(["worker", "--concurrency", "many"])
    with pytest.raises(CommandLineError, match="no command 'wrker'"):
        _parse(["wrker"])


def test_runfleet_variables_are_settings(services: dict[str, dict[str, Any]]) -> None:
    fields = {f"RUNFLEET_{name.upper()}" for name in Settings.model_fields}
    used: dict[str, str] = {}
    for service in services.values():
        env = service.get("environment") or {}
        assert isinstance(env, dict), "environment must be a map (checked key by key)"
        used.update({k: str(v) for k, v in env.items() if k.startswith("RUNFLEET_")})
    unknown = set(used) - fields
    assert not unknown, f"not fields of runfleet.store.config.Settings: {sorted(unknown)}"
    # The values must also be valid settings, not just known names.
    Settings.model_validate({k.removeprefix("RUNFLEET_").lower(): v for k, v in used.items()})
    interpolated = set(re.findall(r"\$\{(RUNFLEET_\w+)", COMPOSE.read_text()))
    assert interpolated - fields <= COMPOSE_ONLY_VARS
    assert {"RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL", "RUNFLEET_GRACE_PERIOD"} <= set(used)


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    version = runfleet.__version__
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        assert PINNED.match(image) or "@sha256:" in image, f"{name}: {image} is not pinned"
        if "build" in service:
            assert image == f"runfleet:{version}", f"{name}: tag the build with the version"
    bases = re.findall(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert bases and all(PINNED.match(b) for b in bases), bases
    assert bases[0].startswith("python:3.11.") and "-slim" in bases[0]


def test_image_build_installs_the_package(services: dict[str, dict[str, Any]]) -> None:
    build = services["worker"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    text = DOCKERFILE.read_text()
    assert re.search(r"^RUN pip install \.", text, re.MULTILINE)
    copied = set(re.findall(r"^COPY\s+(\S+)\s", text, re.MULTILINE))
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = set(setuptools["package-dir"].values()) | {"setup.py", "LICENSE"}
    assert wanted <= copied and all((ROOT / p).exists() for p in copied if p != ".")


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, f"unparsed duration {text!r}"
    return float(match[1]) * {"ms": 0.001, "s": 1, "m": 60}[match[2]]


def test_worker_service_shape(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == 3
    assert worker["healthcheck"]["test"]
    grace = float(worker["environment"]["RUNFLEET_GRACE_PERIOD"])
    stop = _seconds(worker["stop_grace_period"])
    # Docker SIGKILLs after stop_grace_period: it must outlast the worker's grace period
    # plus the release that follows it, and not by so much that a stop hangs.
    assert grace + 2 <= stop <= grace + 10, (grace, stop)
    depends = worker["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"].get("restart") == "no"
    argv = _runfleet_argvs(services)["worker"][0]
    port = argv[argv.index("--metrics-port") + 1]
    assert port in [str(p) for p in worker.get("expose", [])]


def test_the_producer_enqueues_a_flow_the_workers_serve(
    services: dict[str, dict[str, Any]],
) -> None:
    import importlib

    from runfleet.worker.authoring.flows import registered

    worker = _parse(_runfleet_argvs(services)["worker"][0])
    producer = _parse(_runfleet_argvs(services)["producer"][0])
    for module in str(worker["flows"]).split(","):
        importlib.import_module(module)
    flow = registered()[producer["flow"]]
    assert producer["queue"] in str(worker["queues"]).split(",")
    assert flow.queue == producer["queue"]


def test_postgres_and_redis_keep_what_ops_services_relies_on(
    services: dict[str, dict[str, Any]],
) -> None:
    assert "${RUNFLEET_PG_PORT:-}:5432" in services["postgres"]["ports"][0]
    assert "${RUNFLEET_REDIS_PORT:-}:6379" in services["redis"]["ports"][0]
    assert services["postgres"]["healthcheck"] and services["redis"]["healthcheck"]
