"""MySQL's binary JSON (a JSON column's value in the binlog) as the text MySQL prints.

The JDBC read gets a JSON column as the server's own text (what ``JSON_EXTRACT`` or a
plain SELECT prints); the binlog carries the binary form. `json_text` prints the binary
form exactly as the server would, so a row read either way is the same string:

* objects ``{"k": v, ...}`` and arrays ``[v, ...]`` with ``", "`` and ``": "`` between,
  members in stored order (the server keeps keys sorted);
* integers as they are; doubles as the server's ``my_gcvt`` prints them (the shortest
  digits that read back the same, fixed notation for decimal exponents -14 to 15, else
  ``1.5e300``), with ``.0`` added to one that would read back as an integer;
* strings quoted and escaped (``\\"``, ``\\\\``, ``\\n``..., ``\\u00XX`` below 0x20);
* opaque values: DECIMAL as its digits with its scale (``1.50``); DATE, TIME, DATETIME
  and TIMESTAMP quoted, with 6 fractional digits; others ``"base64:type<N>:<data>"``.

The layout (MySQL's ``json_binary.h``): a type byte, then the value. Objects and arrays
(small: 2-byte counts and offsets, large: 4-byte) hold an element count, their size, key
entries (offset, 2-byte length), value entries (a type and an offset, or the value itself
when it fits: literals and 16-bit integers, 32-bit ones in large containers); offsets
count from the container's start. Strings are a variable-length length (7 bits a byte)
and UTF-8 bytes; opaque values a field type, such a length and the bytes.
"""

from __future__ import annotations

import base64
import struct

from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog.columns import decimal_parts

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0, 1, 2, 3
LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING = range(4, 13)
OPAQUE = 15
_LITERALS = {0: "null", 1: "true", 2: "false"}
_FIXED = {INT16: "<h", UINT16: "<H", INT32: "<i", UINT32: "<I", INT64: "<q", UINT64: "<Q"}
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
#: Digits of the decimal exponent printed in fixed notation (MySQL's MAX_DECPT_FOR_F_FORMAT).
_MAX_FIXED = 15


def json_text(raw: bytes) -> str:
    """A binary JSON document as MySQL prints it.

    >>> json_text(bytes([LITERAL, 1]))
    'true'

    Raises:
        ValueError: the document is truncated or of an unknown type.
    """
    if not raw:
        raise ValueError("an empty binary JSON document")
    try:
        return _value(raw[0], memoryview(raw)[1:])
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated binary JSON document ({exc})") from exc


def _value(kind: int, data: memoryview) -> str:
    if kind in (SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY):
        return _container(
            data,
            large=kind in (LARGE_OBJECT, LARGE_ARRAY),
            is_object=kind in (SMALL_OBJECT, LARGE_OBJECT),
        )
    if kind == LITERAL:
        if data[0] not in _LITERALS:
            raise ValueError(f"an unknown JSON literal {data[0]}")
        return _LITERALS[data[0]]
    if kind in _FIXED:
        return str(struct.unpack_from(_FIXED[kind], data)[0])
    if kind == DOUBLE:
        return double_text(struct.unpack_from("<d", data)[0])
    if kind == STRING:
        length, start = _length(data)
        return quote(_bytes(data, start, length).decode("utf-8"))
    if kind == OPAQUE:
        length, start = _length(data[1:])
        return _opaque(data[0], _bytes(data, 1 + start, length))
    raise ValueError(f"an unknown binary JSON type {kind}")


def _container(data: memoryview, *, large: bool, is_object: bool) -> str:
    width = 4 if large else 2
    count, size = _uint(data, 0, width), _uint(data, width, width)
    if size > len(data):
        raise ValueError(f"a JSON container of {size} bytes in {len(data)}")
    keys_at = 2 * width
    values_at = keys_at + (count * (width + 2) if is_object else 0)
    members = []
    for i in range(count):
        entry = values_at + i * (1 + width)
        kind = data[entry]
        if kind in (LITERAL, INT16, UINT16) or (large and kind in (INT32, UINT32)):
            value = _value(kind, data[entry + 1 : entry + 1 + width])
        else:
            offset = _uint(data, entry + 1, width)
            if offset >= size:
                raise ValueError(f"a JSON value at offset {offset} of a {size}-byte container")
            value = _value(kind, data[offset:size])
        if is_object:
            key_entry = keys_at + i * (width + 2)
            key = _bytes(data, _uint(data, key_entry, width), _uint(data, key_entry + width, 2))
            members.append(f"{quote(key.decode('utf-8'))}: {value}")
        else:
            members.append(value)
    inner = ", ".join(members)
    return f"{{{inner}}}" if is_object else f"[{inner}]"


def _opaque(field_type: int, data: bytes) -> str:
    """An opaque value: a DECIMAL, a temporal value, or other bytes (base64, as MySQL does)."""
    if field_type == rd.NEWDECIMAL:
        precision, scale = data[0], data[1]
        size = rd.decimal_size(precision, scale)
        if len(data) < 2 + size:
            raise ValueError(f"a DECIMAL({precision},{scale}) of {len(data) - 2} bytes")
        return _decimal(data[2 : 2 + size], precision, scale)
    if field_type in (
        rd.DATE,
        rd.TIME,
        rd.DATETIME,
        rd.TIMESTAMP,
        rd.TIME2,
        rd.DATETIME2,
        rd.TIMESTAMP2,
        rd.NEWDATE,
    ):
        if len(data) < 8:
            raise ValueError(f"a temporal JSON value of {len(data)} bytes")
        packed = int.from_bytes(data[:8], "little", signed=True)
        return f'"{temporal_text(field_type, packed)}"'
    return f'"base64:type{field_type}:{base64.b64encode(data).decode()}"'


def _decimal(raw: bytes, precision: int, scale: int) -> str:
    negative, unscaled = decimal_parts(precision, scale)(raw)
    digits = str(unscaled).rjust(scale + 1, "0")
    text = f"{digits[: len(digits) - scale]}.{digits[len(digits) - scale :]}" if scale else digits
    return f"-{text}" if negative and unscaled else text


def temporal_text(field_type: int, packed: int) -> str:
    """A packed DATE/TIME/DATETIME/TIMESTAMP (MySQL's ``TIME_to_longlong_*_packed``) as the
    server prints it in JSON.

    >>> temporal_text(rd.DATETIME,
    ...               ((((2015 * 13 + 1) << 5 | 15) << 17 | 23 << 12 | 24 << 6 | 25) << 24) + 5)
    '2015-01-15 23:24:25.000005'
    >>> temporal_text(rd.TIME, -((838 << 12 | 59 << 6 | 59) << 24))
    '-838:59:59.000000'
    """
    sign = "-" if packed < 0 else ""
    packed = abs(packed)
    micros, whole = packed % (1 << 24), packed >> 24
    hms = whole % (1 << 17)
    if field_type in (rd.TIME, rd.TIME2):
        return f"{sign}{whole >> 12:02d}:{whole >> 6 & 63:02d}:{whole & 63:02d}.{micros:06d}"
    ymd = whole >> 17
    year, month, day = (ymd >> 5) // 13, (ymd >> 5) % 13, ymd & 31
    date = f"{year:04d}-{month:02d}-{day:02d}"
    if field_type in (rd.DATE, rd.NEWDATE):
        return date
    return f"{date} {hms >> 12:02d}:{hms >> 6 & 63:02d}:{hms & 63:02d}.{micros:06d}"


def double_text(value: float) -> str:
    """A JSON double as MySQL prints it.

    >>> [double_text(v) for v in (1.0, 0.1, -2.5, 1e15, 1e14)]
    ['1.0', '0.1', '-2.5', '1e15', '100000000000000.0']
    >>> [double_text(v) for v in (1e-5, 1e-15, 1e-16, 1.5e300)]
    ['0.00001', '0.000000000000001', '1e-16', '1.5e300']
    """
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"a JSON double {value}")
    sign = "-" if str(value).startswith("-") else ""
    digits, decpt = _shortest(abs(value))
    if -_MAX_FIXED + 1 <= decpt <= _MAX_FIXED or len(digits) > decpt > 0:
        if decpt <= 0:
            text = "0." + "0" * -decpt + digits
        elif decpt >= len(digits):
            text = digits + "0" * (decpt - len(digits))
        else:
            text = f"{digits[:decpt]}.{digits[decpt:]}"
    else:
        text = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "") + f"e{decpt - 1}"
    if "." not in text and "e" not in text:
        text += ".0"
    return sign + text


def _shortest(value: float) -> tuple[str, int]:
    """The shortest digits that read back as ``value`` and the decimal point's place:
    ``value = 0.<digits> * 10**decpt`` (``("0", 1)`` for zero)."""
    if value == 0:
        return "0", 1
    mantissa, exponent = repr(value).lower().partition("e")[::2]
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    decpt = (
        len(whole.lstrip("0")) if whole.strip("0") else -(len(fraction) - len(fraction.lstrip("0")))
    )
    digits = digits.rstrip("0") or "0"
    return digits, decpt + (int(exponent) if exponent else 0)


def quote(text: str) -> str:
    """A JSON string as MySQL quotes it.

    >>> quote('a"b\\\\c\\n\\x01é')
    '"a\\\\"b\\\\\\\\c\\\\n\\\\u0001é"'
    """
    out = [_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ch < " " else ch) for ch in text]
    return '"' + "".join(out) + '"'


def _length(data: memoryview) -> tuple[int, int]:
    """A variable-length length (7 bits a byte, low first, at most 5 bytes) and its size."""
    length = 0
    for i in range(5):
        byte = data[i]
        length |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return length, i + 1
    raise ValueError("a JSON length of more than 5 bytes")


def _uint(data: memoryview, at: int, width: int) -> int:
    if at + width > len(data):
        raise ValueError(f"a JSON container ends at {len(data)}, inside an entry at {at}")
    return int.from_bytes(data[at : at + width], "little")


def _bytes(data: memoryview, at: int, length: int) -> bytes:
    if at + length > len(data):
        raise ValueError(f"a JSON value of {length} bytes at {at} of {len(data)}")
    return bytes(data[at : at + length])
