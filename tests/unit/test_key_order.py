"""`jdbc.all_ascending`: the check that lets a chunk written in the server's order stand."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline.read.jdbc import all_ascending

INT64 = pa.int64()


def files(tmp_path: Path, *columns: list[Any], kind: pa.DataType = INT64) -> str:
    for n, values in enumerate(columns):
        pq.write_table(pa.table({"id": pa.array(values, kind)}), tmp_path / f"part-{n:05d}.parquet")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("columns", "kind", "expected"),
    [
        ([[1, 2, 3], [10, 11]], pa.int64(), True),
        ([[], [5]], pa.int64(), True),  # an empty partition's file
        ([[-128, 0, 127]], pa.int8(), True),
        ([[1, 3, 2]], pa.int64(), False),
        ([[1, 2, 2, 3]], pa.int64(), False),  # a duplicate: not a key's order
        ([[1, None, 3]], pa.int64(), False),
        ([[Decimal("-1.50"), Decimal("-0.25"), Decimal("3.00")]], pa.decimal128(10, 2), True),
        ([[Decimal(2**63 - 1), Decimal(2**63), Decimal(2**64 - 1)]], pa.decimal128(20, 0), True),
        ([[Decimal(2**63), Decimal(2**63 - 1)]], pa.decimal128(20, 0), False),
    ],
)
def test_ascending_files(
    tmp_path: Path, columns: list[list[Any]], kind: pa.DataType, expected: bool
) -> None:
    assert all_ascending(files(tmp_path, *columns, kind=kind), "id") is expected


def test_each_file_is_checked(tmp_path: Path) -> None:
    """Files are checked one by one (a chunk's partition is one file): the second fails."""
    assert not all_ascending(files(tmp_path, [1, 2], [9, 8]), "id")
