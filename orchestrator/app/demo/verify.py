"""Check that a published table equals its source table, row for row and value for value.

An oracle independent of both the Spark and the binlog paths: it reads the
source with a plain PyMySQL SELECT and the published version with pyarrow, and
normalises both sides to the same Python values by the docs/types.md mapping.
Used by the demo, the consistency tests and the benchmarks.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa

from chunking.mysql import quote_identifier, quote_table
from orchestrator.lake.manifest import read_manifest, read_published
from orchestrator.schema.families import (
    BINARY_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    SPATIAL_TYPES,
    ZERO_DATE_TYPES,
)
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import arrow_type, is_boolean

_EPOCH = dt.datetime(1970, 1, 1)


@dataclass
class Comparison:
    table: str
    source_rows: int
    published_rows: int
    missing: list[Any] = field(default_factory=list)  # keys in the source, not published
    extra: list[Any] = field(default_factory=list)  # keys published, not in the source
    different: list[tuple[Any, str, Any, Any]] = field(
        default_factory=list
    )  # key, column, source, published

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def summary(self, limit: int = 5) -> str:
        if self.equal:
            return f"{self.table}: equal ({self.source_rows:,} rows)"
        parts = [
            f"{self.table}: DIFFERENT (source {self.source_rows:,} rows, "
            f"published {self.published_rows:,})"
        ]
        if self.missing:
            parts.append(f"  {len(self.missing)} missing, e.g. {self.missing[:limit]}")
        if self.extra:
            parts.append(f"  {len(self.extra)} extra, e.g. {self.extra[:limit]}")
        for key, column, a, b in self.different[:limit]:
            parts.append(f"  key {key} column {column}: source {a!r} != published {b!r}")
        if len(self.different) > limit:
            parts.append(f"  ... {len(self.different)} differing values in all")
        return "\n".join(parts)


def normalize(column: ColumnInfo, value: Any) -> Any:
    """A value from either side, as the Python value the mapping promises.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> normalize(C("f", "float", "float", True), 0.1) == normalize(
    ...     C("f", "float", "float", True), 0.10000000149011612)
    True
    >>> normalize(C("b", "bit", "bit(8)", True, precision=8), b"\\x05")
    5
    """
    if value is None:
        return None
    t = column.data_type
    if is_boolean(column):
        if isinstance(value, bytes):
            value = int.from_bytes(value, "big")
        return bool(value)
    if t == "bit":
        return int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)
    if t == "float":
        return struct.unpack("f", struct.pack("f", float(value)))[0]
    if t in DECIMAL_TYPES:
        return str(Decimal(value)) if arrow_type(column) == pa.string() else Decimal(value)
    if t == "bigint" and column.unsigned:
        return int(value)
    if t in ZERO_DATE_TYPES and isinstance(value, str):
        return None  # zero dates come back as text from PyMySQL; the mapping makes them null
    if t == "timestamp" and isinstance(value, dt.datetime):
        return (
            value.replace(tzinfo=None)
            if value.tzinfo is None
            else value.astimezone(dt.UTC).replace(tzinfo=None)
        )
    if t == "time" and isinstance(value, int):
        return dt.timedelta(microseconds=value)
    if t == "set" and isinstance(value, set):
        return ",".join(sorted(value))
    if isinstance(value, bytes) and t not in BINARY_TYPES | SPATIAL_TYPES:
        return value.decode(column.charset or "utf8", errors="replace")
    return value


def _key_of(row: dict[str, Any], key: tuple[str, ...]) -> Any:
    return tuple(row[k] for k in key)


def compare(
    info: TableInfo,
    key: tuple[str, ...],
    source_rows: Iterable[tuple[Any, ...]],
    published_rows: Iterable[dict[str, Any]],
    limit: int = 100,
) -> Comparison:
    """Compare rows by ``key`` (source as tuples in column order, published as dicts); a table
    without a key is compared by `compare_multisets`.

    Raises:
        ValueError: when ``key`` is empty (every row would fall on one key).
    """
    if not key:
        raise ValueError(f"{info.name}: compare needs a key; use compare_multisets")
    cols = info.columns
    source: dict[Any, tuple[Any, ...]] = {}
    for raw in source_rows:
        row = {c.name: normalize(c, v) for c, v in zip(cols, raw, strict=True)}
        source[_key_of(row, key)] = tuple(row[c.name] for c in cols)
    published: dict[Any, tuple[Any, ...]] = {}
    duplicates: list[Any] = []
    for raw_row in published_rows:
        row = {c.name: normalize(c, raw_row[c.name]) for c in cols}
        k = _key_of(row, key)
        if k in published:
            duplicates.append(k)
        published[k] = tuple(row[c.name] for c in cols)
    result = Comparison(info.name, len(source), len(published) + len(duplicates))
    result.missing = sorted((k for k in source if k not in published), key=repr)[:limit]
    result.extra = (sorted((k for k in published if k not in source), key=repr) + duplicates)[
        :limit
    ]
    for k, values in source.items():
        other = published.get(k)
        if other is None or other == values:
            continue
        for c, a, b in zip(cols, values, other, strict=True):
            if a != b and len(result.different) < limit:
                result.different.append((k, c.name, a, b))
    return result


def compare_multisets(
    info: TableInfo,
    source_rows: Iterable[tuple[Any, ...]],
    published_rows: Iterable[dict[str, Any]],
    limit: int = 100,
) -> Comparison:
    """Compare a table without a key: the multisets of its rows (each distinct row as many times
    on both sides); ``missing`` and ``extra`` list rows (with how many more one side has)."""
    cols = info.columns
    source = Counter(
        tuple(normalize(c, v) for c, v in zip(cols, raw, strict=True)) for raw in source_rows
    )
    published = Counter(tuple(normalize(c, row[c.name]) for c in cols) for row in published_rows)
    result = Comparison(info.name, source.total(), published.total())
    result.missing = sorted((source - published).items(), key=repr)[:limit]
    result.extra = sorted((published - source).items(), key=repr)[:limit]
    return result


def published_rows(table_dir: str) -> list[dict[str, Any]]:
    """Every row of the current published version of a table, as dicts."""
    return read_published(table_dir).to_pylist() if read_manifest(table_dir)["files"] else []


def source_rows(conn: Any, info: TableInfo, where: str | None = None) -> list[tuple[Any, ...]]:
    """Every row of the source table (those matching ``where``, the table's filter), read
    through ``conn`` (a PyMySQL connection), in column order."""
    columns = ", ".join(_selected(c) for c in info.columns)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(
            f"SELECT {columns} FROM {quote_table(info.name)}" + (f" WHERE {where}" if where else "")
        )
        return list(cur.fetchall())


def _selected(column: ColumnInfo) -> str:
    """A column as the oracle selects it: FLOAT widened (over the text protocol it has 6
    significant digits; the lake holds the exact float32), a spatial value as the server's own
    WKB (the lake's, for the x/y order MariaDB stores; MySQL 8's ST_AsBinary puts a geographic
    SRID's latitude first)."""
    name = quote_identifier(column.name)
    if column.data_type in FLOAT_TYPES:
        return f"CAST({name} AS DOUBLE)"
    if column.data_type in SPATIAL_TYPES:
        return f"ST_AsBinary({name})"
    return name


def verify_table(
    conn: Any, info: TableInfo, key: tuple[str, ...], table_dir: str, where: str | None = None
) -> Comparison:
    """Compare the source table (read through ``conn``, a PyMySQL connection; only the rows
    matching ``where``, the table's filter) with its published version; a table without a key
    (``key`` empty) as the multisets of their rows."""
    if not key:
        return compare_multisets(info, source_rows(conn, info, where), published_rows(table_dir))
    return compare(info, key, source_rows(conn, info, where), published_rows(table_dir))
