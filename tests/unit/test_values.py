"""Binlog-path values -> staging Arrow: one row per MySQL type of docs/types.md."""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from orchestrator.schema import charsets
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.values import (
    BatchConverter,
    column_converter,
    definition_labels,
    staging_schema,
    staging_type,
    time2_from_bytes,
)

NEW_YORK = dt.timezone(dt.timedelta(hours=-5))
UTC = dt.UTC


def col(
    column_type: str,
    *,
    nullable: bool = True,
    charset: str | None = None,
    precision: int | None = None,
    scale: int | None = None,
) -> ColumnInfo:
    """A ColumnInfo as information_schema describes ``column_type``."""
    data_type = column_type.split("(", 1)[0].split(" ", 1)[0]
    if data_type in ("char", "varchar", "text", "mediumtext", "longtext", "enum", "set"):
        charset = charset or "utf8mb4"
    if data_type == "bit":
        precision = int(column_type[4:-1])
    return ColumnInfo(
        "c", data_type, column_type, nullable, precision=precision, scale=scale, charset=charset
    )


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


# (column type, value in (binlog adapter or PyMySQL SELECT form), Arrow type, value out)
CASES: list[tuple[ColumnInfo, Any, pa.DataType, Any]] = [
    (col("tinyint(4)"), -128, pa.int8(), -128),
    (col("tinyint(3) unsigned"), 255, pa.int16(), 255),
    (col("tinyint(3) unsigned"), -1, pa.int16(), 255),  # decoded without signedness metadata
    (col("smallint(6)"), -32768, pa.int16(), -32768),
    (col("smallint(5) unsigned"), 65535, pa.int32(), 65535),
    (col("smallint(5) unsigned"), -1, pa.int32(), 65535),
    (col("mediumint(9)"), -8388608, pa.int32(), -8388608),
    (col("mediumint(8) unsigned"), 16777215, pa.int32(), 16777215),
    (col("mediumint(8) unsigned"), -1, pa.int32(), 16777215),
    (col("int(11)"), -2147483648, pa.int32(), -2147483648),
    (col("int(10) unsigned"), 4294967295, pa.int64(), 4294967295),
    (col("int(10) unsigned"), -1, pa.int64(), 4294967295),
    (col("bigint(20)"), -(2**63), pa.int64(), -(2**63)),
    (col("bigint(20)"), 2**63 - 1, pa.int64(), 2**63 - 1),
    (col("bigint(20) unsigned"), 2**64 - 1, pa.decimal128(20, 0), Decimal(2**64 - 1)),
    (col("bigint(20) unsigned"), -1, pa.decimal128(20, 0), Decimal(2**64 - 1)),
    (col("year(4)"), 0, pa.int16(), 0),
    (col("year(4)"), 2155, pa.int16(), 2155),
    (
        col("decimal(10,2)", precision=10, scale=2),
        Decimal("-12.34"),
        pa.decimal128(10, 2),
        Decimal("-12.34"),
    ),
    (
        col("decimal(38,10)", precision=38, scale=10),
        Decimal("9" * 28 + "." + "9" * 10),
        pa.decimal128(38, 10),
        Decimal("9" * 28 + "." + "9" * 10),
    ),
    (
        col("decimal(65,30)", precision=65, scale=30),
        Decimal("-1.5"),
        pa.string(),
        "-1." + "5" + "0" * 29,
    ),
    (col("decimal(40,0)", precision=40, scale=0), Decimal("9" * 40), pa.string(), "9" * 40),
    (col("decimal(40,2)", precision=40, scale=2), Decimal("0.00"), pa.string(), "0.00"),
    (col("float"), f32(0.1), pa.float32(), f32(0.1)),
    (col("float"), 1234567.0, pa.float32(), 1234567.0),
    (col("float"), f32(3.4028234e38), pa.float32(), f32(3.4028234e38)),
    (col("double"), -1.7976931348623157e308, pa.float64(), -1.7976931348623157e308),
    (col("double"), 5e-324, pa.float64(), 5e-324),
    (col("bit(1)"), 1, pa.bool_(), True),
    (col("bit(1)"), b"\x00", pa.bool_(), False),  # SELECT form
    (col("tinyint(1)"), 5, pa.bool_(), True),
    (col("tinyint(1)"), 0, pa.bool_(), False),
    (col("bit(10)"), 513, pa.int64(), 513),
    (col("bit(10)"), b"\x02\x01", pa.int64(), 513),
    (col("bit(64)"), 2**64 - 1, pa.int64(), -1),  # Connector/J getLong wraps like this
    (col("bit(64)"), b"\x7f" + b"\xff" * 7, pa.int64(), 2**63 - 1),
    (col("char(5)"), b"ab", pa.string(), "ab"),
    (col("char(5)"), "ab  ", pa.string(), "ab"),  # SELECT strips CHAR pad spaces
    (col("char(5)"), b" a", pa.string(), " a"),
    (col("varchar(10)"), "héllo".encode(), pa.string(), "héllo"),
    (col("varchar(10)"), "😀".encode(), pa.string(), "😀"),
    (col("varchar(10)", charset="latin1"), b"\xe9\x81\x80", pa.string(), "é\x81€"),
    (col("varchar(10)", charset="ucs2"), "é".encode("utf-16-be"), pa.string(), "é"),
    (col("text"), b"", pa.string(), ""),
    (col("longtext"), b'{"a": [1, 2]}', pa.string(), '{"a": [1, 2]}'),  # MariaDB JSON
    (col("json"), {b"a": [1, None, True]}, pa.string(), '{"a": [1, null, true]}'),  # MySQL JSON
    (col("enum('x','y')"), "y", pa.string(), "y"),
    (col("enum('x','y')"), "", pa.string(), ""),  # the invalid-value index 0
    (col("set('b','a','c')"), frozenset({"c", "b", "a"}), pa.string(), "b,a,c"),
    (col("set('b','a','c')"), frozenset({"c", "b"}), pa.string(), "b,c"),
    (col("set('b','a','c')"), frozenset(), pa.string(), ""),
    (col("set('b','a','c')"), "b,c", pa.string(), "b,c"),  # SELECT form
    (col("binary(4)"), b"ab", pa.binary(), b"ab\x00\x00"),  # binlog strips 0x00 pad
    (col("binary(4)"), b"", pa.binary(), b"\x00" * 4),
    (col("binary(4)"), b"ab\x00\x00", pa.binary(), b"ab\x00\x00"),  # SELECT form
    (col("varbinary(10)"), b"\x00\xff", pa.binary(), b"\x00\xff"),
    (col("blob"), b"", pa.binary(), b""),
    (col("date"), dt.date(1000, 1, 1), pa.date32(), dt.date(1000, 1, 1)),
    (col("date"), "0000-00-00", pa.date32(), None),  # PyMySQL's zero date
    (
        col("datetime"),
        dt.datetime(9999, 12, 31, 23, 59, 59),
        pa.timestamp("us"),
        dt.datetime(9999, 12, 31, 23, 59, 59),
    ),
    (
        col("datetime(6)"),
        dt.datetime(2020, 2, 29, 1, 2, 3, 456789),
        pa.timestamp("us"),
        dt.datetime(2020, 2, 29, 1, 2, 3, 456789),
    ),
    (col("datetime"), "0000-00-00 00:00:00", pa.timestamp("us"), None),
    (
        col("timestamp(3)"),
        dt.datetime(2020, 1, 1, 7, 0, 0, 500000, tzinfo=NEW_YORK),
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2020, 1, 1, 12, 0, 0, 500000, tzinfo=UTC),
    ),
    (
        col("timestamp"),
        dt.datetime(2038, 1, 19, 3, 14, 7),
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC),
    ),  # SELECT form, session time zone UTC
    (col("timestamp"), "0000-00-00 00:00:00", pa.timestamp("us", tz="UTC"), None),
    (
        col("time"),
        dt.timedelta(hours=-838, minutes=-59, seconds=-59),
        pa.int64(),
        -3_020_399_000_000,
    ),
    (col("time"), dt.timedelta(hours=838, minutes=59, seconds=59), pa.int64(), 3_020_399_000_000),
    (col("time(1)"), dt.timedelta(seconds=-1.5), pa.int64(), -1_500_000),
    (col("time(6)"), dt.timedelta(microseconds=-1), pa.int64(), -1),
    (col("time(6)"), dt.timedelta(hours=25, microseconds=1), pa.int64(), 90_000_000_001),
]


def _ids() -> list[str]:
    return [f"{c.column_type}-{i}" for i, (c, *_rest) in enumerate(CASES)]


@pytest.mark.parametrize(("column", "value", "arrow", "expected"), CASES, ids=_ids())
def test_value_converts_to_staging(
    column: ColumnInfo, value: Any, arrow: pa.DataType, expected: Any
) -> None:
    assert staging_type(column) == arrow
    table = BatchConverter([column]).table([(value,), (None,)])
    assert table.schema.field("c").type == arrow
    got = table.column("c").to_pylist()
    assert got == [expected, None]
    if isinstance(expected, float):  # equal as float32/float64 bit patterns, not just close
        assert struct.pack("<d", got[0]) == struct.pack("<d", expected)


# TIME2 bytes as MySQL's source documents them (fsp 2) and as MariaDB 10.11 wrote them to its
# binlog (the expected values are what SELECT returned for those rows).
TIME2_CASES = [
    ("80000000", 2, dt.timedelta(0)),
    ("7fffffff", 2, -dt.timedelta(microseconds=10_000)),
    ("7fffff9d", 2, -dt.timedelta(microseconds=990_000)),
    ("7fffff00", 2, -dt.timedelta(seconds=1)),
    ("7ffffeff", 2, -dt.timedelta(seconds=1, microseconds=10_000)),
    ("7ffffef6", 2, -dt.timedelta(seconds=1, microseconds=100_000)),
    ("80d1ab", 0, dt.timedelta(hours=13, minutes=6, seconds=43)),
    ("4b9105", 0, -dt.timedelta(hours=838, minutes=59, seconds=59)),
    ("7ffffffc18", 4, -dt.timedelta(microseconds=100_000)),
    ("7f3747ffff", 4, -dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=100)),
    ("b46efb0f423f", 6, dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999_999)),
    ("4b9105f0bdc1", 6, -dt.timedelta(hours=838, minutes=59, seconds=58, microseconds=999_999)),
    ("7fffffffffff", 6, -dt.timedelta(microseconds=1)),
]


@pytest.mark.parametrize(("raw", "fsp", "expected"), TIME2_CASES)
def test_time2_bytes(raw: str, fsp: int, expected: dt.timedelta) -> None:
    assert time2_from_bytes(bytes.fromhex(raw), fsp) == expected


def test_none_rows_are_nulls() -> None:
    columns = [col("int(11)"), col("varchar(5)"), col("time")]
    table = BatchConverter(columns).table([None, (1, b"x", dt.timedelta(seconds=1))])
    assert [table.column(i).to_pylist() for i in range(3)] == [
        [None, 1],
        [None, "x"],
        [None, 1_000_000],
    ]


def test_staging_schema_keeps_time_as_micros_and_zero_dates_nullable() -> None:
    columns = [
        ColumnInfo("t", "time", "time(3)", False, datetime_precision=3),
        ColumnInfo("d", "date", "date", False),
        ColumnInfo("id", "bigint", "bigint(20)", False),
    ]
    schema = staging_schema(columns)
    assert [f.type for f in schema] == [pa.int64(), pa.date32(), pa.int64()]
    assert [f.nullable for f in schema] == [False, True, False]
    assert schema.field("t").metadata == {b"mysql_type": b"time(3)"}


def test_identity_columns_have_no_converter() -> None:
    assert column_converter(col("int(11)")) is None
    assert column_converter(col("int(10) unsigned")) is not None


@pytest.mark.parametrize("column_type", ["float", "double", "float(7,2)"])
def test_a_negative_zero_converts_to_zero(column_type: str) -> None:
    """The server prints a stored ``-0.0`` as ``0``, which a snapshot reads."""
    convert = column_converter(col(column_type))
    assert convert is not None
    assert [math.copysign(1.0, convert(v)) for v in (-0.0, 0.0)] == [1.0, 1.0]
    assert convert(-1.5) == -1.5 and convert(3e38) == 3e38


@pytest.mark.parametrize(
    ("column_type", "labels"),
    [
        ("set('b','a','c')", ("b", "a", "c")),
        ("enum('','q')", ("", "q")),
        ("set('a''b','c\\\\d','é','x)y')", ("a'b", "c\\d", "é", "x)y")),
    ],
)
def test_definition_labels(column_type: str, labels: tuple[str, ...]) -> None:
    assert definition_labels(column_type) == labels


def test_a_charset_the_server_was_not_asked_about_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-Unicode set is decoded only as the server reads it (`charsets.load`, which the
    capture calls first): never by a guess. (A process that asked, as the suite's integration
    tests do, knows it: none asked here.)"""
    monkeypatch.setattr(charsets, "_loaded", {})
    monkeypatch.setattr(charsets, "_failed", {})
    with pytest.raises(ValueError, match="character set swe7 was not read from the server"):
        column_converter(col("varchar(5)", charset="swe7"))


def test_the_built_in_sets_read_as_the_server_does() -> None:
    """latin1: cp1252, its five undefined bytes the C1 controls; ascii: any byte from 0x80 ``?``
    (each checked against the server by tests/integration/test_charsets.py)."""
    latin1 = column_converter(col("varchar(5)", charset="latin1"))
    ascii_ = column_converter(col("varchar(5)", charset="ascii"))
    assert latin1 is not None and ascii_ is not None
    assert latin1(bytes([0x80, 0x81, 0x8D, 0x9F, 0xE9])) == "€\x81\x8dŸé"
    assert ascii_(b"a\x80z") == "a?z"
