"""The source's cascading foreign keys and how the server treats their cascades.

One query of ``information_schema.REFERENTIAL_CONSTRAINTS`` (the rules) joined with
``KEY_COLUMN_USAGE`` (the column pairs, in the key's order) lists every foreign key whose
``ON DELETE`` or ``ON UPDATE`` changes child rows; `orchestrator.schema.cascades` turns them
into a run's cascade graph. `cascade_mode` says whether the server logs the rows its cascades
change (MySQL 9.6+ in the SQL layer) or Tidemark must derive them (InnoDB's own cascades).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from orchestrator.config.patterns import SYSTEM_SCHEMAS
from orchestrator.schema.cascades import ForeignKey, Mode, Rule
from orchestrator.source.connection import Source

#: From the key's columns, which a user sees with a privilege on the child: the rules, in
#: ``REFERENTIAL_CONSTRAINTS``, may be hidden from one without a privilege on the parent (MariaDB),
#: and a key whose rules are unknown must not pass for one that changes nothing. Filtered on
#: ``TABLE_SCHEMA``, which the server uses to open only those databases' tables.
_KEYS_SQL = (
    "SELECT k.CONSTRAINT_SCHEMA, k.TABLE_NAME, k.CONSTRAINT_NAME, rc.DELETE_RULE,"
    " rc.UPDATE_RULE, k.COLUMN_NAME, k.REFERENCED_TABLE_SCHEMA, k.REFERENCED_TABLE_NAME,"
    " k.REFERENCED_COLUMN_NAME"
    " FROM information_schema.KEY_COLUMN_USAGE k"
    " LEFT JOIN information_schema.REFERENTIAL_CONSTRAINTS rc"
    " ON rc.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA AND rc.CONSTRAINT_NAME = k.CONSTRAINT_NAME"
    " AND rc.TABLE_NAME = k.TABLE_NAME"
    " WHERE k.REFERENCED_TABLE_NAME IS NOT NULL AND k.TABLE_SCHEMA IN ({schemas})"
    " AND (rc.CONSTRAINT_NAME IS NULL OR rc.DELETE_RULE IN ('CASCADE', 'SET NULL', 'SET DEFAULT')"
    " OR rc.UPDATE_RULE IN ('CASCADE', 'SET NULL', 'SET DEFAULT'))"
    " ORDER BY k.CONSTRAINT_SCHEMA, k.TABLE_NAME, k.CONSTRAINT_NAME, k.ORDINAL_POSITION"
)


def cascading_keys(source: Source, tables: Iterable[str]) -> list[ForeignKey]:
    """The foreign keys whose rules change child rows of ``tables`` or, recursively, of their
    parents: those of the tables' databases, then of every database their parents are in (one
    query per round; ``information_schema`` is asked only about the databases concerned)."""
    wanted = {t.partition(".")[0] for t in tables}
    asked: set[str] = set(SYSTEM_SCHEMAS)
    keys: list[ForeignKey] = []
    while todo := sorted(wanted - asked):
        marks = ", ".join(["%s"] * len(todo))
        found = keys_of(source.query(_KEYS_SQL.format(schemas=marks), todo))
        asked |= set(todo)
        keys += found
        wanted |= {k.parent.partition(".")[0] for k in found}
    return keys


def keys_of(rows: Sequence[Sequence[Any]]) -> list[ForeignKey]:
    """`ForeignKey` values from the rows of `cascading_keys`' query (one row per column pair);
    rules the user cannot see are ``UNKNOWN``.

    >>> rows = [("s", "c", "fk", "CASCADE", "RESTRICT", "a", "s", "p", "x"),
    ...         ("s", "c", "fk", "CASCADE", "RESTRICT", "b", "s", "p", "y")]
    >>> print(keys_of(rows)[0])
    s.c (a, b) -> s.p (x, y) ON DELETE CASCADE ON UPDATE RESTRICT
    >>> keys_of([("s", "c", "fk", None, None, "a", "s", "p", "x")])[0].hidden
    True
    """
    grouped: dict[tuple[str, str, str], list[Sequence[Any]]] = {}
    for row in rows:
        grouped.setdefault((_text(row[0]), _text(row[1]), _text(row[2])), []).append(row)
    keys = []
    for (schema, table, name), pairs in grouped.items():
        first = pairs[0]
        keys.append(
            ForeignKey(
                name=name,
                child=f"{schema}.{table}",
                columns=tuple(_text(p[5]) for p in pairs),
                parent=f"{_text(first[6])}.{_text(first[7])}",
                referenced=tuple(_text(p[8]) for p in pairs),
                on_delete=_rule(first[3]),
                on_update=_rule(first[4]),
            )
        )
    return keys


def cascade_mode(source: Source) -> Mode:
    """``logged`` when the server writes row events for the child rows its cascades change
    (`orchestrator.source.dialect.Dialect.logs_cascades`), else ``derive``."""
    dialect = source.dialect
    if dialect.flavor != "mysql":
        return "derive"
    native = source.variables("innodb_native_foreign_keys")["innodb_native_foreign_keys"]
    return "logged" if dialect.logs_cascades(native) else "derive"


def _rule(value: Any) -> Rule:
    return "UNKNOWN" if value is None else cast(Rule, _text(value).upper())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
