"""The MySQL -> Arrow type mapping of CONTRACT.md, in one place.

Both the snapshot path (Spark JDBC) and the binlog path convert values so that
the published Parquet carries exactly `arrow_type(column)` for every column.
"""

from __future__ import annotations

import pyarrow as pa

from orchestrator.schema.tables import ColumnInfo

_SIGNED = {"tinyint": pa.int8(), "smallint": pa.int16(), "mediumint": pa.int32(),
           "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64()}
_UNSIGNED = {"tinyint": pa.int16(), "smallint": pa.int32(), "mediumint": pa.int32(),
             "int": pa.int64(), "integer": pa.int64()}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


class UnsupportedType(ValueError):
    """A column whose MySQL type has no mapping (spatial types, for instance)."""


def is_boolean(column: ColumnInfo) -> bool:
    """BIT(1) and TINYINT(1) map to boolean (CONTRACT.md)."""
    return (column.data_type == "bit" and (column.precision or column.display_width) == 1) or (
        column.data_type == "tinyint" and column.display_width == 1
    )


def arrow_type(column: ColumnInfo) -> pa.DataType:
    """The Arrow type a column is published as.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> arrow_type(C("id", "bigint", "bigint(20) unsigned", False))
    Decimal128Type(decimal128(20, 0))
    >>> arrow_type(C("n", "int", "int(10) unsigned", True))
    DataType(int64)
    >>> arrow_type(C("t", "time", "time(3)", True, datetime_precision=3))
    DurationType(duration[us])
    """
    t = column.data_type
    if is_boolean(column):
        return pa.bool_()
    if t in _SIGNED:
        if column.unsigned:
            return pa.decimal128(20, 0) if t == "bigint" else _UNSIGNED[t]
        return _SIGNED[t]
    if t == "year":
        return pa.int16()
    if t in ("decimal", "numeric"):
        precision = column.precision or 10
        scale = column.scale or 0
        return pa.decimal128(precision, scale) if precision <= 38 else pa.string()
    if t == "float":
        return pa.float32()
    if t in ("double", "real"):
        return pa.float64()
    if t == "bit":
        return pa.int64()
    if t in _TEXT:
        return pa.string()
    if t in _BINARY:
        return pa.binary()
    if t == "date":
        return pa.date32()
    if t == "datetime":
        return pa.timestamp("us")
    if t == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if t == "time":
        return pa.duration("us")
    raise UnsupportedType(
        f"column `{column.name}` has type {column.column_type}, which Tidemark does not map; "
        "exclude the table or cast the column in a view"
    )


#: Types whose zero value ('0000-00-00') is published as null, even in a NOT NULL column.
ZERO_DATE_TYPES = frozenset({"date", "datetime", "timestamp"})


def published_nullable(column: ColumnInfo) -> bool:
    """Whether a published column may hold nulls: NULL-able columns, and dates (zero dates)."""
    return column.nullable or column.data_type in ZERO_DATE_TYPES


def arrow_schema(columns: tuple[ColumnInfo, ...] | list[ColumnInfo]) -> pa.Schema:
    """The published schema of a table, with each column's MySQL type in its field metadata."""
    return pa.schema(
        pa.field(c.name, arrow_type(c), nullable=published_nullable(c),
                 metadata={"mysql_type": c.column_type})
        for c in columns
    )
