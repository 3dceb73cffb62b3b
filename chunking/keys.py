"""Chunk-key values: the Python types a key holds, JSON encoding, and ordering.

A key is a tuple with one value per chunk-key column, as PyMySQL returns them:
``int`` (any size, BIGINT UNSIGNED included), ``str``, ``bytes``, ``Decimal``,
``float``, ``date``, ``datetime``, ``time`` and ``timedelta`` (MySQL TIME).
Zero dates come back from PyMySQL as ``str`` and stay ``str``.

`encode_key` / `decode_key` turn a key into JSON-able data and back with no
loss: JSON-native values stay native (ints of any size included: Python's
``json`` writes them exactly), the rest become one-entry objects tagged with
their kind.

`key_order` compares keys in Python where that is the database's order too
(numbers, temporal values, binary strings). Text is never compared in Python:
its order belongs to the column's collation, so only the database compares it.
"""

from __future__ import annotations

import base64
import re
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeAlias

KeyValue: TypeAlias = (
    int | str | bytes | Decimal | float | date | datetime | time | timedelta | None
)
Key: TypeAlias = tuple[KeyValue, ...]

_TIME = re.compile(r"^(-?)(\d+):(\d{2}):(\d{2})(?:\.(\d{1,6}))?$")


def format_timedelta(value: timedelta) -> str:
    """MySQL TIME text for a duration: sign, hours (may exceed 24), microseconds.

    >>> format_timedelta(timedelta(hours=838, minutes=59, seconds=59))
    '838:59:59.000000'
    >>> format_timedelta(-timedelta(seconds=1, microseconds=500000))
    '-00:00:01.500000'
    >>> format_timedelta(timedelta(0))
    '00:00:00.000000'
    """
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    return f"{sign}{hours:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def parse_timedelta(text: str) -> timedelta:
    """The inverse of `format_timedelta`.

    >>> parse_timedelta('-838:59:59.000000') == -timedelta(hours=838, minutes=59, seconds=59)
    True
    >>> parse_timedelta('25:00:00.5')
    datetime.timedelta(days=1, seconds=3600, microseconds=500000)
    """
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"not a TIME value: {text!r}")
    sign, hours, minutes, seconds, fraction = match.groups()
    value = timedelta(
        hours=int(hours),
        minutes=int(minutes),
        seconds=int(seconds),
        microseconds=int((fraction or "0").ljust(6, "0")),
    )
    return -value if sign else value


def _encode_value(value: KeyValue) -> Any:
    if value is None or isinstance(value, bool | int | str | float):
        return value
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime):
        return {"datetime": value.isoformat(timespec="microseconds")}
    if isinstance(value, date):
        return {"date": value.isoformat()}
    if isinstance(value, time):
        return {"time": value.isoformat(timespec="microseconds")}
    if isinstance(value, timedelta):
        return {"timedelta": format_timedelta(value)}
    raise TypeError(f"cannot encode a chunk-key value of type {type(value).__name__}: {value!r}")


_DECODERS: dict[str, Any] = {
    "decimal": Decimal,
    "bytes": lambda s: base64.b64decode(s.encode("ascii"), validate=True),
    "datetime": datetime.fromisoformat,
    "date": date.fromisoformat,
    "time": time.fromisoformat,
    "timedelta": parse_timedelta,
}


def _decode_value(data: Any) -> KeyValue:
    if data is None or isinstance(data, bool | int | str | float):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((tag, text),) = data.items()
        if tag in _DECODERS and isinstance(text, str):
            return _DECODERS[tag](text)
    raise ValueError(f"not an encoded chunk-key value: {data!r}")


def encode_key(values: Key | None) -> list[Any] | None:
    """A key as JSON-able data (``None`` stays ``None``: an unbounded end).

    >>> encode_key((18446744073709551615, 'a\\'b'))
    [18446744073709551615, "a'b"]
    >>> encode_key((Decimal('1.50'), b'\\x00\\xff', date(2024, 2, 29)))
    [{'decimal': '1.50'}, {'bytes': 'AP8='}, {'date': '2024-02-29'}]
    >>> encode_key((datetime(2024, 1, 2, 3, 4, 5, 6), -timedelta(hours=30)))
    [{'datetime': '2024-01-02T03:04:05.000006'}, {'timedelta': '-30:00:00.000000'}]
    >>> encode_key(None) is None
    True
    """
    if values is None:
        return None
    return [_encode_value(v) for v in values]


def decode_key(data: Any) -> Key | None:
    """The inverse of `encode_key`.

    >>> import json
    >>> key = (-5, Decimal('12345678901234567890.000001'), datetime(2024, 1, 2, 3, 4, 5, 6))
    >>> decode_key(json.loads(json.dumps(encode_key(key)))) == key
    True
    >>> decode_key(None) is None
    True
    """
    if data is None:
        return None
    if not isinstance(data, list | tuple):
        raise ValueError(f"an encoded chunk key is a list, found {data!r}")
    return tuple(_decode_value(v) for v in data)


def python_orderable(value: KeyValue) -> bool:
    """Whether Python orders this value as MySQL orders its column (not text).

    >>> python_orderable(3), python_orderable(b'x'), python_orderable('x')
    (True, True, False)
    """
    return not isinstance(value, str) and value is not None


def key_order(a: Key, b: Key) -> int:
    """-1, 0 or 1 as key ``a`` sorts before, equal to, or after ``b`` (lexicographic).

    Only for values whose order Python shares with MySQL (`python_orderable`):
    text depends on the column's collation, so it raises ``TypeError`` — ask the
    database instead.

    >>> key_order((1, 5), (1, 7)), key_order((2,), (1,)), key_order((b'a',), (b'a',))
    (-1, 1, 0)
    >>> key_order(('a',), ('B',))
    Traceback (most recent call last):
    ...
    TypeError: text keys are ordered by their column's collation: compare them in the database
    """
    if len(a) != len(b):
        raise ValueError(f"keys of different length: {len(a)} and {len(b)}")
    for x, y in zip(a, b, strict=True):
        if not (python_orderable(x) and python_orderable(y)):
            raise TypeError(
                "text keys are ordered by their column's collation: compare them in the database"
            )
        if x < y:  # type: ignore[operator]
            return -1
        if x > y:  # type: ignore[operator]
            return 1
    return 0


def short(key: Key | None, limit: int = 60) -> str:
    """A key for a log line or a table cell: one value bare, long text cut.

    >>> short((1, 'abc'))
    "(1, 'abc')"
    >>> short(('x' * 100,), limit=12)
    "'xxxxxxxx..."
    >>> short((7,))
    '7'
    """
    if key is None:
        return "none"
    text = repr(key[0]) if len(key) == 1 else repr(tuple(key))
    return text if len(text) <= limit else text[: limit - 3] + "..."
