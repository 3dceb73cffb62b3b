"""The fast binlog decoder without a server: event framing, row images, and each raw
value format against an encoder written from the format's description."""

from __future__ import annotations

import datetime as dt
import struct
import zlib
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.binlog import columns, events
from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog.events import Format, TableMap
from orchestrator.errors import RunFailed
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import time2_from_bytes, time2_micros, time_micros

DIGIT_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def never_json(raw: bytes) -> Any:
    raise AssertionError("no JSON here")


def finish(column: ColumnInfo, kind: int, meta: bytes, values: list[Any]) -> list[Any]:
    field = rd.field(kind, meta, column.unsigned)
    result: list[Any] = columns.finisher(column, field, never_json)(values).to_pylist()
    return result


# --------------------------------------------------------------------------- events


def packet(kind: int, body: bytes, end: int = 1234, checksum: bool = True) -> bytes:
    """A stream packet: 0x00, the common header, the body, (a CRC32 of header and body)."""
    size = 19 + len(body) + 4 * checksum
    event = struct.pack("<IBIIIH", 0, kind, 1, size, end, 0) + body
    return b"\x00" + event + (zlib.crc32(event).to_bytes(4, "little") if checksum else b"")


def test_header_rotate_and_query() -> None:
    fmt = Format(checksum=4)
    for checksum in (True, False):  # the made-up ROTATE on connecting has a checksum or not
        rotate = packet(events.ROTATE, struct.pack("<Q", 4) + b"binlog.000042", 0, checksum)
        assert events.header(rotate) == (events.ROTATE, 0)
        assert events.rotate(rotate) == ("binlog.000042", 4)
    # thread id, exec time, schema length 4, error code, status vars (3 bytes), schema\0, query
    body = struct.pack("<IIBHH", 7, 0, 4, 0, 3) + b"\x01\x02\x03" + b"shop\x00" + b" begin "
    assert events.query_event(packet(events.QUERY, body), fmt) == ("shop", "begin")
    assert events.query_event(packet(events.QUERY, body, checksum=False), Format(checksum=0)) == (
        "shop",
        "begin",
    )


@pytest.mark.parametrize(("algorithm", "checksum"), [(1, 4), (0, 0)])
def test_format_description(algorithm: int, checksum: int) -> None:
    """The FDE itself always ends with a checksum; its algorithm byte is the file's."""
    body = struct.pack("<H", 4) + b"10.11.19-MariaDB".ljust(50, b"\0") + struct.pack("<IB", 0, 19)
    lengths = bytes(range(1, 41))
    fmt = Format.parse(packet(events.FORMAT_DESCRIPTION, body + lengths + bytes([algorithm])))
    assert fmt.post_headers == lengths and fmt.server_version == "10.11.19-MariaDB"
    assert fmt.checksum == checksum
    assert fmt.post_header(events.TABLE_MAP, 0) == 19 and fmt.post_header(200, 8) == 8


def table_map_packet(types: bytes, meta: bytes, table_id: int = 0x0102030405) -> bytes:
    body = (
        table_id.to_bytes(6, "little")
        + b"\x01\x00"
        + b"\x02db\x00"
        + b"\x01t\x00"
        + bytes([len(types)])
        + types
        + bytes([len(meta)])
        + meta
        + b"\xff"
    )
    return packet(events.TABLE_MAP, body)


def test_table_map() -> None:
    types = bytes([rd.LONG, rd.VARCHAR, rd.NEWDECIMAL, rd.STRING, rd.DATETIME2, rd.BLOB])
    meta = b"\x20\x03" + bytes([12, 2]) + bytes([rd.ENUM, 1]) + b"\x06" + b"\x02"
    fmt = Format(checksum=4)
    parsed = events.parse_table_map(table_map_packet(types, meta), fmt)
    assert parsed.table_id == 0x0102030405 and parsed.name == "db.t" and parsed.types == types
    assert parsed.meta == (b"", b"\x20\x03", bytes([12, 2]), bytes([rd.ENUM, 1]), b"\x06", b"\x02")
    fields = [rd.field(k, m, False) for k, m in zip(parsed.types, parsed.meta, strict=True)]
    assert [(f.kind, f.code, f.length_size) for f in fields] == [
        (rd.LONG, "i", 0),
        (rd.VARCHAR, None, 2),
        (rd.NEWDECIMAL, "6s", 0),
        (rd.ENUM, "B", 0),
        (rd.DATETIME2, "8s", 0),
        (rd.BLOB, None, 2),
    ]


@pytest.mark.parametrize(
    ("kind", "post", "extra"),
    [(events.WRITE_ROWS_V1, 8, b""), (events.UPDATE_ROWS, 10, b"\x05\x00\x01\x02\x03")],
)
def test_rows_layout(kind: int, post: int, extra: bytes) -> None:
    head = (7).to_bytes(6, "little") + b"\x01\x00" + extra[:2]
    images = 2 if kind == events.UPDATE_ROWS else 1
    body = head + extra[2:] + b"\x0a" + b"\xff\x03" * images + b"ROWS"
    lengths = bytearray(40)
    lengths[kind - 1] = post
    fmt = Format(bytes(lengths), 4)
    data = packet(kind, body)
    layout = events.rows_layout(data, fmt, kind)
    assert events.table_id(data, fmt, kind) == 7
    assert layout.columns == 10 and layout.full and data[layout.start : layout.end] == b"ROWS"
    partial = packet(kind, head + extra[2:] + b"\x0a" + b"\xff\x01" * images + b"ROWS")
    assert not events.rows_layout(partial, fmt, kind).full


def test_eight_byte_length() -> None:
    assert events.lenenc(bytes([254]) + (2**40).to_bytes(8, "little"), 0) == (2**40, 9)


# --------------------------------------------------------------------------- row images


def col(name: str, column_type: str, charset: str | None = None, **more: Any) -> ColumnInfo:
    data_type = column_type.split("(", 1)[0].split(" ", 1)[0]
    return ColumnInfo(name, data_type, column_type, True, charset=charset, **more)


#: A table of five columns (one of each layout kind) and its TABLE_MAP, for `decoder` and `image`.
INFO = TableInfo(
    "db",
    "t",
    (
        col("id", "int(11)"),
        col("v", "varchar(300)", "utf8mb4"),
        col("d", "double"),
        col("b", "blob"),
        col("u", "bigint(20) unsigned"),
    ),
    ("id",),
    (),
    0,
)
TABLE_MAP = TableMap(
    1,
    "db.t",
    bytes([rd.LONG, rd.VARCHAR, rd.DOUBLE, rd.BLOB, rd.LONGLONG]),
    (b"", (1200).to_bytes(2, "little"), b"\x08", b"\x03", b""),
    b"",
)


def decoder(key: list[int]) -> rd.TableDecoder:
    return rd.TableDecoder(INFO, TABLE_MAP, key)


def image(values: list[Any]) -> bytes:
    """A row image of `decoder`'s table: NULL bitmap, then the non-NULL values."""
    nulls = sum(1 << i for i, v in enumerate(values) if v is None)
    out = bytes([nulls])
    i, v, d, b, u = values
    out += b"" if i is None else struct.pack("<i", i)
    out += b"" if v is None else struct.pack("<H", len(v)) + v
    out += b"" if d is None else struct.pack("<d", d)
    out += b"" if b is None else len(b).to_bytes(3, "little") + b
    out += b"" if u is None else struct.pack("<Q", u)
    return out


ROWS: list[list[Any]] = [
    [1, b"abc", 1.5, b"\x00\x01", 2**64 - 1],
    [None, None, None, None, None],
    [-7, b"x" * 300, None, b"", 0],
    [2**31 - 1, None, -0.0, None, None],
]


def test_images_of_every_null_pattern() -> None:
    data = b"HEAD" + b"".join(image(r) for r in ROWS) + b"TAIL"
    rows = decoder([0]).images(data, 4, len(data) - 4)
    assert [list(r) for r in rows] == ROWS


def test_update_images_keep_only_the_key_of_before_images() -> None:
    pairs = [(ROWS[0], ROWS[2]), (ROWS[1], ROWS[3]), (ROWS[3], ROWS[0])]
    data = b"".join(image(before) + image(after) for before, after in pairs)
    befores, afters = decoder([3, 1]).update_images(data, 0, len(data))
    assert befores == [(b"\x00\x01", b"abc"), (None, None), (None, None)]
    assert [list(a) for a in afters] == [after for _, after in pairs]


def test_unreadable_columns_are_refused_by_name() -> None:
    with pytest.raises(RunFailed, match="binlog type 6"):
        rd.field(6, b"", False)


def test_compressed_columns_are_read_as_the_server_stores_them() -> None:
    """MariaDB's TABLE_MAP of (id INT, a VARCHAR(10) COMPRESSED, b VARCHAR(10), c TEXT
    COMPRESSED, e VARCHAR(5)) as a 10.11 server wrote it: 141 a VARCHAR's two bytes of
    metadata (its length plus the header byte), 140 a BLOB's one. Their values: a header byte,
    then the value as it is or a zlib stream (`rowdecode.stored_value`)."""
    types = bytes([rd.LONG, 141, rd.VARCHAR, 140, rd.VARCHAR])
    parsed = events.parse_table_map(
        table_map_packet(types, bytes.fromhex("0b002800020500")), Format(checksum=4)
    )
    assert parsed.meta == (b"", b"\x0b\x00", b"\x28\x00", b"\x02", b"\x05\x00")
    fields = [rd.field(k, m, False) for k, m in zip(parsed.types, parsed.meta, strict=True)]
    assert [(f.kind, f.length_size) for f in fields] == [
        (rd.LONG, 0),
        (rd.VARCHAR_COMPRESSED, 1),
        (rd.VARCHAR, 1),
        (rd.BLOB_COMPRESSED, 2),
        (rd.VARCHAR, 1),
    ]
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    long = bytes([0x89, 200]) + raw.compress(b"w" * 200) + raw.flush()
    data = (
        bytes([0])  # no NULL
        + (7).to_bytes(4, "little")
        + bytes([3])
        + b"\x00ab"  # stored as it is
        + bytes([1])
        + b"b"
        + len(long).to_bytes(2, "little")
        + long
        + bytes([0])  # empty: no header byte either
    )
    info = TableInfo(
        "db",
        "t",
        (
            col("id", "int(11)"),
            col("a", "varchar(10)", "latin1"),
            col("b", "varchar(10)", "utf8mb4"),
            col("c", "text", "cp1250"),
            col("e", "varchar(5)", "greek"),
        ),
        ("id",),
        (),
        0,
    )
    [row] = rd.TableDecoder(info, parsed, [0]).images(data, 0, len(data))
    assert row == (7, b"ab", b"b", b"w" * 200, b"")


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (bytes([0x91, 3]) + b"abc", "compression method 9"),
        (bytes([0x89, 3]) + b"not deflate", "does not inflate"),
        (bytes([0x81, 9]) + zlib.compress(b"abc"), "inflates to 3 bytes, not the 9"),
    ],
)
def test_a_compressed_value_that_does_not_read_fails_not_guesses(
    stored: bytes, message: str
) -> None:
    with pytest.raises(RunFailed, match=message):
        rd.stored_value(stored)


# --------------------------------------------------------------------------- DECIMAL


def encode_decimal(value: Decimal, precision: int, scale: int) -> bytes:
    """MySQL's decimal2bin: digit groups big-endian, top bit set, negatives inverted."""
    text = f"{value.copy_abs():.{scale}f}"  # copy_abs: exact (abs() rounds to 28 digits)
    whole, _, fraction = text.partition(".")
    whole = whole.zfill(precision - scale)[-(precision - scale) :] if precision > scale else ""
    lead, whole = whole[: len(whole) % 9], whole[len(whole) % 9 :]
    groups = [lead] if lead else []
    groups += [whole[i : i + 9] for i in range(0, len(whole), 9)]
    groups += [fraction[i : i + 9] for i in range(0, len(fraction), 9)]
    raw = b"".join(
        int(g).to_bytes(4 if len(g) == 9 else DIGIT_BYTES[len(g)], "big") for g in groups
    )
    raw = bytes([raw[0] | 0x80]) + raw[1:]
    return bytes(b ^ 0xFF for b in raw) if value < 0 else raw


SIZES = [
    (1, 0),
    (5, 5),
    (9, 0),
    (10, 2),
    (12, 2),
    (18, 9),
    (18, 0),
    (19, 4),
    (30, 0),
    (38, 38),
    (38, 10),
    (39, 1),
    (40, 20),
    (65, 30),
    (65, 0),
]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_decimals_against_an_encoder(data: st.DataObject) -> None:
    for precision, scale in SIZES:
        numbers = data.draw(
            st.lists(st.integers(-(10**precision) + 1, 10**precision - 1), min_size=1, max_size=5)
        )
        numbers += [0, 10**precision - 1, -(10**precision) + 1]
        values = [Decimal(f"{n}E-{scale}") for n in numbers]  # exact: no context rounding
        raw: list[Any] = [encode_decimal(v, precision, scale) for v in values] + [None]
        assert len(raw[0]) == rd.decimal_size(precision, scale)
        column = col("c", f"decimal({precision},{scale})", precision=precision, scale=scale)
        got = finish(column, rd.NEWDECIMAL, bytes([precision, scale]), raw)
        if precision <= 38:
            assert got == [*values, None]
        else:
            assert got == [*(f"{v:.{scale}f}" for v in values), None]


# --------------------------------------------------------------------------- dates and times


def fraction_bytes(micros: int, fsp: int) -> bytes:
    width = (fsp + 1) // 2
    return (micros // 10 ** (6 - 2 * width)).to_bytes(width, "big") if width else b""


def encode_datetime2(year: int, month: int, day: int, seconds: int, micros: int, fsp: int) -> bytes:
    hour, rest = divmod(seconds, 3600)
    packed = (
        1 << 39 | (year * 13 + month) << 22 | day << 17 | hour << 12 | rest // 60 << 6 | rest % 60
    )
    return packed.to_bytes(5, "big") + fraction_bytes(micros, fsp)


def truncated(micros: int, fsp: int) -> int:
    return micros - micros % 10 ** (6 - fsp)


@settings(max_examples=60, deadline=None)
@given(st.dates(), st.integers(0, 86_399), st.integers(0, 999_999), st.integers(0, 6))
def test_datetime2_against_an_encoder(day: dt.date, seconds: int, micros: int, fsp: int) -> None:
    micros = truncated(micros, fsp)
    raw = encode_datetime2(day.year, day.month, day.day, seconds, micros, fsp)
    expected = dt.datetime.combine(day, dt.time()) + dt.timedelta(
        seconds=seconds, microseconds=micros
    )
    column = col("c", f"datetime({fsp})", datetime_precision=fsp)
    assert finish(column, rd.DATETIME2, bytes([fsp]), [raw, None]) == [expected, None]


def test_datetime2_invalid_dates_roll_over_and_zero_parts_are_null() -> None:
    """As the snapshot's TIMESTAMPDIFF: February 30 (ALLOW_INVALID_DATES) is March 2; a zero
    part, year 0 or an impossible time of day is NULL."""
    column = col("c", "datetime(2)", datetime_precision=2)
    raws = [
        encode_datetime2(2021, 2, 30, 5, 0, 2),
        encode_datetime2(2021, 0, 5, 5, 10_000, 2),
        encode_datetime2(0, 0, 0, 0, 0, 2),
        encode_datetime2(2021, 2, 28, 3600 * 24, 0, 2),
        encode_datetime2(0, 1, 1, 0, 0, 2),
    ]
    assert finish(column, rd.DATETIME2, b"\x02", raws) == [
        dt.datetime(2021, 3, 2, 0, 0, 5),
        None,
        None,
        None,
        None,
    ]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 999_999), st.integers(0, 6))
def test_timestamp2_against_an_encoder(seconds: int, micros: int, fsp: int) -> None:
    micros = truncated(micros, fsp)
    raw = seconds.to_bytes(4, "big") + fraction_bytes(micros, fsp)
    instant = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
        seconds=seconds, microseconds=micros
    )
    column = col("c", f"timestamp({fsp})", datetime_precision=fsp)
    expected = None if seconds == micros == 0 else instant
    assert finish(column, rd.TIMESTAMP2, bytes([fsp]), [raw, None]) == [expected, None]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.binary(min_size=6, max_size=6))
def test_time2_micros_equal_the_timedelta_path(fsp: int, noise: bytes) -> None:
    raw = noise[: 3 + (fsp + 1) // 2]
    assert time2_micros(raw, fsp) == time_micros(time2_from_bytes(raw, fsp))


def test_dates() -> None:
    column = col("c", "date")
    raws = [
        (2024 << 9 | 2 << 5 | 29).to_bytes(3, "little"),
        bytes(3),
        (2021 << 9 | 0 << 5 | 5).to_bytes(3, "little"),
        None,
    ]
    assert finish(column, rd.DATE, b"", raws) == [dt.date(2024, 2, 29), None, None, None]
    # an invalid date the server kept (ALLOW_INVALID_DATES) rolls over, as the snapshot's
    # DATEDIFF counts it; year 0 is NULL (no date type outside MySQL holds it)
    invalid = [
        (2021 << 9 | 2 << 5 | 30).to_bytes(3, "little"),
        (2020 << 9 | 4 << 5 | 31).to_bytes(3, "little"),
        (0 << 9 | 1 << 5 | 1).to_bytes(3, "little"),
    ]
    assert finish(column, rd.DATE, b"", invalid) == [dt.date(2021, 3, 2), dt.date(2020, 5, 1), None]


# --------------------------------------------------------------------------- the rest


def test_text_bits_sets_enums_years_binary() -> None:
    latin1 = col("c", "varchar(10)", "latin1")
    assert finish(latin1, rd.VARCHAR, b"\x0a\x00", [b"plain", b"\xe9\x81\x80", None, b""]) == [
        "plain",
        "é\x81€",
        None,
        "",
    ]
    char = col("c", "char(5)", "utf8mb4")
    assert finish(char, rd.STRING, bytes([rd.STRING, 20]), [b"a  ", " é ".encode(), None]) == [
        "a",
        " é",
        None,
    ]
    with pytest.raises(UnicodeDecodeError):
        finish(col("c", "varchar(5)", "utf8mb4"), rd.VARCHAR, b"\x14\x00", [b"\xff"])
    bits = col("c", "bit(10)", precision=10)
    assert finish(bits, rd.BIT, bytes([2, 1]), [b"\x02\x01", b"\xff\xff", None]) == [
        513,
        1023,
        None,
    ]
    b64 = col("c", "bit(64)", precision=64)
    assert finish(b64, rd.BIT, bytes([0, 8]), [b"\xff" * 8, b"\x7f" + b"\xff" * 7]) == [
        -1,
        2**63 - 1,
    ]
    flag = col("c", "bit(1)", precision=1)
    assert finish(flag, rd.BIT, bytes([1, 0]), [b"\x01", b"\x00"]) == [True, False]
    labels = col("c", "set('b','a','c')")
    assert finish(labels, rd.STRING, bytes([rd.SET, 1]), [5, 0, 7, None]) == [
        "b,c",
        "",
        "b,a,c",
        None,
    ]
    enum = col("c", "enum('x','y')")
    assert finish(enum, rd.STRING, bytes([rd.ENUM, 1]), [2, 0, None]) == ["y", "", None]
    year = col("c", "year(4)")
    assert finish(year, rd.YEAR, b"", [0, 1, 255, None]) == [0, 1901, 2155, None]
    binary = col("c", "binary(4)")
    assert finish(binary, rd.STRING, bytes([rd.STRING, 4]), [b"a", b"", None]) == [
        b"a\0\0\0",
        b"\0" * 4,
        None,
    ]


def test_float_and_integers_keep_their_staging_types() -> None:
    as_float = col("c", "float")
    out = columns.finisher(as_float, rd.field(rd.FLOAT, b"\x04", False), never_json)(
        [struct.unpack("<f", struct.pack("<f", 0.1))[0], None]
    )
    assert out.type == pa.float32() and out.to_pylist()[1] is None
    medium = col("c", "mediumint(8) unsigned")
    assert finish(medium, rd.INT24, b"", [b"\xff\xff\xff", None]) == [16777215, None]
    signed = col("c", "mediumint(9)")
    assert finish(signed, rd.INT24, b"", [b"\xff\xff\xff"]) == [-1]
