"""Value objects: validation, containment, JSON forms."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import pytest

from chunking.ranges import Chunk, KeyRange, TablePlan


def test_factories() -> None:
    assert KeyRange.all() == KeyRange(None, None, False)
    assert KeyRange.of((1,), (2,)) == KeyRange((1,), (2,))
    assert KeyRange.through((1,), (2,)).end_inclusive
    assert KeyRange.all().is_all and not KeyRange.of(None, (1,)).is_all


@pytest.mark.parametrize(
    "args",
    [
        ((1,), None, True),  # inclusive end with no end
        ([1], None, False),  # a list is not a key
        ((), None, False),  # an empty key
        ((1,), (1, 2), False),  # arity mismatch
    ],
)
def test_invalid_ranges(args: tuple[object, object, bool]) -> None:
    with pytest.raises((TypeError, ValueError)):
        KeyRange(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key_range", "inside", "outside"),
    [
        (KeyRange.all(), [(-(2**63),), (2**64 - 1,)], []),
        (KeyRange.of(None, (10,)), [(-5,), (9,)], [(10,), (11,)]),
        (KeyRange.of((10,), None), [(10,), (10**12,)], [(9,)]),
        (KeyRange.of((1, 5), (2, 0)), [(1, 5), (1, 99)], [(1, 4), (2, 0)]),
        (KeyRange.through((1, 5), (2, 0)), [(2, 0)], [(2, 1)]),
    ],
)
def test_contains(
    key_range: KeyRange, inside: list[tuple[int, ...]], outside: list[tuple[int, ...]]
) -> None:
    assert all(key_range.contains(k) for k in inside)
    assert not any(key_range.contains(k) for k in outside)


def test_describe() -> None:
    assert KeyRange.all().describe() == "(-inf, +inf)"
    assert KeyRange.of((1,), (2,)).describe() == "[1, 2)"
    assert KeyRange.through((1, "a"), (2, "b")).describe() == "[(1, 'a'), (2, 'b')]"


def test_plan_round_trips_through_json() -> None:
    chunks = (
        Chunk(0, KeyRange.of(None, (Decimal("1.5"), datetime(2024, 1, 1, 0, 0, 0, 1))), 10),
        Chunk(
            1,
            KeyRange.through(
                (Decimal("1.5"), datetime(2024, 1, 1, 0, 0, 0, 1)),
                (Decimal("9"), datetime(2025, 1, 1)),
            ),
            7,
        ),
    )
    plan = TablePlan("d.t", "uneven", ("a", "b"), chunks, {"rows": 17, "queries": 4})
    back = TablePlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan
    assert back.estimated_rows == 17
