"""What Tidemark knows about a source table's shape (filled by `orchestrator.source.connection`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from orchestrator.schema.families import FAMILIES


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column, as ``information_schema.COLUMNS`` describes it.

    Attributes:
        name: column name.
        data_type: lower-case base type, e.g. ``"bigint"``, ``"varchar"``, ``"datetime"``.
        column_type: full lower-case type, e.g. ``"bigint(20) unsigned"``, ``"enum('a','b')"``.
        nullable: whether NULL is allowed.
        precision: NUMERIC_PRECISION (decimal digits; bits for BIT), or None.
        scale: NUMERIC_SCALE, or None.
        datetime_precision: fractional seconds digits for TIME/DATETIME/TIMESTAMP, or None.
        charset: character set for text columns, or None.
        collation: collation for text columns, or None.
        in_key: part of the primary key or of a unique NOT NULL key (`mark_keys`): its values
            tell rows apart, so a TINYINT(1) one is not published as a boolean.
        srid: the SRID a spatial column declares (MySQL 8's ``SRID n``, MariaDB's
            ``REF_SYSTEM_ID``, which MariaDB reports as 0 when none is declared), or None: none
            declared (MySQL), or not a spatial column. Published with the column (docs/types.md).
    """

    name: str
    data_type: str
    column_type: str
    nullable: bool
    precision: int | None = None
    scale: int | None = None
    datetime_precision: int | None = None
    charset: str | None = None
    collation: str | None = None
    in_key: bool = False
    srid: int | None = None

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type

    @property
    def display_width(self) -> int | None:
        """The ``(n)`` of ``tinyint(1)`` or ``bit(8)``; None when absent."""
        head = self.column_type.split(" ", 1)[0]
        if "(" in head and head.endswith(")") and FAMILIES.get(self.data_type) in _WIDTH_FAMILIES:
            inner = head[head.index("(") + 1 : -1]
            return int(inner) if inner.isdigit() else None
        return None


#: The families whose COLUMN_TYPE may carry a display width or a bit count: ``int(11)``, ``bit(8)``.
_WIDTH_FAMILIES = ("integer", "bit", "year")


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A source table: columns in ordinal order, keys, and the server's row estimate."""

    database: str
    table: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...]
    unique_not_null_keys: tuple[tuple[str, ...], ...]
    row_estimate: int
    engine: str | None = None
    #: MariaDB's system versioning (``WITH SYSTEM VERSIONING``): its rows events hold history
    #: rows beside the current ones (`orchestrator.binlog.shape.shape_difference`).
    versioned: bool = False
    #: ``information_schema.TABLES.TABLE_TYPE`` (``BASE TABLE``, ``VIEW``, ``SEQUENCE``...);
    #: None where it was not read (a plan stored before it was).
    kind: str | None = None
    #: A system-versioned table's ``GENERATED ALWAYS AS ROW END`` column, when it declares its
    #: period columns (None: it does not, and the server logs its hidden ``row_end`` after the
    #: planned columns; `orchestrator.binlog.versioned`).
    row_end: str | None = None

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    def column(self, name: str) -> ColumnInfo:
        for column in self.columns:
            if column.name.lower() == name.lower():
                return column
        raise KeyError(name)


def mark_keys(
    columns: tuple[ColumnInfo, ...], keys: Sequence[Sequence[str]]
) -> tuple[ColumnInfo, ...]:
    """``columns`` with those of any of ``keys`` (the primary key, the unique NOT NULL keys)
    marked `ColumnInfo.in_key`.

    >>> cols = (ColumnInfo("id", "tinyint", "tinyint(1)", False),
    ...         ColumnInfo("v", "int", "int(11)", True))
    >>> [c.in_key for c in mark_keys(cols, [("ID",)])]
    [True, False]
    """
    names = {name.lower() for key in keys for name in key}
    return tuple(replace(c, in_key=True) if c.name.lower() in names else c for c in columns)


#: ``information_schema.TABLES.TABLE_TYPE`` of MariaDB's system-versioned tables.
VERSIONED = "SYSTEM VERSIONED"
#: The ``COLUMN_TYPE`` of a system-versioned table's period end when its periods are times (the
#: hidden one a table declaring none gets too); a ``BIGINT UNSIGNED`` one holds transaction ids.
PERIOD_BY_TIME = "timestamp(6)"

#: Engines whose rows are not the rows this server's binlog logs under the table's name, each
#: with why (docs/limits.md, "Tables the binlog does not keep"). A pattern leaves them out
#: (`orchestrator.source.listing`); a table named in the config fails its checks.
ROWS_ELSEWHERE: dict[str, str] = {
    "BLACKHOLE": "keeps no rows, while the binlog logs the rows written to it",
    "MRG_MYISAM": (
        "shows the rows of the tables its UNION names, whose changes the binlog logs under "
        "their own names"
    ),
    "FEDERATED": (
        "shows the rows of a table on another server (or another table), whose changes are "
        "not logged under its name"
    ),
    "CONNECT": "shows rows kept outside the server's tables (files, other servers)",
    "SPIDER": "shows the rows of tables on other servers",
    "OQGRAPH": "computes its rows from another table",
    "SPHINX": "shows the answers of a Sphinx search server",
}


def unkept(info: TableInfo) -> str | None:
    """Why the binlog cannot keep the table in step with its source (its rows are not what the
    binlog logs under its name), or None: it can.

    >>> t = TableInfo("shop", "v", (), (), (), 0, kind="VIEW")
    >>> print(unkept(t))
    a VIEW: the binlog logs the changes of its base tables, never rows of the view
    >>> print(unkept(replace(t, kind="BASE TABLE", engine="Mrg_MyISAM"))[:40])
    a MRG_MYISAM table: it shows the rows of
    >>> print(unkept(replace(t, kind="BASE TABLE", engine="InnoDB")))
    None
    """
    if info.kind == "VIEW":
        return "a VIEW: the binlog logs the changes of its base tables, never rows of the view"
    if info.kind == "SEQUENCE":
        return (
            "a SEQUENCE: the binlog logs its one row anew at each change, as a row added, "
            "not replaced"
        )
    engine = (info.engine or "").upper()
    if engine in ROWS_ELSEWHERE:
        return f"a {engine} table: it {ROWS_ELSEWHERE[engine]}"
    return None


#: `ColumnInfo`'s fields, all plain values: a column is stored as a flat mapping of them (what
#: `dataclasses.asdict` gives, without its deep copy: 2,000 tables' plans took 0.4 s of it).
_COLUMN_FIELDS = tuple(f.name for f in fields(ColumnInfo))


def table_info_to_json(info: TableInfo) -> dict[str, Any]:
    """A JSON-able form of `TableInfo`, stored with a run so later steps need not re-query."""
    return {
        "database": info.database,
        "table": info.table,
        "columns": [{f: getattr(c, f) for f in _COLUMN_FIELDS} for c in info.columns],
        "primary_key": list(info.primary_key),
        "unique_not_null_keys": [list(k) for k in info.unique_not_null_keys],
        "row_estimate": info.row_estimate,
        "engine": info.engine,
        "versioned": info.versioned,
        "kind": info.kind,
        "row_end": info.row_end,
    }


def table_info_from_json(data: dict[str, Any]) -> TableInfo:
    """Inverse of `table_info_to_json`."""
    return TableInfo(
        database=data["database"],
        table=data["table"],
        columns=tuple(ColumnInfo(**c) for c in data["columns"]),
        primary_key=tuple(data["primary_key"]),
        unique_not_null_keys=tuple(tuple(k) for k in data["unique_not_null_keys"]),
        row_estimate=int(data["row_estimate"]),
        engine=data.get("engine"),
        versioned=bool(data.get("versioned", False)),
        kind=data.get("kind"),
        row_end=data.get("row_end"),
    )


#: Shapes `table_info_of` keeps decoded, by their text: more than a pipeline's tables, so that a
#: step going through every table finds each one a step before decoded (about 3 KiB each).
SHAPES_KEPT = 20_000
_shapes: dict[str, TableInfo] = {}  # oldest first
_shapes_lock = threading.Lock()


def table_info_text(info: TableInfo) -> str:
    """`table_info_to_json` as JSON text: how a run's table record holds the shape it planned
    (a string inside the record's JSON info). Each step of a process then decodes a shape once
    (`table_info_of`; the process that wrote it, none), and a merge into the record's info
    re-encodes one string, not every column: a run of thousands of tables read and wrote their
    shapes at every step.

    >>> table_info_of(table_info_text(TableInfo("d", "t", (), ("id",), (), 1))).primary_key
    ('id',)
    """
    text = json.dumps(table_info_to_json(info), separators=(",", ":"))
    _keep(text, info)
    return text


def table_info_of(stored: str | dict[str, Any]) -> TableInfo:
    """The shape a run's table record holds: `table_info_text`'s text (decoded once per
    process: a `TableInfo` is immutable and shared), or the mapping of `table_info_to_json`
    that records written before the text was kept hold (an unfinished run resumed)."""
    if not isinstance(stored, str):
        return table_info_from_json(stored)
    found = _shapes.get(stored)
    if found is None:
        found = table_info_from_json(json.loads(stored))
        _keep(stored, found)
    return found


def _keep(text: str, info: TableInfo) -> None:
    with _shapes_lock:
        _shapes[text] = info
        while len(_shapes) > SHAPES_KEPT:
            del _shapes[next(iter(_shapes))]
