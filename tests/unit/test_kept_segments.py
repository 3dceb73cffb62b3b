"""`orchestrator.pipeline.segments.keep`: the segments a process wrote are read back from memory
by its reconcile (`orchestrator.pipeline.reconcile.local.read_changes`), once, while the files
are there with the same schema; past `KEEP_BYTES`, or after `forget`, from their files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline import segments
from orchestrator.pipeline.reconcile.local import read_changes
from orchestrator.pipeline.segments import forget, taken, write_segment


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    forget()
    yield
    forget()


def _segment(tmp_path: Path, number: int, rows: int) -> tuple[str, pa.Table]:
    table = pa.table(
        {"_tm_op": pa.array(["U"] * rows), "id": pa.array(range(number, number + rows), pa.int64())}
    )
    path = str(tmp_path / "changes" / "db.t" / f"seg-{number:06d}-a1b2c3d4.parquet")
    write_segment(pafs.LocalFileSystem(), path, table)
    return path, table


def test_a_written_segment_is_read_back_from_memory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, one = _segment(tmp_path, 1, 3)
    second, two = _segment(tmp_path, 2, 2)
    decoded: list[pa.Table] = []
    real = pq.ParquetFile.read

    def read(*args: Any, **kwargs: Any) -> pa.Table:
        decoded.append(real(*args, **kwargs))
        return decoded[-1]

    monkeypatch.setattr(pq.ParquetFile, "read", read)
    got = read_changes([first, second])
    assert got is not None and got.equals(pa.concat_tables([one, two]))
    assert decoded == []  # no segment decoded from its file
    assert taken(first) is None and taken(second) is None  # taken once
    again = read_changes([first, second])  # a retry reads the files: the same rows
    assert again is not None and again.equals(got) and len(decoded) == 2


def test_a_file_that_differs_is_read_from_the_file(tmp_path: Path) -> None:
    path, _ = _segment(tmp_path, 1, 3)
    other = pa.table({"_tm_op": pa.array(["D"]), "id": pa.array(["not an integer"])})
    pq.write_table(other, path)  # replaced behind the process's back, another schema
    got = read_changes([path])
    assert got is not None and got.equals(other)
    Path(path).unlink()
    _segment(tmp_path, 1, 3)
    Path(path).unlink()
    with pytest.raises(FileNotFoundError):  # a kept segment whose file is gone is not read
        read_changes([path])


def test_only_kept_bytes_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, one = _segment(tmp_path, 1, 100)
    monkeypatch.setattr(segments, "KEEP_BYTES", one.nbytes + 10)
    forget()
    first, one = _segment(tmp_path, 1, 100)
    second, two = _segment(tmp_path, 2, 100)  # over the bound: not kept
    assert taken(second) is None
    got = read_changes([first, second])
    assert got is not None and got.equals(pa.concat_tables([one, two]))
    third, _ = _segment(tmp_path, 3, 100)  # the first was taken: room for this one
    assert taken(third) is not None
    first, one = _segment(tmp_path, 1, 100)
    again, other = _segment(tmp_path, 1, 50)  # the same path written again: its new table
    assert again == first and taken(first) is other
    _segment(tmp_path, 3, 1)
    forget()
    assert taken(str(tmp_path / "changes" / "db.t" / "seg-000003-a1b2c3d4.parquet")) is None
