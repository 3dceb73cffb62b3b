"""The user's privileges, read from ``SHOW GRANTS`` (doctor's privilege checks)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from chunking.mysql import quote_identifier
from orchestrator.config import TableConfig
from orchestrator.source.check import Check
from orchestrator.source.connection import Source


@dataclass(frozen=True, slots=True)
class Grant:
    """One ``GRANT ... ON ... TO`` line of ``SHOW GRANTS``.

    Attributes:
        privileges: upper-case privilege names; column-level ones (``SELECT (a)``) are left out.
        database: database name or ``LIKE`` pattern; None for ``*``.
        table: table name; None for ``*``.
    """

    privileges: frozenset[str]
    database: str | None
    table: str | None


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside backquotes and parentheses."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "()":
            depth += 1 if ch == "(" else -1
        elif not quoted and depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _ident(text: str) -> str | None:
    text = text.strip()
    if text == "*":
        return None
    if text.startswith("`") and text.endswith("`"):
        return text[1:-1].replace("``", "`")
    return text


def parse_grant(line: str) -> Grant | None:
    """Parse a ``SHOW GRANTS`` line; None for role grants, PROXY and routines.

    >>> g = parse_grant("GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `snap`@`%`")
    >>> sorted(g.privileges), g.database, g.table
    (['BINLOG MONITOR', 'REPLICATION SLAVE', 'SELECT'], None, None)
    >>> parse_grant("GRANT SELECT (`id`), INSERT ON `shop`.`orders` TO `u`@`%`")
    Grant(privileges=frozenset({'INSERT'}), database='shop', table='orders')
    >>> parse_grant("GRANT `r1` TO `u`@`%`") is None
    True
    """
    if not line.upper().startswith("GRANT "):
        return None
    head = _split_top(line[len("GRANT ") :], " TO ")[0]
    parts = _split_top(head, " ON ")
    if len(parts) != 2:
        return None
    privileges_text, target = parts
    on = _split_top(target.strip(), ".")
    if len(on) != 2 or " " in target.strip().split("`")[0]:
        return None  # PROXY ON ''@'%', PROCEDURE db.p, FUNCTION db.f
    privileges = frozenset(
        " ".join(p.split()).upper() for p in _split_top(privileges_text, ",") if "(" not in p
    )
    return Grant(privileges, _ident(on[0]), _ident(on[1]))


def _like(pattern: str, name: str) -> bool:
    """MySQL ``LIKE`` match as used by database-level grants (``_``, ``%``, backslash escapes)."""
    regex, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            i += 1
            regex += re.escape(pattern[i])
        else:
            regex += ".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
        i += 1
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


def allows(
    grants: Iterable[Grant],
    wanted: Iterable[str],
    database: str | None = None,
    table: str | None = None,
) -> bool:
    """Whether the grants give one of ``wanted`` on ``database.table`` (globally when None).

    ``ALL`` / ``ALL PRIVILEGES`` count at any level they cover.
    """
    accepted = {*wanted, "ALL", "ALL PRIVILEGES"}
    for grant in grants:
        if not accepted & grant.privileges:
            continue
        if grant.database is None:
            return True
        if database is None or not _like(grant.database, database):
            continue
        if grant.table is None or grant.table == table:
            return True
    return False


def _grant_lines(source: Source) -> list[str]:
    lines = [str(r[0]) for r in source.query("SHOW GRANTS")]
    if not source.dialect.grants_include_active_roles:  # MySQL: only when asked USING the roles
        roles = source.query("SELECT CURRENT_ROLE()")[0][0]
        if roles and str(roles) != "NONE":
            lines = [
                str(r[0]) for r in source.query(f"SHOW GRANTS FOR CURRENT_USER() USING {roles}")
            ]
    return lines


def _account(user_at_host: str) -> str:
    user, _, host = user_at_host.rpartition("@")
    return f"'{user}'@'{host}'"


def privilege_checks(source: Source, tables: Iterable[TableConfig]) -> list[Check]:
    """REPLICATION SLAVE, REPLICATION CLIENT (in the server's dialect) and SELECT on every table."""
    grants = [g for g in map(parse_grant, _grant_lines(source)) if g is not None]
    account = _account(source.current_user())
    dialect = source.dialect
    checks = []
    for name, accepted, why in (
        ("REPLICATION SLAVE", frozenset({"REPLICATION SLAVE"}), "to read the binlog"),
        (
            "REPLICATION CLIENT",
            dialect.binlog_monitor_privileges,
            f"to read binlog positions ({dialect.binlog_status_sql}, SHOW BINARY LOGS)",
        ),
    ):
        if allows(grants, accepted):
            checks.append(Check(f"privilege {name}", True, f"{account} has {name}"))
        else:
            checks.append(
                Check(
                    f"privilege {name}",
                    False,
                    f"{account} lacks {name}, needed {why}",
                    f"GRANT {name} ON *.* TO {account}",
                )
            )
    tables = list(tables)
    missing = [t for t in tables if not allows(grants, {"SELECT"}, t.database, t.table)]
    if missing:
        names = ", ".join(t.name for t in missing)
        fix = "; ".join(
            f"GRANT SELECT ON {quote_identifier(t.database)}.{quote_identifier(t.table)} "
            f"TO {account}"
            for t in missing
        )
        checks.append(
            Check(
                "privilege SELECT",
                False,
                f"{account} lacks SELECT on {names}",
                fix,
                tuple(t.name for t in missing),
            )
        )
    else:
        checks.append(
            Check("privilege SELECT", True, f"{account} has SELECT on all {len(tables)} table(s)")
        )
    return checks
