"""The row hash of tables without a key (`orchestrator.lake.rowhash`) and their hash-sorted files
(`orchestrator.lake.hashfiles`): identical rows hash alike whatever the Arrow layout of their
values, the text polynomial equals its definition, and the files cut by hash hold every row once,
one hash range each, rows of one hash in one file."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.lake import hashfiles, rowhash
from orchestrator.lake.hashfiles import HashBuckets, bucket_count
from orchestrator.lake.rowhash import cell_values, row_hashes, row_identity

#: One column of every Arrow type the mapping publishes (docs/types.md), with a NULL.
PUBLISHED = {
    "i8": pa.array([-128, 127, None], pa.int8()),
    "i16": pa.array([-32768, 2155, None], pa.int16()),
    "i32": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
    "i64": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
    "u64": pa.array([Decimal(2**64 - 1), Decimal(0), None], pa.decimal128(20, 0)),
    "dec": pa.array([Decimal("-99999999.99"), Decimal("0.01"), None], pa.decimal128(10, 2)),
    "f32": pa.array([0.1, -3.4028235e38, None], pa.float32()),
    "f64": pa.array([1 / 3, -5e-324, None], pa.float64()),
    "bool": pa.array([True, False, None]),
    "text": pa.array(["it's", "", None]),
    "bin": pa.array([b"\x00\xff", b"", None]),
    "date": pa.array([dt.date(1000, 1, 1), dt.date(9999, 12, 31), None]),
    "wall": pa.array([dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None]),
    "instant": pa.array(
        [
            dt.datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=dt.UTC),
            dt.datetime(2038, 1, 19, tzinfo=dt.UTC),
            None,
        ],
        pa.timestamp("us", "UTC"),
    ),
}


def _reference_text(value: bytes) -> int:
    """`rowhash._bytes_values`'s definition, one byte at a time."""
    total = 0
    for k, byte in enumerate(value):
        total = (total + (byte + 1) * pow(rowhash._BYTE, k, 1 << 64)) % (1 << 64)
    return total ^ (len(value) * int(rowhash._LENGTH) % (1 << 64))


def test_every_published_type_hashes_and_null_is_a_value_of_its_own() -> None:
    table = pa.table(PUBLISHED)
    hashes = row_hashes(table)
    assert len(set(hashes.tolist())) == 3
    for name, column in PUBLISHED.items():
        cells = cell_values(column)
        assert cells[2] == rowhash._NULL, name
        assert cells[0] != cells[2] and cells[1] != cells[2], name


def test_the_same_values_hash_alike_however_arrow_holds_them() -> None:
    table = pa.table(PUBLISHED)
    whole = row_hashes(table)
    # sliced (an offset into the buffers), chunked, and rebuilt from Python values
    assert row_hashes(table.slice(1, 2)).tolist() == whole[1:].tolist()
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 2)])
    assert chunked.column(0).num_chunks == 2
    assert row_hashes(chunked).tolist() == whole.tolist()
    rebuilt = pa.Table.from_pylist(table.to_pylist(), schema=table.schema)
    assert row_hashes(rebuilt).tolist() == whole.tolist()


def test_a_float_is_taken_by_its_value() -> None:
    column = pa.array([0.0, -0.0, math.nan, float("nan") * -1, 1.0])
    cells = cell_values(column)
    assert cells[0] == cells[1] and cells[2] == cells[3] and cells[0] != cells[4]
    assert row_identity([-0.0, math.nan]) == row_identity([0.0, -math.nan])
    assert row_identity([1.0]) != row_identity([0.0])


def test_text_is_the_polynomial_of_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    values = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(300)]
    values += [b"", b"\x00", b"\x00\x00", b"a" * 100]
    expected = [_reference_text(v) for v in values]
    assert rowhash._values(pa.array(values, pa.binary())).tolist() == expected
    assert rowhash._values(pa.array(values, pa.large_binary())).tolist() == expected
    # slices of a few bytes, and cells longer than a slice (in pieces), give the same
    monkeypatch.setattr(rowhash, "_SLICE_BYTES", 16)
    assert rowhash._values(pa.array(values, pa.binary())).tolist() == expected


def test_columns_are_told_apart_by_where_the_bytes_are() -> None:
    split = pa.table({"a": ["ab", "a", ""], "b": ["c", "bc", "abc"]})
    assert len(set(row_hashes(split).tolist())) == 3
    swapped = pa.table({"a": pa.array([1, 2], pa.int32()), "b": pa.array([2, 1], pa.int32())})
    assert len(set(row_hashes(swapped).tolist())) == 2


def test_the_hash_does_not_change() -> None:
    """Manifests hold these hashes (`file_ranges`): a change of the scheme would look rows up in
    the wrong file."""
    table = pa.table(
        {
            "id": pa.array([1, None], pa.int64()),
            "v": ["Tidemark", None],
            "d": pa.array([Decimal("12.50"), None], pa.decimal128(10, 2)),
            "t": pa.array([dt.datetime(2024, 2, 29, 12), None], pa.timestamp("us")),
        }
    )
    assert [int(h) for h in row_hashes(table)] == [11577508938822097400, 1142849882493849770]


def test_files_cut_by_hash_hold_every_row_once_one_range_each(tmp_path: Path) -> None:
    rng = random.Random(3)
    schema = pa.schema([pa.field("a", pa.int32()), pa.field("s", pa.string())])
    rows = [(rng.randrange(50), rng.choice(["x", "y", None])) for _ in range(5000)]
    table = pa.Table.from_pylist([{"a": a, "s": s} for a, s in rows], schema=schema)
    for buckets, per_file in ((1, 400), (bucket_count(len(rows), 700), 700)):
        out = tmp_path / f"b{buckets}"
        with HashBuckets(schema, buckets, per_file) as spilled:
            for start in range(0, table.num_rows, 999):
                spilled.add(table.slice(start, 999))
            files = spilled.write(lambda n, out=out: str(out / f"h{n:05d}.parquet"), lambda: None)
        written = [pq.read_table(f["file"]) for f in files]
        found = [tuple(r.values()) for t in written for r in t.to_pylist()]
        assert sorted(found, key=repr) == sorted(rows, key=repr)
        bounds = []
        for entry, data in zip(files, written, strict=True):
            hashes = row_hashes(data)
            assert (hashes[1:] >= hashes[:-1]).all()
            assert entry["min_key"] == [int(hashes[0])] and entry["max_key"] == [int(hashes[-1])]
            assert entry["rows"] == data.num_rows
            bounds.append((int(hashes[0]), int(hashes[-1])))
        assert all(a[1] < b[0] for a, b in itertools.pairwise(bounds)), bounds


def test_a_bucket_far_over_its_size_is_cut_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row estimate far too low makes one bucket of the whole table: it is spilled again by the
    next bits of the hash rather than sorted in memory at once."""
    monkeypatch.setattr(hashfiles, "SPILL_ROWS", 100)
    schema = pa.schema([pa.field("a", pa.int64())])
    table = pa.table({"a": pa.array(range(3000), pa.int64())}, schema=schema)
    with HashBuckets(schema, 1, 100) as spilled:
        spilled.add(table)
        files = spilled.write(lambda n: str(tmp_path / f"h{n:05d}.parquet"), lambda: None)
    assert len(files) > 10 and max(f["rows"] for f in files) <= 200
    assert sum(f["rows"] for f in files) == 3000
