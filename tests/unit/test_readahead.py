"""Reading ahead (`orchestrator.lake.readahead`): a published table's files read while a run
starts, each handed to the rewrite once and as the file holds it, within a budget; a file the
rewrite waits for is never held back by the budget, and a file that does not read is left to
the rewrite's own read."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.lake import readahead
from orchestrator.lake.manifest import Manifest, manifest_json
from orchestrator.lake.readahead import ReadAhead
from orchestrator.lake.writer import read_published

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def published(tdir: Path, files: int, rows: int) -> list[str]:
    """A table dir whose current version is ``files`` files of ``rows`` rows each, in key order;
    their URIs."""
    (tdir / "data").mkdir(parents=True)
    (tdir / "_tidemark").mkdir()
    names = []
    for f in range(files):
        ids = list(range(f * rows, (f + 1) * rows))
        name = f"data/v000001-c{f:04d}.parquet"
        pq.write_table(
            pa.table({"id": ids, "v": [f"value {i}" for i in ids]}, schema=SCHEMA),
            tdir / name,
            row_group_size=rows // 3,
        )
        names.append(name)
    body = Manifest(
        table="db.t",
        version=1,
        files=names,
        position={"file": "binlog.000001", "pos": 4, "gtid_set": None},
        rows=files * rows,
        columns=[],
        chunk_key=["id"],
        published_at="2026-01-01T00:00:00Z",
        run_id="r1",
    )
    (tdir / "_tidemark" / "current.json").write_bytes(manifest_json(body))
    return [str(tdir / n) for n in names]


def decoded(uri: str) -> int:
    return pq.read_table(uri).nbytes


def room(uris: list[str]) -> int:
    """Room for the largest of the files: what it decodes to, or the reader's estimate of it
    (its row groups' uncompressed bytes), whichever is more."""
    meta = [pq.ParquetFile(u).metadata for u in uris]
    estimates = [sum(m.row_group(g).total_byte_size for g in range(m.num_row_groups)) for m in meta]
    return max(*estimates, *(decoded(u) for u in uris))


def settled(ahead: ReadAhead, files: int) -> None:
    """Wait until ``files`` files are read ahead, then a moment more: the reader has ended or
    waits for room."""
    for _ in range(3000):
        if ahead.read >= files:
            break
        time.sleep(0.01)
    ahead._thread.join(0.3)
    assert ahead.read == files


def test_files_are_read_ahead_and_taken_once_as_the_file_holds_them(tmp_path: Path) -> None:
    uris = published(tmp_path / "t", 4, 3000)
    ahead = ReadAhead([str(tmp_path / "t")], 1 << 30).begin()
    ahead._thread.join(30)
    assert not ahead._thread.is_alive() and ahead.read == 4
    assert ahead.held_bytes == sum(decoded(u) for u in uris)
    for uri in uris:
        batches = ahead.take(uri)
        assert batches is not None
        assert pa.Table.from_batches(batches).equals(pq.read_table(uri))
        assert ahead.take(uri) is None  # given once: the rewrite reads it only once
    assert ahead.held_bytes == 0 and ahead.taken == 4
    ahead.stop()


def test_the_last_file_is_read_first_and_the_budget_holds(tmp_path: Path) -> None:
    """New keys land in the last file: it is read first. Then the others in key order, never
    more held than the budget: the next file waits until the rewrite takes one."""
    uris = published(tmp_path / "t", 4, 3000)
    one = room(uris)
    ahead = ReadAhead([str(tmp_path / "t")], one + one // 2).begin()
    try:
        settled(ahead, 1)
        assert ahead._thread.is_alive(), "it waits for room"
        assert ahead.held_bytes == decoded(uris[-1])
        assert ahead.take(uris[-1]) is not None
        taken = ahead.take(uris[0])  # read once there was room
        assert taken is not None and pa.Table.from_batches(taken).equals(pq.read_table(uris[0]))
        assert ahead.held_bytes <= one + one // 2
    finally:
        ahead.stop()
    assert not ahead._thread.is_alive() and ahead.held_bytes == 0


def test_a_file_the_rewrite_waits_for_is_not_held_back_by_the_budget(tmp_path: Path) -> None:
    """The budget is full of a file the rewrite takes later (the last one) while the reader waits
    for room for the file the rewrite wants now: the rewrite reads that one itself at once
    (one writer thread taking files in order would otherwise wait for itself)."""
    uris = published(tmp_path / "t", 3, 3000)
    ahead = ReadAhead([str(tmp_path / "t")], room(uris) + 1).begin()
    try:
        settled(ahead, 1)
        assert ahead._thread.is_alive()
        got: list[object] = []
        taker = threading.Thread(target=lambda: got.append(ahead.take(uris[0])))
        taker.start()
        taker.join(30)
        assert not taker.is_alive() and got == [None]
        assert list(read_published(uris[0], SCHEMA))  # and reads it
    finally:
        ahead.stop()


def test_files_the_rewrite_does_not_read_are_dropped_and_not_read(tmp_path: Path) -> None:
    uris = published(tmp_path / "t", 4, 3000)
    ahead = ReadAhead([str(tmp_path / "t")], room(uris) * 2 + 1).begin()
    try:
        settled(ahead, 2)
        ahead.settle(uris, {uris[2]})  # the last and the first are held, the second waits
        ahead._thread.join(30)
        assert not ahead._thread.is_alive()
        assert ahead.read == 3  # the last, the first, then only the one wanted
        batches = ahead.take(uris[2])
        assert batches is not None and pa.Table.from_batches(batches).equals(pq.read_table(uris[2]))
        assert all(ahead.take(u) is None for u in uris) and ahead.held_bytes == 0
    finally:
        ahead.stop()


def test_a_file_that_does_not_read_is_left_to_the_rewrites_own_read(tmp_path: Path) -> None:
    uris = published(tmp_path / "t", 2, 1000)
    Path(uris[0]).write_bytes(b"not parquet at all")
    ahead = ReadAhead([str(tmp_path / "t"), str(tmp_path / "nothing here")], 1 << 30).begin()
    ahead._thread.join(30)
    try:
        assert ahead.take(uris[0]) is None and ahead.take(uris[1]) is not None
    finally:
        ahead.stop()
    with pytest.raises(pa.ArrowInvalid):  # the rewrite's read says what is wrong
        list(read_published(uris[0], SCHEMA))


def test_read_published_takes_the_files_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite reads a base file through `read_published`: with the file read ahead, its rows
    come from memory (the file is gone from disk here), in published types."""
    uris = published(tmp_path / "t", 2, 2000)
    ahead = ReadAhead([str(tmp_path / "t")], 1 << 30).begin()
    ahead._thread.join(30)
    monkeypatch.setattr(readahead, "_current", ahead)
    expected = pq.read_table(uris[0])
    Path(uris[0]).unlink()
    schema = pa.schema([("v", pa.large_string()), ("id", pa.int64())])
    rows = pa.Table.from_batches(list(read_published(uris[0], schema)))
    assert rows.schema == schema
    assert rows.column("id").equals(expected.column("id"))
    readahead.stop()
    assert readahead._current is None and ahead.held_bytes == 0
    assert readahead.take(uris[1]) is None  # none is running


def test_nothing_is_read_when_the_binlog_ends_where_the_versions_were_taken(
    tmp_path: Path,
) -> None:
    """A run with nothing to apply reads nothing ahead: the source's binlog ends at the position
    every table's version was taken at. Anywhere else, or when that is not known (the question
    fails), the files are read."""
    published(tmp_path / "a", 2, 500)
    published(tmp_path / "b", 1, 500)
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]

    def ended(at: tuple[str, int]) -> int:
        ahead = ReadAhead(dirs, 1 << 30, lambda: at).begin()
        ahead._thread.join(30)
        ahead.stop()
        return ahead.read

    def unknown() -> tuple[str, int]:
        raise OSError("connection refused")

    assert ended(("binlog.000001", 4)) == 0
    assert ended(("binlog.000001", 5)) == 3
    assert ended(("binlog.000002", 4)) == 3
    ahead = ReadAhead(dirs, 1 << 30, unknown).begin()
    ahead._thread.join(30)
    assert ahead.read == 3
    ahead.stop()
