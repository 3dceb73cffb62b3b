"""The changes of a table without a key as counts (`orchestrator.pipeline.reconcile.multiset`):
each change after the base's position counts once, however often a capture read it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.pipeline.reconcile import multiset
from orchestrator.pipeline.reconcile.multiset import net_rows, signed_rows
from orchestrator.positions import BinlogPosition

SCHEMA = pa.schema([pa.field("a", pa.int32()), pa.field("b", pa.string())])


def _changes(
    rows: list[tuple[int, int, int, str, int, str | None, int | None, str | None]],
) -> pa.Table:
    """(file, pos, row, op, a, b, old a, old b) each."""
    names = ["_tm_file", "_tm_pos", "_tm_row", "_tm_op", "a", "b", "_tm_old_a", "_tm_old_b"]
    return pa.table(
        {name: [r[i] for r in rows] for i, name in enumerate(names)},
        schema=pa.schema(
            [
                pa.field("_tm_file", pa.int64()),
                pa.field("_tm_pos", pa.int64()),
                pa.field("_tm_row", pa.int64()),
                pa.field("_tm_op", pa.string()),
                pa.field("a", pa.int32()),
                pa.field("b", pa.string()),
                pa.field("_tm_old_a", pa.int32()),
                pa.field("_tm_old_b", pa.string()),
            ]
        ),
    )


def _counts(changes: pa.Table, floor: BinlogPosition) -> dict[tuple[object, ...], int]:
    rows, signs = signed_rows(changes, ["a", "b"], SCHEMA, floor)
    return {
        tuple(rows.slice(n.index, 1).to_pylist()[0].values()): n.count
        for n in net_rows(rows, signs)
    }


def test_each_change_after_the_floor_counts_once() -> None:
    changes = _changes(
        [
            (1, 100, 0, "I", 1, "x", None, None),  # at or before the floor: already applied
            (1, 200, 0, "I", 1, "x", None, None),
            (1, 200, 1, "I", 1, "x", None, None),  # the same event's next row: a second row
            (1, 300, 0, "U", 2, "y", 1, "x"),  # removes one (1, x), adds (2, y)
            (1, 300, 0, "U", 2, "y", 1, "x"),  # read again by a resumed capture: counts once
            (2, 50, 0, "D", 3, "z", 3, "z"),  # a later file
            (1, 400, 0, "D", 2, "y", 2, "y"),
        ]
    )
    assert _counts(changes, BinlogPosition("binlog.000001", 100)) == {
        (1, "x"): 1,
        (3, "z"): -1,
    }
    assert _counts(changes, BinlogPosition("binlog.000001", 250)) == {
        (1, "x"): -1,
        (3, "z"): -1,
    }


def test_rows_whose_hashes_collide_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """`net_rows` groups by hash, then by value: rows forced into one hash group stay apart."""
    rows = pa.table({"a": pa.array([1, 2, 1], pa.int32()), "b": ["x", "x", "x"]}, schema=SCHEMA)
    monkeypatch.setattr(multiset, "row_hashes", lambda t: np.zeros(t.num_rows, np.uint64))
    nets = net_rows(rows, np.array([1, 1, 1]))
    assert sorted((rows.slice(n.index, 1).to_pylist()[0]["a"], n.count) for n in nets) == [
        (1, 2),
        (2, 1),
    ]
