"""The MySQL -> Arrow type mapping of docs/types.md, in one place.

Both the snapshot path (Spark JDBC) and the binlog path convert values so that
the published Parquet carries exactly `arrow_type(column)` for every column.
"""

from __future__ import annotations

import pyarrow as pa

from orchestrator.schema.families import FAMILIES, INTEGER_BITS, ZERO_DATE_TYPES
from orchestrator.schema.tables import ColumnInfo

_TEMPORAL = {
    "date": pa.date32(),
    "datetime": pa.timestamp("us"),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "time": pa.int64(),
}  # TIME: signed microseconds (Iceberg has no duration)


class UnsupportedType(ValueError):
    """A column whose MySQL type has no mapping (a type newer than this Tidemark)."""


def is_boolean(column: ColumnInfo) -> bool:
    """BIT(1) and TINYINT(1) map to boolean (docs/types.md), except a TINYINT(1) of a key: its
    values (-128..127) tell rows apart, and as booleans keys 1 and 2 would be one row."""
    return (column.data_type == "bit" and (column.precision or column.display_width) == 1) or (
        column.data_type == "tinyint" and column.display_width == 1 and not column.in_key
    )


def _integer_type(bits: int, *, unsigned: bool) -> pa.DataType:
    """The narrowest Arrow integer holding every value (unsigned ones need a bit more);
    no Arrow integer holds BIGINT UNSIGNED, so it is a DECIMAL(20, 0).

    >>> _integer_type(24, unsigned=False), _integer_type(8, unsigned=True)
    (DataType(int32), DataType(int16))
    >>> _integer_type(64, unsigned=True)
    Decimal128Type(decimal128(20, 0))
    """
    needed = bits + 1 if unsigned else bits
    for width, arrow in ((8, pa.int8()), (16, pa.int16()), (32, pa.int32()), (64, pa.int64())):
        if needed <= width:
            return arrow
    return pa.decimal128(20, 0)


def arrow_type(column: ColumnInfo) -> pa.DataType:
    """The Arrow type a column is published as.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> arrow_type(C("id", "bigint", "bigint(20) unsigned", False))
    Decimal128Type(decimal128(20, 0))
    >>> arrow_type(C("n", "int", "int(10) unsigned", True))
    DataType(int64)
    >>> arrow_type(C("t", "time", "time(3)", True, datetime_precision=3))
    DataType(int64)
    """
    t = column.data_type
    if is_boolean(column):
        return pa.bool_()
    match FAMILIES.get(t):
        case "integer":
            return _integer_type(INTEGER_BITS[t], unsigned=column.unsigned)
        case "year":
            return pa.int16()
        case "decimal":
            precision = column.precision or 10
            return pa.decimal128(precision, column.scale or 0) if precision <= 38 else pa.string()
        case "float":
            return pa.float32() if t == "float" else pa.float64()
        case "bit":
            return pa.int64()
        case "text" | "enum" | "set" | "json" | "packed":
            return pa.string()
        case "binary" | "spatial":  # spatial: OGC WKB (`values.spatial_wkb`)
            return pa.binary()
        case "temporal":
            return _TEMPORAL[t]
    raise UnsupportedType(
        f"column `{column.name}` has type {column.column_type}, which Tidemark does not map; "
        "leave the table out of the pipeline, or change the column's type"
    )


def published_nullable(column: ColumnInfo) -> bool:
    """Whether a published column may hold nulls: NULL-able columns, and dates (zero dates)."""
    return column.nullable or column.data_type in ZERO_DATE_TYPES
