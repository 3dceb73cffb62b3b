"""DATE, DATETIME, TIMESTAMP and TIME columns of raw binlog values -> Arrow arrays.

DATETIME2 and TIMESTAMP2 (MySQL 5.6+ and MariaDB 10.1+ formats) are big-endian
bit fields and whole columns of them are taken apart by Arrow's integer
kernels; a date is converted once per distinct date. The pre-5.6 formats and
TIME convert value by value.

The results equal what `orchestrator.schema.values` makes of python-mysql-replication's
values, quirks included: a DATETIME whose date or time ``datetime`` refuses is
NULL, a fraction of seconds that is not positive is ignored, a DATE that is not
valid (and not zero) raises, the zero TIMESTAMP is NULL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.binlog import rowdecode as rd
from orchestrator.schema.values import time2_micros

Finisher = Callable[[Sequence[Any]], pa.Array]

_US = 1_000_000
_US_PER_DAY = 86_400 * _US
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_NULL_INT = pa.scalar(None, pa.int64())


def u64(value: int) -> pa.Scalar:
    """An unsigned 64-bit scalar (Arrow's bit kernels want operands of one type)."""
    return pa.scalar(value, pa.uint64())


def big_endian(values: Sequence[Any], size: int) -> pa.Array:
    """Fields of ``size`` bytes (at most 8) as unsigned big-endian integers (NULL stays null).

    Arrow packs the fields into one buffer and numpy reads each as a big-endian word: an int
    made per value in Python cost 0.3 s a million 8-byte fields. A field of another size is
    an error (Arrow refuses it), never a guess.
    """
    fields = pa.array(values, pa.binary(size))
    count = len(fields)
    validity, data = fields.buffers()
    words = np.zeros((count, 8), np.uint8)
    if count:
        words[:, 8 - size :] = np.frombuffer(data, np.uint8, count * size).reshape(count, size)
    native = words.view(">u8").astype(np.uint64).ravel()
    return pa.Array.from_buffers(
        pa.uint64(), count, [validity, pa.py_buffer(native)], null_count=fields.null_count
    )


def _split_fraction(
    values: Sequence[Any], fsp: int, whole_bytes: int
) -> tuple[pa.Array, pa.Array | None]:
    """TIMESTAMP2/DATETIME2 fields (``whole_bytes``, then the fraction's) -> (the whole-seconds
    part, the fraction in microseconds).

    The fraction is as the library reads it: signed big-endian (a negative one is
    then ignored), divided by 10 for an odd fsp.
    """
    packed = big_endian(values, whole_bytes + (fsp + 1) // 2)
    bits = 8 * ((fsp + 1) // 2)
    if not bits:
        return packed.cast(pa.int64()), None
    whole = pc.shift_right(packed, u64(bits)).cast(pa.int64())
    stored = pc.bit_wise_and(packed, u64((1 << bits) - 1)).cast(pa.int64())
    stored = pc.if_else(pc.greater_equal(stored, 1 << (bits - 1)), 0, stored)
    if fsp % 2:
        stored = pc.divide(stored, 10)
    return whole, pc.multiply(stored, 10 ** (6 - fsp))


def _check_fraction(micros: pa.Array | None, valid: pa.Array | None = None) -> None:
    if micros is None:
        return
    kept = micros if valid is None else pc.if_else(valid, micros, 0)
    if (pc.max(kept).as_py() or 0) > 999_999:
        raise ValueError("microsecond must be in 0..999999")


def _lookup(keys: pa.Array, convert: Callable[[int], int | None]) -> pa.Array:
    """``convert`` of each key, called once per distinct key."""
    distinct = pc.unique(keys).drop_null()
    table = pa.array([convert(k) for k in distinct.to_pylist()], pa.int64())
    return table.take(pc.index_in(keys, value_set=distinct))


def _daynr(year: int, month: int, day: int) -> int:
    """The server's day number (its ``calc_daynr``, as ``TO_DAYS``; year at least 1)."""
    total = 365 * year + 31 * (month - 1) + day
    if month <= 2:
        year -= 1
    else:
        total -= (month * 4 + 23) // 10
    return total + year // 4 - ((year // 100 + 1) * 3) // 4


_EPOCH_DAYNR = _daynr(1970, 1, 1)


def _civil_days(year: int, month: int, day: int) -> int | None:
    """Days since 1970 as the snapshot's ``DATEDIFF`` counts them: an invalid date the server kept
    (``ALLOW_INVALID_DATES``: February 30) rolls over into the next month, and a date with a zero
    part, or in year 0 (before what a date type holds), is NULL (`orchestrator.pipeline.read.sql`).

    >>> _civil_days(2024, 2, 29), _civil_days(2020, 2, 30) == _civil_days(2020, 3, 1)
    (19782, True)
    >>> _civil_days(0, 1, 1), _civil_days(2020, 0, 15)
    (None, None)
    """
    if not (year and month and day):
        return None
    return _daynr(year, month, day) - _EPOCH_DAYNR


def _date_days(packed: int) -> int | None:
    return _civil_days(packed >> 9, packed >> 5 & 15, packed & 31)


def _datetime2_days(ymd: int) -> int | None:
    """Days since 1970 of DATETIME2's date bits (`_civil_days`).

    >>> _datetime2_days((2024 * 13 + 2) << 5 | 29), _datetime2_days((2021 * 13 + 0) << 5 | 30)
    (19782, None)
    """
    year_month, day = ymd >> 5, ymd & 31
    return _civil_days(year_month // 13, year_month % 13, day)


def _date(values: Sequence[Any]) -> pa.Array:
    packed = pa.array(
        [None if v is None else int.from_bytes(v, "little") for v in values], pa.int64()
    )
    return _lookup(packed, _date_days).cast(pa.int32()).view(pa.date32())


def _datetime2(fsp: int) -> Finisher:
    """DATETIME2: a sign bit, year*13+month (17 bits), day (5), hour (5), minute (6),
    second (6), then the fraction; a date or time ``datetime`` refuses is NULL."""

    def finish(values: Sequence[Any]) -> pa.Array:
        whole, micros = _split_fraction(values, fsp, 5)
        days = _lookup(pc.bit_wise_and(pc.shift_right(whole, 17), 0x3FFFFF), _datetime2_days)
        hour = pc.bit_wise_and(pc.shift_right(whole, 12), 31)
        minute = pc.bit_wise_and(pc.shift_right(whole, 6), 63)
        second = pc.bit_wise_and(whole, 63)
        valid = pc.and_(
            pc.and_(pc.less_equal(hour, 23), pc.less_equal(minute, 59)),
            pc.and_(pc.less_equal(second, 59), pc.is_valid(days)),
        )
        _check_fraction(micros, valid)
        seconds = pc.add(pc.multiply(pc.add(pc.multiply(hour, 60), minute), 60), second)
        instant = pc.add(pc.multiply(days, _US_PER_DAY), pc.multiply(seconds, _US))
        if micros is not None:
            instant = pc.add(instant, micros)
        return pc.if_else(valid, instant, _NULL_INT).view(pa.timestamp("us"))

    return finish


def _timestamp2(fsp: int) -> Finisher:
    """TIMESTAMP2: big-endian seconds since 1970 (read unsigned: MariaDB 11.5+ stores up to
    2106), then the fraction; zero is NULL."""

    def finish(values: Sequence[Any]) -> pa.Array:
        seconds, micros = _split_fraction(values, fsp, 4)
        _check_fraction(micros)
        instant = pc.multiply(seconds, _US)
        if micros is not None:
            instant = pc.add(instant, micros)
        instant = pc.if_else(pc.equal(instant, 0), _NULL_INT, instant)
        return instant.view(pa.timestamp("us", tz="UTC"))

    return finish


def _old_datetime(value: int) -> int | None:
    """The pre-5.6 DATETIME (a decimal YYYYMMDDhhmmss), with the library's arithmetic."""
    if value == 0:
        return None
    date, time = value / 1000000, int(value % 1000000)
    year, month, day = int(date / 10000), int((date % 10000) / 100), int(date % 100)
    if not (year and month and day):
        return None
    moment = dt.datetime(
        year, month, day, int(time / 10000), int((time % 10000) / 100), int(time % 100)
    )
    days = _civil_days(year, month, day)
    return (
        None
        if days is None
        else days * _US_PER_DAY + (moment.hour * 3600 + moment.minute * 60 + moment.second) * _US
    )


def _old_time(raw: bytes) -> int:
    """The pre-5.6 TIME: a signed decimal hhmmss (the library reads it unsigned, which turned
    ``-01:02:03`` into 6037813 s).

    >>> (_old_time((-10203).to_bytes(3, "little", signed=True)) // _US,
    ...  _old_time((8385959).to_bytes(3, "little")) // _US)
    (-3723, 3020399)
    """
    t = int.from_bytes(raw, "little", signed=True)
    sign, t = (-1, -t) if t < 0 else (1, t)
    return sign * ((t // 10000 * 60 + t % 10000 // 100) * 60 + t % 100) * _US


def temporal_finisher(field: rd.Field, arrow: pa.DataType) -> Finisher:
    """The finisher of a DATE, DATETIME, TIMESTAMP or TIME column in binlog format ``field``."""
    fsp = field.meta[0] if field.meta else 0
    if field.kind == rd.DATE:
        return _date
    if field.kind == rd.DATETIME2:
        return _datetime2(fsp)
    if field.kind == rd.TIMESTAMP2:
        return _timestamp2(fsp)
    convert: dict[int, Callable[[Any], Any]] = {
        rd.TIME2: lambda raw: time2_micros(raw, fsp),
        rd.DATETIME: _old_datetime,
        rd.TIMESTAMP: lambda seconds: seconds * _US if seconds else None,
        rd.TIME: _old_time,
    }
    each = convert[field.kind]
    return lambda values: pa.array([None if v is None else each(v) for v in values], arrow)
