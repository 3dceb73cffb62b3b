"""orchestrator.schema.families: every MySQL type in one table, and the modules that read it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import pyarrow_to_schema

from chunking.mysql import unsupported_key_reason
from orchestrator.binlog import shape
from orchestrator.lake.iceberg import with_field_ids
from orchestrator.lake.manifest import published_schema
from orchestrator.schema.families import FAMILIES, INTEGER_BITS, MEMBERS, family_of
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.types import UnsupportedType, arrow_type


def c(
    data_type: str, column_type: str, precision: int | None = None, scale: int | None = None
) -> ColumnInfo:
    return ColumnInfo("c", data_type, column_type, True, precision=precision, scale=scale)


# One row per MySQL type: the column, its family, its published Arrow type, its Iceberg type.
TYPES = [
    (c("tinyint", "tinyint(4)"), "integer", pa.int8(), "int"),
    (c("tinyint", "tinyint(3) unsigned"), "integer", pa.int16(), "int"),
    (c("tinyint", "tinyint(1)"), "integer", pa.bool_(), "boolean"),
    (c("smallint", "smallint(6)"), "integer", pa.int16(), "int"),
    (c("smallint", "smallint(5) unsigned"), "integer", pa.int32(), "int"),
    (c("mediumint", "mediumint(9)"), "integer", pa.int32(), "int"),
    (c("mediumint", "mediumint(8) unsigned"), "integer", pa.int32(), "int"),
    (c("int", "int(11)"), "integer", pa.int32(), "int"),
    (c("int", "int(10) unsigned"), "integer", pa.int64(), "long"),
    (c("integer", "int(11)"), "integer", pa.int32(), "int"),
    (c("bigint", "bigint(20)"), "integer", pa.int64(), "long"),
    (c("bigint", "bigint(20) unsigned"), "integer", pa.decimal128(20, 0), "decimal(20, 0)"),
    (c("year", "year(4)"), "year", pa.int16(), "int"),
    (c("decimal", "decimal(10,2)", 10, 2), "decimal", pa.decimal128(10, 2), "decimal(10, 2)"),
    (c("numeric", "decimal(65,30)", 65, 30), "decimal", pa.string(), "string"),
    (c("float", "float"), "float", pa.float32(), "float"),
    (c("double", "double"), "float", pa.float64(), "double"),
    (c("real", "double"), "float", pa.float64(), "double"),
    (c("bit", "bit(1)", 1), "bit", pa.bool_(), "boolean"),
    (c("bit", "bit(64)", 64), "bit", pa.int64(), "long"),
    (c("char", "char(4)"), "text", pa.string(), "string"),
    (c("varchar", "varchar(10)"), "text", pa.string(), "string"),
    (c("tinytext", "tinytext"), "text", pa.string(), "string"),
    (c("text", "text"), "text", pa.string(), "string"),
    (c("mediumtext", "mediumtext"), "text", pa.string(), "string"),
    (c("longtext", "longtext"), "text", pa.string(), "string"),
    (c("binary", "binary(16)"), "binary", pa.binary(), "binary"),
    (c("varbinary", "varbinary(10)"), "binary", pa.binary(), "binary"),
    (c("tinyblob", "tinyblob"), "binary", pa.binary(), "binary"),
    (c("blob", "blob"), "binary", pa.binary(), "binary"),
    (c("mediumblob", "mediumblob"), "binary", pa.binary(), "binary"),
    (c("longblob", "longblob"), "binary", pa.binary(), "binary"),
    (c("enum", "enum('a','b')"), "enum", pa.string(), "string"),
    (c("set", "set('a','b')"), "set", pa.string(), "string"),
    (c("json", "longtext"), "json", pa.string(), "string"),
    (c("date", "date"), "temporal", pa.date32(), "date"),
    (c("datetime", "datetime(6)"), "temporal", pa.timestamp("us"), "timestamp"),
    (c("timestamp", "timestamp"), "temporal", pa.timestamp("us", tz="UTC"), "timestamptz"),
    (c("time", "time(3)"), "temporal", pa.int64(), "long"),
    *(
        (c(t, t), "spatial", pa.binary(), "binary")
        for t in (
            "geometry",
            "point",
            "linestring",
            "polygon",
            "multipoint",
            "multilinestring",
            "multipolygon",
            "geometrycollection",
            "geomcollection",
        )
    ),
    *((c(t, t), "packed", pa.string(), "string") for t in ("inet4", "inet6", "uuid")),
]


@pytest.mark.parametrize(
    ("column", "family", "arrow", "iceberg"), TYPES, ids=[row[0].column_type for row in TYPES]
)
def test_type_row(column: ColumnInfo, family: str, arrow: pa.DataType, iceberg: str) -> None:
    assert family_of(column.data_type) == family
    assert arrow_type(column) == arrow
    published = with_field_ids(published_schema([column]), {"c": 1})
    assert str(pyarrow_to_schema(published).find_field(1).field_type) == iceberg


def test_the_table_covers_every_type_once() -> None:
    assert {row[0].data_type for row in TYPES} == set(FAMILIES)
    assert sum(len(types) for types in MEMBERS.values()) == len(FAMILIES)
    assert set(INTEGER_BITS) == set(MEMBERS["integer"])


def test_the_binlog_shape_check_knows_every_type() -> None:
    assert set(shape._FIELD_TYPES) == set(FAMILIES)


@pytest.mark.parametrize("data_type", sorted(FAMILIES))
def test_chunk_keys_refuse_exactly_enum_set_bit_json_spatial_and_float(data_type: str) -> None:
    """FLOAT (single precision) prints rounded to 6 digits: no bound reads back exactly."""
    refused = unsupported_key_reason(data_type) is not None
    assert refused is (
        FAMILIES[data_type] in ("enum", "set", "bit", "json", "spatial") or data_type == "float"
    )


def test_an_unknown_type_has_no_family_and_no_mapping() -> None:
    assert family_of("vector") is None  # MariaDB 11.7's VECTOR
    with pytest.raises(UnsupportedType, match=r"column `c` has type vector\(3\)"):
        arrow_type(ColumnInfo("c", "vector", "vector(3)", True))
    assert unsupported_key_reason("geometry") == "geometry is not a supported chunk-key type"


@pytest.mark.parametrize(
    ("column_type", "data_type", "width"),
    [
        ("int(11)", "int", 11),
        ("tinyint(1) unsigned", "tinyint", 1),
        ("bit(8)", "bit", 8),
        ("year(4)", "year", 4),
        ("varchar(10)", "varchar", None),
        ("decimal(10,2)", "decimal", None),
    ],
)
def test_display_width_of_integer_bit_and_year_only(
    column_type: str, data_type: str, width: int | None
) -> None:
    assert ColumnInfo("c", data_type, column_type, True).display_width == width
