"""`orchestrator.pipeline.segments.durable`: a run's durable change segments and their bytes per
table from one listing of its staging; the reconcile chooses its engine from those bytes
(`orchestrator.pipeline.reconcile.rewrite.Target.changes_bytes`) without asking the store for
each file again (two requests a file on an object store)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from orchestrator.lake import storage
from orchestrator.pipeline.reconcile import rewrite
from orchestrator.pipeline.segments import durable, durable_segments, write_segment
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.state.store import StateStore

WRITER, STALE = "a1b2c3d4", "e5f6a7b8"


def _write(staging: Path, run_id: str, table: str, number: int, rows: int, writer: str) -> Path:
    path = staging / run_id / "changes" / table / f"seg-{number:06d}-{writer}.parquet"
    data = pa.table({"_tm_op": ["U"] * rows, "id": pa.array(range(rows), pa.int64())})
    write_segment(pafs.LocalFileSystem(), str(path), data)
    return path


def test_the_listing_gives_each_tables_durable_files_and_their_bytes(tmp_path: Path) -> None:
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        run_id = store.create_run("p", {}).run_id
        staging = tmp_path / "staging"
        a1 = _write(staging, run_id, "db.a", 1, 10, WRITER)
        b2 = _write(staging, run_id, "db.b", 2, 1000, WRITER)
        a3 = _write(staging, run_id, "db.a", 3, 5000, WRITER)
        _write(staging, run_id, "db.b", 3, 7, STALE)  # another attempt's: never durable
        _write(staging, run_id, "db.a", 4, 3, WRITER)  # past the checkpoint: not durable yet
        store.save_capture_checkpoint(run_id, {}, 3, 6010, [[WRITER, 1]])

        found = durable(store, str(staging), run_id)

        assert found.files == {
            "db.a": [str(a1), str(a3)],
            "db.b": [str(b2)],
        }
        assert found.sizes == {
            "db.a": a1.stat().st_size + a3.stat().st_size,
            "db.b": b2.stat().st_size,
        }
        assert found.sizes == {t: storage.tree_bytes(f) for t, f in found.files.items()}
        assert durable_segments(store, str(staging), run_id) == found.files
    finally:
        store.close()


def test_no_checkpoint_no_segments(tmp_path: Path) -> None:
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        run_id = store.create_run("p", {}).run_id
        _write(tmp_path, run_id, "db.a", 1, 10, WRITER)
        found = durable(store, str(tmp_path), run_id)
        assert (found.files, found.sizes) == ({}, {})
    finally:
        store.close()


@pytest.mark.parametrize(
    ("known", "engine"),
    [(rewrite.LOCAL_CHANGES_BYTES + 1, "spark"), (rewrite.LOCAL_CHANGES_BYTES, "local")],
)
def test_the_engine_is_chosen_from_known_bytes_without_asking_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, known: int, engine: str
) -> None:
    segment = _write(tmp_path, "r", "db.a", 1, 10, WRITER)  # a few hundred bytes
    asked: list[object] = []
    monkeypatch.setattr(storage, "tree_bytes", lambda uris: asked.append(uris) or 0)
    info = TableInfo("db", "a", (ColumnInfo("id", "bigint", "bigint", False),), ("id",), (), 10)
    target = rewrite.Target(info, ("id",), lambda: pa.schema([]), str(tmp_path / "out"))

    assert rewrite._choose(replace(target, changes_bytes=known), [str(segment)]) == engine
    assert asked == []
    assert rewrite._choose(target, [str(segment)]) == "local"  # unknown: asked of the store
    assert asked == [[str(segment)]]
