"""The SQL a chunk read runs, whichever engine runs it: Spark over JDBC or the driver over PyMySQL.

Each column is converted on the server into a value whose meaning no client library can change
(`column_sql`): temporal values become integers (epoch microseconds, epoch days, signed TIME
microseconds), FLOAT is widened to DOUBLE, CHAR/ENUM/SET are cast to plain text, booleans compared
with 0. The `Wire` kind names what comes back; each engine turns it into the column's published type
(`orchestrator.pipeline.read.jdbc.column_read` in Spark, `orchestrator.pipeline.read.local` in the
driver), so both write the same values. This module imports no engine.

The table is wrapped in a derived table that also exposes every raw column under its own name
(`table_select`), so a chunk predicate (and the table's ``where`` filter) uses the raw key columns
and the server's index; MySQL and MariaDB merge such a derived table into the outer query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from chunking.mysql import quote_identifier, quote_table
from orchestrator.schema.families import DECIMAL_TYPES, FLOAT_TYPES, PACKED_TYPES, SPATIAL_TYPES
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import is_boolean
from orchestrator.schema.values import staging_type

#: What a converted column carries over the wire:
#: ``as_is`` the column's own value in its staging type; ``boolean`` 0 or 1; ``year`` a small
#: integer; ``bits`` a signed 64-bit integer; ``text`` a string; ``double`` a float64;
#: ``epoch_days`` days since 1970-01-01; ``wall_micros`` microseconds since 1970-01-01 00:00:00 of
#: the stored wall clock; ``instant_micros`` microseconds since the epoch of the stored instant;
#: ``time_micros`` signed microseconds of a TIME; ``spatial`` a spatial value in MySQL's storage
#: form (the SRID as 4 bytes, then the WKB), which the binlog carries too (`values.spatial_wkb`).
Wire = Literal[
    "as_is",
    "boolean",
    "year",
    "bits",
    "text",
    "double",
    "epoch_days",
    "wall_micros",
    "instant_micros",
    "time_micros",
    "spatial",
]


@dataclass(frozen=True, slots=True)
class ColumnSql:
    """One column's expression on the server and what it returns."""

    sql: str
    wire: Wire


def column_sql(column: ColumnInfo) -> ColumnSql:
    """The server-side expression of one column (docs/types.md).

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> column_sql(C("t", "time", "time(6)", True, datetime_precision=6)).sql[:40]
    '(IF(`t` < 0, -1, 1) * ((HOUR(`t`) * 3600'
    >>> column_sql(C("f", "float", "float", True)).sql
    'CAST(`f` AS DOUBLE)'
    """
    q = quote_identifier(column.name)
    t = column.data_type
    if is_boolean(column):
        # TINYINT(1) holding 2 is true, as bool(2) on the binlog path.
        return ColumnSql(f"({q} <> 0)", "boolean")
    if t == "year":
        if column.display_width == 2:  # YEAR(2) reads as two digits; the binlog holds the year
            return ColumnSql(f"({q} + IF({q} + 0 < 70, 2000, 1900))", "year")
        return ColumnSql(f"({q} + 0)", "year")
    if t == "bit":
        # BIT(64) with the top bit set wraps to a negative int64 (two's complement).
        return ColumnSql(f"CAST({q} AS SIGNED)", "bits")
    if t in DECIMAL_TYPES and pa.types.is_string(staging_type(column)):  # precision over 38
        return ColumnSql(f"CAST({q} AS CHAR)", "text")
    if t in FLOAT_TYPES:
        # The text protocol prints FLOAT with 6 digits, and a FLOAT(M, D) or DOUBLE(M, D) with
        # its D decimals, which need not read back as the value stored (4/3 in a DOUBLE(20, 10)
        # is stored as 1.3333333330000001: the binlog's value); as DOUBLE, every digit is printed.
        return ColumnSql(f"CAST({q} AS DOUBLE)", "double")
    if t == "date":
        # Zero and partly-zero dates give NULL here; so do dates in year 0, which no date type
        # outside MySQL holds (the binlog's decoder gives NULL for both: `binlog.temporal`).
        return ColumnSql(f"IF({q} < '0001-01-01', NULL, DATEDIFF({q}, '1970-01-01'))", "epoch_days")
    if t == "datetime":
        return ColumnSql(
            f"IF({q} < '0001-01-01', NULL, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {q}))",
            "wall_micros",
        )
    if t == "timestamp":
        # UNIX_TIMESTAMP of a TIMESTAMP column is its stored instant, whatever the session
        # time zone; the zero timestamp gives 0, which no real TIMESTAMP has.
        return ColumnSql(
            f"NULLIF(CAST(UNIX_TIMESTAMP({q}) * 1000000 AS SIGNED), 0)", "instant_micros"
        )
    if t == "time":
        # From its parts (each of a negative TIME is its magnitude): MySQL's TIME_TO_SEC drops
        # the fraction, MariaDB's keeps it.
        return ColumnSql(
            f"(IF({q} < 0, -1, 1) * ((HOUR({q}) * 3600 + MINUTE({q}) * 60 + SECOND({q})) "
            f"* 1000000 + MICROSECOND({q})))",
            "time_micros",
        )
    if t == "char":
        # Reported as JDBC CHAR(n), Spark would pad values to n; as VARCHAR they stay as stored
        # (without trailing spaces, as the binlog holds them: Tidemark's sessions leave
        # PAD_CHAR_TO_FULL_LENGTH out of their sql_mode, `chunking.mysql.SESSION_SQL_MODE`).
        return ColumnSql(f"CAST({q} AS CHAR)", "text")
    if t in ("enum", "set") or t in PACKED_TYPES:  # INET6 as CHAR(39) would be padded too
        return ColumnSql(f"CAST({q} AS CHAR)", "text")
    if t in SPATIAL_TYPES:
        # As stored, not ST_AsBinary: the binlog holds the storage form, and MySQL 8's
        # ST_AsBinary turns a geographic SRID's axes to latitude first.
        return ColumnSql(q, "spatial")
    return ColumnSql(q, "as_is")


def column_aliases(columns: Sequence[ColumnInfo]) -> list[str]:
    """The names of the converted columns: a prefix no column's name starts with, and a number.

    >>> column_aliases([ColumnInfo("__tm_x", "int", "int", True),
    ...                 ColumnInfo("b", "int", "int", True)])
    ['___tm_0', '___tm_1']
    """
    taken = {c.name.lower() for c in columns}
    prefix = "__tm_"
    while any(name.startswith(prefix) for name in taken):
        prefix = "_" + prefix
    return [f"{prefix}{i}" for i in range(len(columns))]


def source_query(table: TableInfo, aliases: Sequence[str], sqls: Sequence[str]) -> str:
    """The derived table a chunk read selects from: raw columns plus one converted column per
    column.

    The raw columns are named one by one, never ``t.*``: a MariaDB ``INVISIBLE`` column is
    left out of ``*`` but is part of the table (and may be named by a chunk predicate or the
    table's ``where``).
    """
    return f"({table_select(table, aliases, sqls)}) AS tm_src"


def table_select(table: TableInfo, aliases: Sequence[str], sqls: Sequence[str]) -> str:
    """``SELECT <raw columns>, <converted columns> FROM <table>``: the body of `source_query`;
    ``sqls`` are the columns' `column_sql` expressions."""
    converted = ", ".join(
        f"{s} AS {quote_identifier(a)}" for s, a in zip(sqls, aliases, strict=True)
    )
    name = quote_table(table.name)
    raw = ", ".join(f"{name}.{quote_identifier(c.name)}" for c in table.columns)
    return f"SELECT {raw}, {converted} FROM {name}"
