"""Key values: exact JSON round trips, and Python ordering only where MySQL agrees."""

from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chunking.keys import (
    Key,
    decode_key,
    encode_key,
    format_timedelta,
    key_order,
    parse_timedelta,
    python_orderable,
)

MAX_TIME = timedelta(hours=838, minutes=59, seconds=59, microseconds=999999)

values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(),  # beyond any MySQL type: still exact
    st.text(),
    st.binary(max_size=64),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dates(),
    st.datetimes(),
    st.times(),
    st.timedeltas(min_value=-MAX_TIME, max_value=MAX_TIME),
)
keys = st.lists(values, min_size=1, max_size=4).map(tuple)


def json_round_trip(key: Key | None) -> Key | None:
    return decode_key(json.loads(json.dumps(encode_key(key))))


@given(keys)
def test_encode_decode_round_trips_exactly_through_json(key: Key) -> None:
    back = json_round_trip(key)
    assert back == key
    assert back is not None
    assert [type(v) for v in back] == [type(v) for v in key]
    # Decimal equality ignores exponent; the text must survive too
    assert [str(v) for v in back] == [str(v) for v in key]


@pytest.mark.parametrize(
    "key",
    [
        (18446744073709551615,),
        (-(2**63),),
        (2**200,),
        (Decimal("12345678901234567890.123456789012"),),
        (Decimal("-0.000000"),),
        ('it\'s \\ "quoted"\0\n\r\x1a%_😀',),
        (b"\x00\xff'\\",),
        (datetime(9999, 12, 31, 23, 59, 59, 999999), date(1000, 1, 1)),
        (-MAX_TIME, MAX_TIME, timedelta(0), -timedelta(microseconds=1)),
        (time(0, 0), time(23, 59, 59, 999999)),
        ("0000-00-00",),  # a zero date, as PyMySQL returns it
    ],
)
def test_hostile_keys_round_trip(key: Key) -> None:
    assert json_round_trip(key) == key


def test_none_is_an_unbounded_end() -> None:
    assert encode_key(None) is None
    assert decode_key(None) is None


@pytest.mark.parametrize(
    "data",
    [
        {"decimal": "1"},  # not a list
        [{"nope": "1"}],
        [{"decimal": "1", "date": "2020-01-01"}],
        [{"bytes": "not base64!"}],
        [{"date": 5}],
        [[1, 2]],
    ],
)
def test_decode_rejects_what_encode_never_writes(data: object) -> None:
    with pytest.raises(ValueError):
        decode_key(data)


def test_encode_rejects_unknown_types() -> None:
    with pytest.raises(TypeError, match="set"):
        encode_key(({1},))  # type: ignore[arg-type]


@given(st.timedeltas(min_value=-MAX_TIME, max_value=MAX_TIME))
def test_time_text_round_trips(value: timedelta) -> None:
    assert parse_timedelta(format_timedelta(value)) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(days=34, hours=22, minutes=59, seconds=59), "838:59:59.000000"),
        (-timedelta(days=34, hours=22, minutes=59, seconds=59), "-838:59:59.000000"),
        (-timedelta(microseconds=1), "-00:00:00.000001"),
        (timedelta(hours=25), "25:00:00.000000"),
    ],
)
def test_time_text(value: timedelta, text: str) -> None:
    assert format_timedelta(value) == text


orderable = st.one_of(
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), min_size=2, max_size=2),
    st.lists(st.binary(max_size=6), min_size=2, max_size=2),
    st.lists(st.datetimes(), min_size=2, max_size=2),
    st.lists(st.timedeltas(min_value=-MAX_TIME, max_value=MAX_TIME), min_size=2, max_size=2),
)


@given(orderable, orderable)
def test_key_order_is_lexicographic(a: list[Any], b: list[Any]) -> None:
    ka, kb = tuple(a), tuple(b)
    if [type(x) for x in ka] != [type(x) for x in kb]:
        return
    expected = (ka > kb) - (ka < kb)
    assert key_order(ka, kb) == expected
    assert key_order(kb, ka) == -expected


def test_text_is_never_ordered_in_python() -> None:
    assert not python_orderable("a")
    with pytest.raises(TypeError, match="collation"):
        key_order((1, "a"), (1, "B"))
    with pytest.raises(ValueError, match="length"):
        key_order((1,), (1, 2))
