"""``runfleet roles``, ``grant`` and ``revoke``: least-privilege roles and scope grants.

They connect with ``RUNFLEET_DATABASE_URL``'s credentials, as every command does, so
what they may change is what Postgres lets that role change: applying privileges and
writing grants needs the schema owner (``runfleet_migrator``) or a superuser, and any
other role gets a one-line refusal. The operations themselves live in ``store.roles``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.text import block, say
from runfleet.store import roles as r


def register(app: typer.Typer) -> None:
    app.command("roles")(roles)
    app.command("grant")(grant)
    app.command("revoke")(revoke)


def _members(pairs: list[str]) -> dict[str, r.GroupRole]:
    found: dict[str, r.GroupRole] = {}
    for pair in pairs:
        login, sep, group = pair.partition("=")
        if not sep or not login.strip():
            raise r.RolesRefused(f"--member wants LOGIN=GROUP, got {pair!r}")
        found[login.strip()] = r.GroupRole.parse(group.strip())
    return found


def roles(
    apply: Annotated[
        bool, typer.Option("--apply", help="Grant each group role its privileges (idempotent).")
    ] = False,
    print_sql: Annotated[
        bool, typer.Option("--print", help="Print the SQL --apply executes, and exit.")
    ] = False,
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member",
            metavar="LOGIN=GROUP",
            help="With --apply: make login role LOGIN a member of GROUP"
            " (migrator, worker, producer, operator). Repeatable.",
        ),
    ] = None,
) -> None:
    """Show, print or apply the database roles (migrator, worker, producer, operator).

    Run `--apply` after every `runfleet migrate`, as the schema owner or a superuser.
    """
    if print_sql:
        say(block(r.privileges_sql()))
        return
    url = c.settings().database_url
    if member and not apply:
        c.fail("--member needs --apply")
    if apply:
        try:
            members = _members(member or [])
        except r.RolesRefused as exc:
            c.fail(str(exc))
        c.run(r.apply_privileges(url, members, r.Limits.of(c.settings())))
        say("privileges applied" + (f"; members: {len(members)}" if members else ""))
    for row in c.run(r.status(url)):
        state = "ok" if row.exists else "MISSING (run `runfleet migrate`)"
        flags = " LOGIN" * row.can_login + " BYPASSRLS" * row.bypass_rls
        members_text = ", ".join(row.members) or "-"
        say(f"{row.role:<18} {state}{flags}  members: {members_text}")
    for g in c.run(r.grants(url)):
        say(f"grant  {g.role} -> {g.scope}")
    seen = c.run(r.visibility(url))
    limits = ", ".join(f"{k}={v}" for k, v in sorted(seen.limits.items()))
    say(f"producer limits  {limits or '-'}")
    say(
        "catalog statistics  "
        + (
            "hidden from producers and operators"
            if seen.statistics_hidden
            else "readable by every role (run `runfleet roles --apply` as a superuser to"
            " hide them; README: Trust model)"
        )
    )


RoleArg = Annotated[str, typer.Argument(help="A database role (login or group role).")]
ScopesArg = Annotated[list[str], typer.Argument(help="Scopes; '*' covers every run.")]


def grant(role: RoleArg, scopes: ScopesArg) -> None:
    """Let ROLE see and change runs whose scopes are all among its granted SCOPES.

    Takes effect at the role's next statement. Needs the schema owner or a superuser.
    """
    added = c.run(r.grant(c.settings().database_url, role, scopes))
    say(f"granted {role}: {', '.join(added) or 'nothing new'}")


def revoke(role: RoleArg, scopes: ScopesArg) -> None:
    """Withdraw SCOPES from ROLE; its next statement no longer sees those runs."""
    removed = c.run(r.revoke(c.settings().database_url, role, scopes))
    say(f"revoked {role}: {', '.join(removed) or 'nothing held'}")
