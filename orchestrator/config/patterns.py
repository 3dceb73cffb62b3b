"""Table entries that are globs: which source tables a pipeline's ``tables`` list stands for.

An entry's ``name`` is ``database.table`` or a glob over the two parts (``crm.*``,
``*.orders_20??``, ``shop.[a-m]*``: ``*``, ``?`` and ``[...]`` as in shell globs, each part
matched on its own, so no glob crosses the dot), with optional ``exclude`` globs. A glob in
the database part never matches the server's own schemas (`SYSTEM_SCHEMAS`); a pattern
matches base tables only, MariaDB's system-versioned ones among them (not views or sequences,
nor a system-versioned table whose periods are transaction ids: name such a table explicitly),
and none whose engine keeps its rows elsewhere (`orchestrator.schema.tables.ROWS_ELSEWHERE`: a
MERGE, FEDERATED or BLACKHOLE table).

Two questions, two functions. *Which tables* a pipeline has is fixed when a run is planned
(`expand`, over the list of tables the source has): it needs the source. *How one table is
configured* (`resolve`) needs nothing: an explicit entry for it wins, else the first pattern in
config order that matches it and does not exclude it lends it its keys. So every step after
planning, in whatever process, finds a table's ``where`` or ``chunk_key`` from the config alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from orchestrator.config.sections import (
    Defaults,
    Reader,
    TableConfig,
    chunk_rows,
    kind_name,
    positive,
    section_keys,
    table_name_problem,
)
from orchestrator.errors import ConfigError

#: Schemas of the server itself: a glob in the database part never matches them.
SYSTEM_SCHEMAS = frozenset({"information_schema", "mysql", "performance_schema", "sys"})

_PART = r"(?:[^.\[\]/\\]|\[!?[^\]/\\]+\])+"
GLOB = re.compile(rf"^{_PART}\.{_PART}$")
#: How many table names a message lists before it says "and N more".
SHOWN = 8


def is_glob(name: str) -> bool:
    """Whether ``name`` holds a glob character.

    >>> is_glob("crm.*"), is_glob("shop.orders")
    (True, False)
    """
    return any(c in name for c in "*?[")


def check_glob(value: str) -> str | None:
    """The problem with a table name or glob as the config holds it, or None.

    >>> check_glob("crm.*"), check_glob("shop.[a-m]*") is None
    (None, True)
    >>> check_glob("crm*")
    "expected `database.table` or a glob over both (`crm.*`, `*.orders_20??`), found 'crm*'"
    """
    if GLOB.match(value):
        return None
    return (
        f"expected `database.table` or a glob over both (`crm.*`, `*.orders_20??`), found {value!r}"
    )


def _check_filter(sql: str) -> str | None:
    """`orchestrator.schema.filters.check_filter`, imported only for a config with a ``where``:
    the filters import sqlglot, 70 ms, which every other run would pay for nothing."""
    from orchestrator.schema.filters import check_filter

    return check_filter(sql)


def glob_matches(glob: str, name: str, *, fold: bool = False) -> bool:
    """Whether ``glob`` matches the table ``name``, part by part; ``fold``: ignoring case (a server
    with ``lower_case_table_names`` 1 or 2). A glob in the database part skips `SYSTEM_SCHEMAS`.

    >>> (glob_matches("crm.*", "crm.accounts"), glob_matches("*.a?", "x.ab"),
    ...  glob_matches("*.*", "mysql.user"))
    (True, True, False)
    >>> glob_matches("crm.*", "crm2.accounts"), glob_matches("CRM.acc*", "crm.accounts", fold=True)
    (False, True)
    """
    db_glob, _, table_glob = glob.partition(".")
    database, _, table = name.partition(".")
    if fold:
        db_glob, table_glob, database, table = (
            s.lower() for s in (db_glob, table_glob, database, table)
        )
    if is_glob(db_glob) and database.lower() in SYSTEM_SCHEMAS:
        return False
    return fnmatchcase(database, db_glob) and fnmatchcase(table, table_glob)


def takes(entry: TableConfig, name: str, *, fold: bool = False) -> bool:
    """Whether the pattern ``entry`` takes table ``name``: its glob matches and no exclude does."""
    return glob_matches(entry.name, name, fold=fold) and not any(
        glob_matches(x, name, fold=fold) for x in entry.exclude
    )


def _same(a: str, b: str, fold: bool) -> bool:
    return a.lower() == b.lower() if fold else a == b


def resolve(entries: Sequence[TableConfig], name: str, *, fold: bool = False) -> TableConfig | None:
    """How table ``name`` is configured: its explicit entry, else the first pattern taking it
    (with the table's own name), else None. Needs no source.

    >>> a = TableConfig("crm.*", 100, 4, where="x = 1", exclude=("crm.tmp_*",))
    >>> b = TableConfig("crm.big", 9, 2)
    >>> resolve([a, b], "crm.big").chunk_size, resolve([a, b], "crm.small").where
    (9, 'x = 1')
    >>> resolve([a, b], "crm.tmp_1") is None, resolve([a, b], "crm.small").exclude
    (True, ())
    """
    for entry in entries:
        if not entry.pattern and _same(entry.name, name, fold):
            return entry
    for entry in entries:
        if entry.pattern and takes(entry, name, fold=fold):
            return replace(entry, name=name, exclude=())
    return None


def listed(names: Sequence[str], limit: int = SHOWN) -> str:
    """Names for a message, the first few and how many more.

    >>> listed(["a.b", "a.c", "a.d"], 2), listed([])
    ('a.b, a.c and 1 more', 'none')
    """
    if not names:
        return "none"
    head = ", ".join(names[:limit])
    return head if len(names) <= limit else f"{head} and {len(names) - limit} more"


@dataclass(frozen=True, slots=True)
class PatternMatch:
    """What one pattern entry matched when the table set was expanded."""

    pattern: str
    index: int  # its place in ``tables``
    tables: tuple[str, ...]  # the tables it gives the pipeline, by name
    excluded: tuple[str, ...] = ()  # matched by the glob, left out by ``exclude``
    overridden: tuple[
        str, ...
    ] = ()  # matched, but configured by their own entry (or an earlier pattern)

    def __str__(self) -> str:
        text = f"{self.pattern} matches {len(self.tables)} table(s): {listed(self.tables)}"
        if self.excluded:
            text += f"; excluded: {listed(self.excluded)}"
        if self.overridden:
            text += f"; configured by their own entry: {listed(self.overridden)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "index": self.index,
            "tables": list(self.tables),
            "excluded": list(self.excluded),
            "overridden": list(self.overridden),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PatternMatch:
        """The match `to_json` gave.

        >>> m = PatternMatch("crm.*", 0, ("crm.a",), ("crm.tmp",))
        >>> PatternMatch.from_json(m.to_json()) == m
        True
        """
        return cls(
            str(data["pattern"]),
            int(data["index"]),
            tuple(data["tables"]),
            tuple(data.get("excluded", ())),
            tuple(data.get("overridden", ())),
        )


@dataclass(frozen=True, slots=True)
class TableSet:
    """The tables a pipeline has at one moment: every explicit entry and what each pattern
    matched."""

    tables: tuple[TableConfig, ...]  # one per table, in config order (a pattern's by name)
    patterns: tuple[PatternMatch, ...] = ()
    entry_of: Mapping[str, int] = field(default_factory=dict)  # table -> index of its entry

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    def entry_index(self, table: str) -> int:
        """The place in ``tables`` of the entry that configures ``table``."""
        return self.entry_of.get(table, 0)

    def select(self, names: Sequence[str] | None) -> tuple[TableConfig, ...]:
        """The tables named (all when none): a name is a table of the set or a pattern entry
        (all it matched), each table once, in set order.

        Raises:
            ConfigError: a name is neither, naming the entries there are.
        """
        if not names:
            return self.tables
        by_pattern = {m.pattern: set(m.tables) for m in self.patterns}
        known = set(self.names)
        wanted: set[str] = set()
        unknown = []
        for name in names:
            if name in by_pattern:
                wanted |= by_pattern[name]
            elif name in known:
                wanted.add(name)
            else:
                unknown.append(name)
        if unknown:
            entries = [m.pattern for m in self.patterns] + [
                t.name for t in self.tables if t.name not in self._from_patterns()
            ]
            raise ConfigError(
                f"table(s) {', '.join(unknown)} not in the pipeline (a configured table, a "
                f"pattern entry, or a table a pattern matches at the source); entries: "
                f"{listed(entries)}"
            )
        return tuple(t for t in self.tables if t.name in wanted)

    def _from_patterns(self) -> set[str]:
        return {name for m in self.patterns for name in m.tables}


def explicit_set(entries: Sequence[TableConfig]) -> TableSet:
    """The table set of a config without patterns (no source needed)."""
    return TableSet(tables=tuple(entries), entry_of={t.name: i for i, t in enumerate(entries)})


def expand(
    entries: Sequence[TableConfig], existing: Iterable[str], *, fold: bool = False
) -> TableSet:
    """The table set: every explicit entry (whether the source has it or not: preflight says),
    then each pattern's matches among ``existing`` at the pattern's place, sorted by name.

    >>> entries = [TableConfig("crm.*", 100, 4, exclude=("crm.tmp_*",)),
    ...            TableConfig("crm.big", 9, 2)]
    >>> s = expand(entries, ["crm.big", "crm.a", "crm.tmp_1", "shop.x"])
    >>> s.names, s.entry_index("crm.a"), s.entry_index("crm.big")
    (['crm.a', 'crm.big'], 0, 1)
    >>> print(s.patterns[0])
    crm.* matches 1 table(s): crm.a; excluded: crm.tmp_1; configured by their own entry: crm.big
    """
    names = sorted(set(existing))
    explicit = {
        (t.name.lower() if fold else t.name): i for i, t in enumerate(entries) if not t.pattern
    }
    taken: set[str] = set(explicit)
    chosen: dict[int, list[TableConfig]] = {}
    matches = []
    for index, entry in enumerate(entries):
        if not entry.pattern:
            chosen[index] = [entry]
            continue
        globbed = [n for n in names if glob_matches(entry.name, n, fold=fold)]
        excluded = tuple(n for n in globbed if not takes(entry, n, fold=fold))
        mine: list[str] = []
        overridden: list[str] = []
        for name in (n for n in globbed if n not in excluded):
            key = name.lower() if fold else name
            (overridden if key in taken else mine).append(name)
            taken.add(key)
        chosen[index] = [replace(entry, name=n, exclude=()) for n in mine]
        matches.append(PatternMatch(entry.name, index, tuple(mine), excluded, tuple(overridden)))
    tables = tuple(t for index in sorted(chosen) for t in chosen[index])
    entry_of = {t.name: index for index in sorted(chosen) for t in chosen[index]}
    return TableSet(tables=tables, patterns=tuple(matches), entry_of=entry_of)


# --------------------------------------------------------------------------- the config's list


def parse_tables(r: Reader, data: Any, defaults: Defaults) -> tuple[TableConfig, ...]:
    """The ``tables`` list: names or globs (`check_glob`), per-table keys, a pattern's
    ``exclude``."""
    if not isinstance(data, list) or not data:
        r.problem("tables", f"expected a non-empty list of tables, found {kind_name(data)}")
        return ()
    tables: list[TableConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        key = f"tables[{i}]"
        m = r.mapping(item, key, section_keys(TableConfig), {"name"})
        name = r.value(
            m,
            "name",
            f"{key}.name",
            str,
            "",
            lambda v: check_glob(v) if is_glob(v) else table_name_problem(v),
        )
        if name and name in seen:
            r.problem(f"{key}.name", f"table {name} is listed twice")
        seen.add(name)
        exclude = _exclude(r, m, key, is_glob(name))
        chunk_key = m.get("chunk_key")
        if isinstance(chunk_key, str):
            chunk_key = [chunk_key]
        if chunk_key is not None and (
            not isinstance(chunk_key, list)
            or not chunk_key
            or not all(isinstance(c, str) and c.strip() for c in chunk_key)
        ):
            r.problem(
                f"{key}.chunk_key",
                f"expected a column name or a list of column names, found {chunk_key!r}",
            )
            chunk_key = None
        tables.append(
            TableConfig(
                name=name,
                chunk_size=r.value(
                    m, "chunk_size", f"{key}.chunk_size", int, defaults.chunk_size, chunk_rows
                ),
                batch_chunks=r.value(
                    m, "batch_chunks", f"{key}.batch_chunks", int, defaults.batch_chunks, positive
                ),
                chunk_key=tuple(chunk_key) if chunk_key else None,
                where=r.value(m, "where", f"{key}.where", str, None, _check_filter),
                exclude=exclude,
                keyless_lock=r.value(m, "keyless_lock", f"{key}.keyless_lock", bool, False),
            )
        )
    return tuple(tables)


def _exclude(r: Reader, m: dict[str, Any], key: str, pattern: bool) -> tuple[str, ...]:
    """A pattern entry's ``exclude``: a glob or a list of globs."""
    value = m.get("exclude")
    if value is None:
        return ()
    if not pattern:
        r.problem(
            f"{key}.exclude", "exclude applies to a pattern entry only (a name with *, ? or [...])"
        )
        return ()
    globs = [value] if isinstance(value, str) else value
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        r.problem(f"{key}.exclude", f"expected a glob or a list of globs, found {value!r}")
        return ()
    for i, glob in enumerate(globs):
        if (problem := check_glob(glob)) is not None:
            r.problem(f"{key}.exclude[{i}]", problem)
    return tuple(globs)


def dropped(entries: Sequence[TableConfig], found: TableSet, published: Iterable[str]) -> list[str]:
    """The published tables a pattern entry takes that the source no longer has (its expansion
    ``found`` does not hold them): reported, and kept in the lake as last published.

    >>> entries = [TableConfig("crm.*", 100, 4), TableConfig("shop.orders", 9, 2)]
    >>> dropped(entries, expand(entries, ["crm.a"]), ["crm.a", "crm.old", "shop.orders", "x.y"])
    ['crm.old']
    """
    have = set(found.names)
    explicit = {e.name for e in entries if not e.pattern}
    return [
        name
        for name in sorted(published)
        if name not in have
        and name not in explicit
        and any(e.pattern and takes(e, name) for e in entries)
    ]
