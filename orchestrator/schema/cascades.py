"""Foreign keys whose actions change a child's rows inside the engine: the cascade graph.

InnoDB carries out ``ON DELETE``/``ON UPDATE`` ``CASCADE`` and ``SET NULL`` itself, and MariaDB
and MySQL before 9.6 write no row event for the child rows it changes (docs/design.md,
"Foreign-key cascades"). For every run table, the keys that can change its rows so are those
it is the child of, and, recursively, those of its parents (a parent changed by a cascade
cascades on): `closure`. A key is *derived* (its child-side changes computed from the parent's
row events) when its values compare exactly as the lake holds them; otherwise a cascade
through it re-reads the child (`rereads` says why). RESTRICT and NO ACTION change nothing:
the parent change could not happen while a child referenced it.

>>> fk = ForeignKey("fk_c", "shop.items", ("order_id",), "shop.orders", ("id",), "CASCADE",
...                 "CASCADE")
>>> print(fk)
shop.items (order_id) -> shop.orders (id) ON DELETE CASCADE ON UPDATE CASCADE
>>> fk.action("D"), ForeignKey.from_json(fk.to_json()) == fk
('CASCADE', True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from orchestrator.schema.families import FAMILIES
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import arrow_type, is_boolean

#: ``UNKNOWN``: the source user cannot see the rule (MariaDB hides ``REFERENTIAL_CONSTRAINTS``
#: from a user without a privilege on the parent).
Rule = Literal["CASCADE", "SET NULL", "SET DEFAULT", "RESTRICT", "NO ACTION", "UNKNOWN"]
#: The rules that change child rows.
ACTIONS: frozenset[str] = frozenset({"CASCADE", "SET NULL", "SET DEFAULT"})
#: How a server treats cascades: ``derive`` (InnoDB runs them and logs nothing: Tidemark derives
#: them) or ``logged`` (MySQL 9.6+ runs them in the SQL layer and logs their rows).
Mode = Literal["derive", "logged"]
#: Families whose published values compare as InnoDB compares the stored ones (one value per
#: stored value): text only under a binary collation, below.
_EXACT_FAMILIES = frozenset({"integer", "year", "decimal", "binary", "bit", "text", "packed"})


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """A foreign key, as ``information_schema`` describes it.

    Attributes:
        name: the constraint's name.
        child: the referencing table, ``database.table``.
        columns: its columns, in the key's order.
        parent: the referenced table.
        referenced: the parent's columns, paired with ``columns``.
        on_delete: the rule when a parent row is deleted.
        on_update: the rule when a parent row's referenced columns change.
        rereads: why a cascade through this key is re-read rather than derived (None: derived).
    """

    name: str
    child: str
    columns: tuple[str, ...]
    parent: str
    referenced: tuple[str, ...]
    on_delete: Rule = "RESTRICT"
    on_update: Rule = "RESTRICT"
    rereads: str | None = None

    def action(self, op: Literal["D", "U"]) -> Rule | None:
        """The rule that changes child rows when a parent row is deleted (``D``) or its
        referenced columns change (``U``); None when it changes nothing."""
        rule = self.on_delete if op == "D" else self.on_update
        return rule if rule in ACTIONS else None

    @property
    def cascades(self) -> bool:
        """Whether either rule changes child rows (or may: a rule the user cannot see)."""
        return self.action("D") is not None or self.action("U") is not None or self.hidden

    @property
    def hidden(self) -> bool:
        """Whether the source user cannot see the key's rules."""
        return "UNKNOWN" in (self.on_delete, self.on_update)

    def __str__(self) -> str:
        return (
            f"{self.child} ({', '.join(self.columns)}) -> {self.parent} "
            f"({', '.join(self.referenced)}) ON DELETE {self.on_delete} ON UPDATE {self.on_update}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "child": self.child,
            "columns": list(self.columns),
            "parent": self.parent,
            "referenced": list(self.referenced),
            "on_delete": self.on_delete,
            "on_update": self.on_update,
            "rereads": self.rereads,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ForeignKey:
        return cls(
            str(data["name"]),
            str(data["child"]),
            tuple(data["columns"]),
            str(data["parent"]),
            tuple(data["referenced"]),
            data["on_delete"],
            data["on_update"],
            data.get("rereads"),
        )


def closure(tables: Iterable[str], keys: Iterable[ForeignKey]) -> list[ForeignKey]:
    """The cascading keys that can change the rows of ``tables``: those they are the child of,
    and those of every table such a key names as parent, recursively (several levels, cycles and
    self-references included). In the order found, each once.

    >>> a = ForeignKey("a", "s.c", ("p",), "s.p", ("id",), "CASCADE")
    >>> b = ForeignKey("b", "s.p", ("g",), "s.g", ("id",), "SET NULL")
    >>> r = ForeignKey("r", "s.c", ("x",), "s.x", ("id",))  # RESTRICT: changes nothing
    >>> t = ForeignKey("t", "s.t", ("up",), "s.t", ("id",), "CASCADE")
    >>> [k.name for k in closure(["s.c", "s.t"], [a, b, r, t])]
    ['a', 't', 'b']
    """
    by_child: dict[str, list[ForeignKey]] = {}
    for key in keys:
        if key.cascades:
            by_child.setdefault(key.child.lower(), []).append(key)
    found: list[ForeignKey] = []
    seen: set[str] = set()
    queue = [t.lower() for t in tables]
    for table in queue:  # grows as parents are found: breadth first
        if table in seen:
            continue
        seen.add(table)
        for key in by_child.get(table, []):
            found.append(key)
            queue.append(key.parent.lower())
    return found


def descendants(table: str, keys: Iterable[ForeignKey]) -> set[str]:
    """The tables whose rows a change of ``table``'s rows can reach through ``keys`` (itself when
    it references itself), lower case.

    >>> a = ForeignKey("a", "s.c", ("p",), "s.p", ("id",), "CASCADE")
    >>> b = ForeignKey("b", "s.g", ("c",), "s.c", ("id",), "SET NULL")
    >>> sorted(descendants("s.p", [a, b])), sorted(descendants("s.g", [a, b]))
    (['s.c', 's.g'], [])
    """
    by_parent: dict[str, list[str]] = {}
    for key in keys:
        if key.cascades:
            by_parent.setdefault(key.parent.lower(), []).append(key.child.lower())
    found: set[str] = set()
    todo = list(by_parent.get(table.lower(), []))
    while todo:
        child = todo.pop()
        if child not in found:
            found.add(child)
            todo += by_parent.get(child, [])
    return found


def with_reasons(
    keys: Sequence[ForeignKey],
    infos: Mapping[str, TableInfo],
    filtered: Mapping[str, set[str]] | None = None,
) -> list[ForeignKey]:
    """``keys``, each with why a cascade through it must be re-read (`ForeignKey.rereads`), or
    None where Tidemark derives it.

    Args:
        keys: the cascading keys.
        infos: the shape of every table they name, by ``database.table`` (lower case).
        filtered: for a child with a ``where`` filter, the columns it reads (lower case).
    """
    return [
        replace(key, rereads=reread_reason(key, infos, (filtered or {}).get(key.child.lower())))
        for key in keys
    ]


def reread_reason(
    key: ForeignKey, infos: Mapping[str, TableInfo], filter_columns: set[str] | None = None
) -> str | None:
    """Why a cascade through ``key`` cannot be derived exactly (None: it can).

    >>> def t(name, *cols, pk=("id",)):
    ...     return TableInfo(*name.split("."), tuple(cols), pk, (), 0)
    >>> i = ColumnInfo("id", "int", "int(11)", False)
    >>> p = ColumnInfo("p", "int", "int(11)", True)
    >>> code = ColumnInfo("code", "varchar", "varchar(3)", False, collation="utf8mb4_general_ci")
    >>> ref = ColumnInfo("ref", "varchar", "varchar(3)", True, collation="utf8mb4_general_ci")
    >>> infos = {"s.p": t("s.p", i, code), "s.c": t("s.c", i, p, ref)}
    >>> fk = ForeignKey("f", "s.c", ("p",), "s.p", ("id",), "CASCADE")
    >>> reread_reason(fk, infos) is None
    True
    >>> print(reread_reason(ForeignKey("f", "s.c", ("ref",), "s.p", ("code",), "CASCADE"), infos))
    s.c.ref compares text in collation utf8mb4_general_ci, which Tidemark does not evaluate; \
s.p (code) is not a unique key of s.p
    >>> infos["s.k"] = t("s.k", i, p, pk=())
    >>> print(reread_reason(ForeignKey("f", "s.k", ("p",), "s.p", ("id",), "CASCADE"), infos))
    s.k has no key: its rows are a multiset
    """
    if key.hidden:
        return f"the source user cannot see its rules (no privilege on {key.parent})"
    reasons = []
    for rule in (key.on_delete, key.on_update):
        if rule == "SET DEFAULT":
            reasons.append("SET DEFAULT needs the column defaults")
            break
    child, parent = infos.get(key.child.lower()), infos.get(key.parent.lower())
    if child is None or parent is None:
        return f"the shape of {key.child if child is None else key.parent} is unknown"
    if not child.primary_key and not child.unique_not_null_keys:
        # its rows count as a multiset (docs/design.md, "Tables without a key"): derived records
        # would need the full image of every row a cascade changes
        reasons.append(f"{child.name} has no key: its rows are a multiset")
    for name, referenced in zip(key.columns, key.referenced, strict=True):
        try:
            column, other = child.column(name), parent.column(referenced)
        except KeyError:
            return f"column {name} or {referenced} is not in the table"
        why = _inexact(column, other)
        if why:
            reasons.append(f"{child.name}.{column.name} {why}")
    unique = [set(k.lower() for k in parent.primary_key)] + [
        set(k.lower() for k in u) for u in parent.unique_not_null_keys
    ]
    if {c.lower() for c in key.referenced} not in unique:
        reasons.append(
            f"{key.parent} ({', '.join(key.referenced)}) is not a unique key of {key.parent}"
        )
    changes_columns = key.action("U") is not None or key.on_delete == "SET NULL"
    if filter_columns and changes_columns and filter_columns & {c.lower() for c in key.columns}:
        reasons.append(f"the where filter of {key.child} reads the key's columns")
    return "; ".join(reasons) or None


def _inexact(column: ColumnInfo, parent: ColumnInfo) -> str | None:
    """Why ``column``'s published values do not compare as InnoDB compares it with ``parent``'s."""
    family = FAMILIES.get(column.data_type)
    if family not in _EXACT_FAMILIES or is_boolean(column) or is_boolean(parent):
        return f"is {column.column_type}, whose published values do not compare as stored ones"
    if arrow_type(column) != arrow_type(parent):
        return f"is published as {arrow_type(column)}, its parent column as {arrow_type(parent)}"
    collation = (column.collation or "").lower()
    if family == "text" and not (collation.endswith("_bin") or collation == "binary"):
        return f"compares text in collation {collation}, which Tidemark does not evaluate"
    return None


def pads(column: ColumnInfo) -> bool:
    """Whether ``column``'s text compares without trailing spaces (a PAD SPACE ``_bin`` collation;
    the NO PAD ones name ``nopad`` or ``0900``).

    >>> pads(ColumnInfo("c", "varchar", "varchar(3)", True, collation="utf8mb4_bin"))
    True
    >>> pads(ColumnInfo("c", "varchar", "varchar(3)", True, collation="utf8mb4_nopad_bin"))
    False
    """
    collation = (column.collation or "").lower()
    return (
        FAMILIES.get(column.data_type) == "text"
        and "nopad" not in collation
        and "0900" not in collation
    )
