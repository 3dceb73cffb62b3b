"""The driver's merge of one base batch with its events: a key of one integer column takes a binary
search per event (`orchestrator.pipeline.reconcile.local._integer_key`), any other key the sort of
base and event keys together; both must give the same rows and counts (random batches, every integer
width)."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline.changes import DELETE, KIND, PUT, event_key
from orchestrator.pipeline.reconcile import local as reconcile_local


def _case(
    rng: random.Random, type_: pa.DataType, low: int, high: int
) -> tuple[pa.RecordBatch, pa.Table]:
    def draw(count: int) -> set[int]:
        return {rng.randrange(low, high) for _ in range(count)}

    keys = sorted(draw(100))
    base = pa.record_batch({"id": pa.array(keys, type_), "v": pa.array([f"b{k}" for k in keys])})
    # events: some base keys (replaced or deleted), some new keys, several in one gap, at both ends
    chosen = set(rng.sample(keys, 30)) | {keys[0], keys[-1]}
    chosen |= {k for k in draw(40) if k not in keys}
    ours = sorted(chosen)
    kinds = [PUT if rng.random() < 0.6 else DELETE for _ in ours]
    events = pa.table(
        {
            event_key(0): pa.array(ours, type_),
            KIND: pa.array(kinds, pa.int8()),
            "id": pa.array(
                [k if kind == PUT else None for k, kind in zip(ours, kinds, strict=True)], type_
            ),
            "v": pa.array(
                [f"e{k}" if kind == PUT else None for k, kind in zip(ours, kinds, strict=True)]
            ),
        }
    )
    return base, events


WIDTHS = [
    (pa.int8(), -128, 128),
    (pa.int32(), -(10**9), 10**9),
    (pa.int64(), -(2**63), 2**63 - 1),
    (pa.uint64(), 2**63 - 10**6, 2**64 - 1),
    (pa.uint16(), 0, 2**16),
    # a BIGINT UNSIGNED is published as DECIMAL(20, 0): within int64, beyond it, and signed
    (pa.decimal128(20, 0), 0, 10**6),
    (pa.decimal128(20, 0), 2**63 - 10**6, 2**64 - 1),
    (pa.decimal128(12, 0), -(10**11), 10**11),
]


@pytest.mark.parametrize(("type_", "low", "high"), WIDTHS, ids=[str(w[0]) for w in WIDTHS])
@pytest.mark.parametrize("seed", range(4))
def test_an_integer_key_merges_as_the_sort_does(
    type_: pa.DataType,
    low: int,
    high: int,
    seed: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base, events = _case(random.Random(seed), type_, low, high)
    schema = base.schema
    path = str(tmp_path / "base.parquet")
    pq.write_table(pa.Table.from_batches([base]), path)
    assert reconcile_local._integer_key([base.column("id")], events) is not None, (
        "the fast path is taken"
    )
    fast = reconcile_local._merge_batch(base, events, schema, ["id"])
    fast_rows = reconcile_local.output_rows(path, base.num_rows, events, ["id"])
    monkeypatch.setattr(reconcile_local, "_integer_key", lambda base, events: None)
    slow = reconcile_local._merge_batch(base, events, schema, ["id"])
    assert fast.to_pylist() == slow.to_pylist()
    assert (
        fast_rows
        == reconcile_local.output_rows(path, base.num_rows, events, ["id"])
        == fast.num_rows
    )
    # the rows as a dictionary says: the base rows, each event's key deleted or put
    expected: dict[Any, str] = dict(
        zip(base.column("id").to_pylist(), base.column("v").to_pylist(), strict=True)
    )
    for k, kind, v in zip(
        events.column(event_key(0)).to_pylist(),
        events.column(KIND).to_pylist(),
        events.column("v").to_pylist(),
        strict=True,
    ):
        if kind == PUT:
            expected[k] = v
        else:
            expected.pop(k, None)
    assert fast.to_pylist() == [{"id": k, "v": expected[k]} for k in sorted(expected)]


def test_other_keys_take_the_sort() -> None:
    events = pa.table({event_key(0): pa.array([1]), KIND: pa.array([PUT], pa.int8())})
    assert reconcile_local._integer_key([pa.array(["a"])], events) is None
    assert reconcile_local._integer_key([pa.array([1]), pa.array([2])], events) is None
    assert reconcile_local._integer_key([pa.array([1, None])], events) is None
    cents = pa.decimal128(10, 2)
    money = pa.table(
        {event_key(0): pa.array([Decimal(1)], cents), KIND: pa.array([PUT], pa.int8())}
    )
    assert reconcile_local._integer_key([pa.array([Decimal(1)], cents)], money) is None
    # a DECIMAL(20, 0) whose values fit neither int64 nor uint64 together
    wide = pa.decimal128(20, 0)
    mixed = pa.table(
        {event_key(0): pa.array([Decimal(2**64 - 1)], wide), KIND: pa.array([PUT], pa.int8())}
    )
    assert reconcile_local._integer_key([pa.array([Decimal(-1)], wide)], mixed) is None
