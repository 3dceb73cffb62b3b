"""Tables' ``where`` filters applied to their change records, as capture writes them.

The published table is ``SELECT * FROM t WHERE <where>`` (docs/config.md), so a change
counts by its after-image: one that matches puts the row, one that does not deletes the
key (a row updated out of the filter leaves the lake, one inserted outside it never
enters), and a delete deletes. Capture rewrites each segment before writing it: an
insert or update whose after-image does not match becomes a ``D`` whose ``_tm_old_`` key
is its before-image key (an insert's: its own key), so both reconcile engines, which
delete a ``D``'s key and its old key when they differ, need no filter of their own.
The verdicts are `orchestrator.schema.filters`'; text in a server collation is compared
by the source (`ServerCollation`), over one connection opened on first need.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.errors import ConfigError
from orchestrator.pipeline.changes import OLD_PREFIX, OP
from orchestrator.schema.collations import FilterError
from orchestrator.schema.tables import ColumnInfo, TableInfo

if TYPE_CHECKING:  # the filters import sqlglot (70 ms): only a run with a filter does
    from orchestrator.schema.filters import Verdict

Query = Callable[[str, Sequence[Any]], Sequence[Sequence[Any]]]
_NAME = re.compile(r"[A-Za-z0-9_]+")


class ServerCollation:
    """`orchestrator.schema.filters.CollationOracle` answered by a MySQL server, remembered.

    Args:
        query: runs one statement with ``%s`` parameters and returns its rows.
    """

    def __init__(self, query: Query) -> None:
        self.query = query
        self.cache: dict[tuple[Any, ...], Any] = {}

    def _operand(self, column: ColumnInfo) -> str:
        charset, collation = column.charset or "", column.collation or ""
        if not (_NAME.fullmatch(charset) and _NAME.fullmatch(collation)):
            raise FilterError(f"column `{column.name}`: unexpected collation {collation!r}")
        return f"CONVERT(%s USING {charset}) COLLATE {collation}"

    def compare(self, column: ColumnInfo, a: str, b: str) -> int:
        key = ("cmp", column.collation, a, b)
        if key not in self.cache:
            operand = self._operand(column)
            rows = self.query(f"SELECT STRCMP({operand}, {operand})", [a, b])
            self.cache[key] = int(rows[0][0])
        return int(self.cache[key])

    def like(self, column: ColumnInfo, value: str, pattern: str, escape: str) -> bool:
        key = ("like", column.collation, value, pattern, escape)
        if key not in self.cache:
            operand = self._operand(column)
            rows = self.query(
                f"SELECT {operand} LIKE {operand} ESCAPE %s", [value, pattern, escape]
            )
            self.cache[key] = bool(rows[0][0])
        return bool(self.cache[key])


def compile_table_filter(where: str, info: TableInfo, oracle: ServerCollation | None) -> Verdict:
    """A table's filter bound to its columns; a filter it cannot evaluate is a config error."""
    from orchestrator.schema.filters import compile_filter

    try:
        return compile_filter(where, info, oracle)
    except FilterError as exc:
        raise ConfigError(f"table {info.name}: {exc}") from None


class FilteredTable(Protocol):
    """What a filter needs of a captured table
    (`orchestrator.pipeline.capture.buffer.CaptureTable`)."""

    @property
    def info(self) -> TableInfo: ...
    @property
    def key(self) -> tuple[str, ...]: ...
    @property
    def where(self) -> str | None: ...
    @property
    def multiset(self) -> bool: ...


class Server(Protocol):
    """The source, as far as collations need it (`orchestrator.source.connection.Source`)."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Sequence[Sequence[Any]]: ...
    def close(self) -> None: ...


class ChangeFilters:
    """The filters of the tables that have one, applied to their change segments; a context
    manager closing the source connection if a collation needed one.

    Args:
        tables: ``{"db.table": table}``; tables without ``where`` pass unchanged.
        connect: opens the source (called once, on the first comparison that needs the
            server's collation).
    """

    def __init__(
        self,
        tables: Mapping[str, FilteredTable] | None = None,
        connect: Callable[[], Server] | None = None,
    ) -> None:
        self._connect = connect
        self._server: Server | None = None
        oracle = ServerCollation(self._run)
        self.filters: dict[str, tuple[Verdict, list[str], list[str]]] = {}
        self.multisets = {name for name, table in (tables or {}).items() if table.multiset}
        for name, table in (tables or {}).items():
            info, key, where = table.info, table.key, table.where
            if where:
                from orchestrator.schema.filters import used_columns

                wanted = {c.lower() for c in used_columns(where)}
                columns = [c.name for c in info.columns if c.name.lower() in wanted]
                keys = [info.column(k).name for k in key]
                self.filters[name] = (compile_table_filter(where, info, oracle), columns, keys)

    def _run(self, sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        if self._server is None:
            if self._connect is None:
                raise FilterError("comparing text in a server collation needs the source")
            self._server = self._connect()
        return self._server.query(sql, params)

    def __enter__(self) -> ChangeFilters:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def apply(self, name: str, changes: pa.Table) -> pa.Table:
        """The segment with each insert/update whose after-image does not match turned into a
        delete of its key (and of its before-image key)."""
        entry = self.filters.get(name)
        if entry is None or changes.num_rows == 0:
            return changes
        if name in self.multisets:
            return _counted(entry, changes)
        verdict, columns, keys = entry
        ops = changes.column(OP).to_pylist()
        rows = changes.select(columns).to_pylist()
        leaves = pa.array(
            [op != "D" and verdict(row) is not True for op, row in zip(ops, rows, strict=True)]
        )
        if not pc.any(leaves).as_py():
            return changes
        inserted = pc.and_(leaves, pc.equal(changes.column(OP), "I"))
        out = changes.set_column(
            changes.schema.get_field_index(OP),
            changes.schema.field(OP),
            pc.if_else(leaves, "D", changes.column(OP)),
        )
        for k in keys:
            old = OLD_PREFIX + k
            index = out.schema.get_field_index(old)
            out = out.set_column(
                index, out.schema.field(old), pc.if_else(inserted, out.column(k), out.column(old))
            )
        return out


def _counted(entry: tuple[Verdict, list[str], list[str]], changes: pa.Table) -> pa.Table:
    """The changes of a table without a key (its rows count: `orchestrator.pipeline.keyless`),
    each keeping only the images that match: an insert or a delete of a row that does not match
    is dropped; an update whose before image alone matches becomes a delete of that image, one
    whose after image alone matches an insert of it, one matching neither is dropped. A row that
    does not match is never in the lake, so none is removed for it."""
    verdict, columns, every = entry
    ops = changes.column(OP).to_pylist()
    images = changes.select(columns).to_pylist()
    befores = changes.select([OLD_PREFIX + c for c in columns]).rename_columns(columns).to_pylist()
    kept: list[str | None] = []
    for op, image, before in zip(ops, images, befores, strict=True):
        matches = verdict(image) is True
        if op != "U":
            kept.append(op if matches else None)
        elif verdict(before) is True:
            kept.append("U" if matches else "D")
        else:
            kept.append("I" if matches else None)
    new_ops = pa.array(kept, pa.string())
    left = pc.and_(pc.equal(changes.column(OP), "U"), pc.equal(new_ops, "D"))
    out = changes.set_column(
        changes.schema.get_field_index(OP), changes.schema.field(OP), pc.fill_null(new_ops, "")
    )
    for c in every:  # an update turned into a delete removes its before image
        index = out.schema.get_field_index(c)
        out = out.set_column(
            index, out.schema.field(c), pc.if_else(left, out.column(OLD_PREFIX + c), out.column(c))
        )
    return out.filter(pc.is_valid(new_ops))
