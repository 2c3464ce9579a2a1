"""compose.yaml runs every runfleet service under a least-privilege role, never the superuser.

Checked without a Docker engine, from the file itself: each service's login role, the
group the migrate job makes it a member of, and the scope its commands use.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from tests.test_compose import COMPOSE, _parse, _runfleet_argvs
from tests.test_compose import compose as compose
from tests.test_compose import services as services

INITDB = COMPOSE.parent / "initdb"


def _login(service: dict[str, Any]) -> str:
    env = service["environment"]
    assert isinstance(env, dict)
    return str(conninfo_to_dict(str(env["RUNFLEET_DATABASE_URL"]))["user"])


def test_each_service_connects_as_its_least_privilege_role(
    services: dict[str, dict[str, Any]],
) -> None:
    argvs = _runfleet_argvs(services)
    logins = {name: _login(services[name]) for name in argvs}
    assert "postgres" not in logins.values()
    assert logins["migrate"] == "runfleet_migrator"

    members: dict[str, str] = {}
    granted: dict[str, set[str]] = {}
    for argv in argvs["migrate"][1:]:
        params = _parse(argv)
        if argv[0] == "roles":
            members.update(m.split("=", 1) for m in params["member"])
        elif argv[0] == "grant":
            granted.setdefault(params["role"], set()).update(params["scopes"])
    assert members[logins["worker"]] == "worker"
    assert members[logins["producer"]] == "producer"
    producer = _parse(argvs["producer"][0])
    assert set(producer["scope"]) <= granted[logins["producer"]]

    created = set(
        re.findall(r"CREATE ROLE (\w+) LOGIN", "".join(p.read_text() for p in _sql(INITDB)))
    )
    assert set(logins.values()) | set(members) <= created


def _sql(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.sql"))
