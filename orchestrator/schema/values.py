"""Python values -> Arrow arrays in staging types, for the binlog path.

The binlog adapter (`orchestrator.binlog.reference`) hands over rows as tuples of plain
Python values; this module turns a batch of them into Arrow arrays whose types
and values equal what the snapshot path (Spark JDBC through Connector/J, with
session time zone UTC) produces for the same rows (docs/types.md).

Converters also accept what PyMySQL returns from a ``SELECT`` of the same row
(``bytes`` for BIT, ``'0000-00-00'`` strings for zero dates, SET as ``'a,b'``),
so tests can check the binlog path against the server's own answer.

Staging types are the published types (`orchestrator.schema.types.arrow_type`)
except TIME, kept as int64 microseconds (Spark cannot write a duration; publish
casts it back).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

from orchestrator.schema import charsets, packed
from orchestrator.schema.families import (
    BINARY_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    INTEGER_BITS,
    PACKED_TYPES,
    SPATIAL_TYPES,
    TEXT_TYPES,
)
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.types import arrow_type, is_boolean, published_nullable

Converter = Callable[[Any], Any]

_UTC = dt.UTC
_US_PER_DAY = 86_400_000_000


def staging_type(column: ColumnInfo) -> pa.DataType:
    """The Arrow type a column is staged as: its published type, TIME as int64 microseconds.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> staging_type(C("t", "time", "time(6)", True, datetime_precision=6))
    DataType(int64)
    >>> staging_type(C("n", "bigint", "bigint(20) unsigned", False))
    Decimal128Type(decimal128(20, 0))
    """
    if column.data_type == "time":
        return pa.int64()
    return arrow_type(column)


def staging_nullable(column: ColumnInfo) -> bool:
    """Whether a staged column may hold NULL: nullable columns, and those with zero dates.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> staging_nullable(C("d", "date", "date", False))
    True
    >>> staging_nullable(C("id", "int", "int(11)", False))
    False
    """
    return published_nullable(column)


def staging_schema(columns: Sequence[ColumnInfo]) -> pa.Schema:
    """The staging schema of a table's columns, with each MySQL type in the field metadata."""
    return pa.schema(
        pa.field(
            c.name,
            staging_type(c),
            nullable=staging_nullable(c),
            metadata={"mysql_type": c.column_type},
        )
        for c in columns
    )


# --------------------------------------------------------------------------- pure helpers


def time_micros(value: dt.timedelta) -> int:
    """A TIME value as signed microseconds (exact; no float rounding).

    >>> time_micros(dt.timedelta(hours=-838, minutes=-59, seconds=-59))
    -3020399000000
    >>> time_micros(dt.timedelta(seconds=-1, microseconds=500000))
    -500000
    >>> time_micros(dt.timedelta(hours=25, microseconds=1))
    90000000001
    """
    return value.days * _US_PER_DAY + value.seconds * 1_000_000 + value.microseconds


def time2_from_bytes(raw: bytes, fsp: int) -> dt.timedelta:
    """A TIME(fsp) value from its binlog/on-disk bytes (``TIME2``).

    The bytes are one big-endian offset-binary number: 3 bytes of
    ``sign, reserved, hour(10), minute(6), second(6)`` then ``(fsp + 1) // 2``
    bytes of fraction. Minus the offset it is ``sign * (hms << 8k | fraction)``,
    negative values with fractions included.

    >>> time2_from_bytes(bytes.fromhex("7ffffef6"), 2)  # -00:00:01.10
    datetime.timedelta(days=-1, seconds=86398, microseconds=900000)
    >>> time2_from_bytes(bytes.fromhex("800000"), 0)
    datetime.timedelta(0)
    """
    frac_bytes = (fsp + 1) // 2
    value = int.from_bytes(raw, "big") - (1 << (8 * len(raw) - 1))
    magnitude = -value if value < 0 else value
    hms = magnitude >> (8 * frac_bytes)
    fraction = magnitude & ((1 << (8 * frac_bytes)) - 1)
    total = dt.timedelta(
        hours=(hms >> 12) & 0x3FF,
        minutes=(hms >> 6) & 0x3F,
        seconds=hms & 0x3F,
        microseconds=fraction * 10 ** (6 - 2 * frac_bytes),
    )
    return -total if value < 0 else total


def time2_micros(raw: bytes, fsp: int) -> int:
    """A TIME(fsp) value from its binlog bytes as signed microseconds, without a timedelta:
    ``time_micros(time2_from_bytes(raw, fsp))``, exactly.

    >>> time2_micros(bytes.fromhex("7ffffef6"), 2)  # -00:00:01.10
    -1100000
    >>> time2_micros(bytes.fromhex("b46efb0f423f"), 6)  # 838:59:59.999999
    3020399999999
    """
    frac_bytes = (fsp + 1) // 2
    value = int.from_bytes(raw, "big") - (1 << (8 * len(raw) - 1))
    magnitude = -value if value < 0 else value
    hms = magnitude >> (8 * frac_bytes)
    micros = (
        (((hms >> 12) & 0x3FF) * 60 + ((hms >> 6) & 0x3F)) * 60 + (hms & 0x3F)
    ) * 1_000_000 + (magnitude & ((1 << (8 * frac_bytes)) - 1)) * 10 ** (6 - 2 * frac_bytes)
    return -micros if value < 0 else micros


def decimal_text(value: Decimal | int | str, scale: int) -> str:
    """A DECIMAL as the server prints it: plain digits, exactly ``scale`` decimals.

    >>> decimal_text(Decimal("-12.5"), 5)
    '-12.50000'
    >>> decimal_text(Decimal("0"), 2)
    '0.00'
    >>> decimal_text(Decimal("1" * 60 + "."), 0)
    '111111111111111111111111111111111111111111111111111111111111'
    """
    number = value if isinstance(value, Decimal) else Decimal(value)
    return f"{number:.{scale}f}"


def definition_labels(column_type: str) -> tuple[str, ...]:
    """The labels of an ``enum(...)`` or ``set(...)`` column type, in definition order.

    >>> definition_labels("set('b','a','c')")
    ('b', 'a', 'c')
    >>> definition_labels("enum('it''s','x,y','','c\\\\\\\\d')")
    ("it's", 'x,y', '', 'c\\\\d')
    """
    body = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    labels: list[str] = []
    i = 0
    while i < len(body):
        if body[i] != "'":
            i += 1
            continue
        i += 1
        text: list[str] = []
        while i < len(body):
            ch = body[i]
            if ch == "'" and body[i + 1 : i + 2] == "'":
                text.append("'")
                i += 2
            elif ch == "'":
                i += 1
                break
            elif ch == "\\" and i + 1 < len(body):
                text.append(
                    {"n": "\n", "t": "\t", "0": "\0", "r": "\r"}.get(body[i + 1], body[i + 1])
                )
                i += 2
            else:
                text.append(ch)
                i += 1
        labels.append("".join(text))
    return tuple(labels)


def set_text(value: Any, labels: Sequence[str]) -> str:
    """A SET value as ``SELECT`` prints it: members comma-joined in definition order.

    >>> set_text({"c", "b"}, ("b", "a", "c"))
    'b,c'
    >>> set_text(frozenset(), ("a",))
    ''
    >>> set_text("a,c", ("a", "c"))
    'a,c'
    """
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return ",".join(label for bit, label in enumerate(labels) if value >> bit & 1)
    return ",".join(label for label in labels if label in value)


def mysql_json_text(value: Any) -> str:
    """A parsed JSON document as MySQL prints it (``", "`` and ``": "`` separators).

    >>> mysql_json_text({b"a": [1, 2.5, None, True]})
    '{"a": [1, 2.5, null, true]}'
    """
    return json.dumps(_json_plain(value), ensure_ascii=False, separators=(", ", ": "))


def _json_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, dict):
        return {_json_plain(k): _json_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- converters


def _to_bool(value: Any) -> bool:
    if isinstance(value, bytes):
        return any(value)
    return bool(value)


def _to_bits(value: Any) -> int:
    """BIT(n) as a signed 64-bit integer: BIT(64) values with the top bit set wrap, as
    Connector/J's ``getLong`` reads them."""
    number = int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)
    return number - (1 << 64) if number >= 1 << 63 else number


def _unsigned(bits: int) -> Converter:
    wrap = 1 << bits

    def convert(value: int) -> int:
        return value + wrap if value < 0 else value

    return convert


def text_decoder(column: ColumnInfo) -> Callable[[bytes], str]:
    """The function decoding a text column's bytes with its character set, as the server does:
    a Unicode set by Python's codec, any other by the server's own answers
    (`orchestrator.schema.charsets`, which the capture loads before it decodes).

    Raises:
        CharsetError: a non-Unicode set not loaded in this process.
    """
    charset = (column.charset or "utf8mb4").lower()
    name = charsets.UNICODE.get(charset, "utf-8" if charset == "binary" else None)
    if name is None:
        return charsets.decoder(charset)
    return lambda raw: raw.decode(name)  # the server refuses to store invalid Unicode: corrupt


def _text(column: ColumnInfo, *, strip_pad: bool) -> Converter:
    decode = text_decoder(column)

    def convert(value: Any) -> str:
        text = decode(value) if isinstance(value, bytes) else str(value)
        # SELECT returns CHAR without its trailing pad spaces (no PAD_CHAR_TO_FULL_LENGTH).
        return text.rstrip(" ") if strip_pad else text

    return convert


def _json(column: ColumnInfo) -> Converter:
    decode = text_decoder(column)

    def convert(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, bytes | bytearray):
            return decode(bytes(value))
        return mysql_json_text(value)

    return convert


def _binary_padded(length: int) -> Converter:
    def convert(value: Any) -> bytes:
        raw = bytes(value)
        return raw + b"\0" * (length - len(raw)) if len(raw) < length else raw

    return convert


def _date(value: Any) -> dt.date | None:
    if isinstance(value, dt.datetime):
        return value.date()
    return value if isinstance(value, dt.date) else None  # '0000-00-00' strings -> NULL


def _datetime(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None) if value.tzinfo else value
    return None


def _timestamp(value: Any) -> dt.datetime | None:
    """An instant: aware datetimes are converted, naive ones are UTC wall clock."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is not None:
        return value.astimezone(_UTC)
    return value.replace(tzinfo=_UTC)


def _time(value: Any) -> int:
    return time_micros(value) if isinstance(value, dt.timedelta) else int(value)


def column_converter(column: ColumnInfo) -> Converter | None:
    """The function taking a non-NULL Python value of ``column`` to its staging value.

    None means the value goes to Arrow as it is.
    """
    t = column.data_type
    if is_boolean(column):
        return _to_bool
    if t in INTEGER_BITS:
        return _unsigned(INTEGER_BITS[t]) if column.unsigned else None
    if t in DECIMAL_TYPES and (column.precision or 10) > 38:
        scale = column.scale or 0
        return lambda value: decimal_text(value, scale)
    if t == "bit":
        return _to_bits
    if t in TEXT_TYPES:
        return _text(column, strip_pad=t == "char")
    if t in ("enum", "set"):
        labels = definition_labels(column.column_type)
        return (lambda value: set_text(value, labels)) if t == "set" else None
    if t == "json":
        return _json(column)
    if t == "binary":
        return _binary_padded(binary_length(column.column_type))
    if t in SPATIAL_TYPES:
        return spatial_wkb(column)
    if t in PACKED_TYPES:  # a read gives the text; the binlog's decoders, the bytes
        printed = packed.text_of(t)
        return lambda value: printed(value) if isinstance(value, bytes) else value
    if t in BINARY_TYPES:
        return bytes
    if t in FLOAT_TYPES:  # -0.0 as 0.0, as the server prints it (`binlog.columns._float`)
        return lambda value: value + 0.0
    return {"date": _date, "datetime": _datetime, "timestamp": _timestamp, "time": _time}.get(t)


def spatial_wkb(column: ColumnInfo) -> Callable[[bytes], bytes]:
    """The function taking a spatial value in MySQL's storage form - the SRID as 4 bytes little
    endian, then the geometry's WKB - to the OGC WKB published (docs/types.md). The binlog and a
    read of the column carry the same storage form, so both paths publish the same bytes. A
    value of another SRID than the column declares (MariaDB does not enforce ``REF_SYSTEM_ID``)
    cannot be published under the column's SRID: it raises, naming both.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> wkb = spatial_wkb(C("p", "point", "point", True, srid=4326))
    >>> wkb(bytes.fromhex("e6100000") + bytes.fromhex("0101000000") + bytes(16)).hex()[:10]
    '0101000000'
    >>> wkb(bytes(4) + bytes.fromhex("0101000000") + bytes(16))
    Traceback (most recent call last):
    ...
    ValueError: column `p` holds a value of SRID 0, but the column declares SRID 4326 ...
    """
    declared = column.srid
    prefix = None if declared is None else declared.to_bytes(4, "little")

    def convert(value: bytes) -> bytes:
        raw = bytes(value)
        if prefix is not None and raw[:4] != prefix:
            raise ValueError(srid_mismatch(column, int.from_bytes(raw[:4], "little")))
        return raw[4:]

    return convert


def srid_mismatch(column: ColumnInfo, found: int | None) -> str:
    """Why a spatial value of another SRID than its column's cannot be published, with the fix."""
    other = "another SRID" if found is None else f"SRID {found}"
    return (
        f"column `{column.name}` holds a value of {other}, but the column declares SRID "
        f"{column.srid} (Tidemark publishes one SRID per column, docs/types.md): declare the "
        f"values' SRID on the column (MariaDB: REF_SYSTEM_ID=n, MySQL: SRID n) or convert the "
        f"values (UPDATE ... SET `{column.name}` = ST_GeomFromWKB(ST_AsBinary(`{column.name}`), "
        f"{column.srid}))"
    )


def binary_length(column_type: str) -> int:
    """The n of ``binary(n)``.

    >>> binary_length("binary(16)")
    16
    """
    head = column_type.split("(", 1)
    return int(head[1].split(")", 1)[0]) if len(head) == 2 else 1


class BatchConverter:
    """Turns rows of one table (tuples in column order) into staging Arrow arrays.

    Build it once per table; `arrays` converts a whole batch column by column,
    one ``pa.array`` call per column.

    Args:
        columns: the table's columns in ordinal order.
    """

    def __init__(self, columns: Sequence[ColumnInfo]) -> None:
        self.columns = tuple(columns)
        self.schema = staging_schema(self.columns)
        self._converters = [column_converter(c) for c in self.columns]

    def column_values(self, rows: Sequence[Sequence[Any] | None], index: int) -> list[Any]:
        """The staging Python values of column ``index`` (a missing row gives NULL)."""
        convert = self._converters[index]
        if convert is None:
            return [None if r is None else r[index] for r in rows]
        out: list[Any] = []
        append = out.append
        for row in rows:
            value = None if row is None else row[index]
            append(None if value is None else convert(value))
        return out

    def arrays(self, rows: Sequence[Sequence[Any] | None]) -> list[pa.Array]:
        """One array per column, in staging types."""
        return [
            pa.array(self.column_values(rows, i), type=field.type)
            for i, field in enumerate(self.schema)
        ]

    def table(self, rows: Sequence[Sequence[Any] | None]) -> pa.Table:
        """The batch as an Arrow table in the staging schema."""
        return pa.Table.from_arrays(self.arrays(rows), schema=self.schema)
