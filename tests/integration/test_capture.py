"""capture_changes against a real MariaDB: segments, per-table starts, checkpoints, and
resume after an interruption (exception, failed checkpoint, SIGKILL) with every change once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.binlog.pool import DecodeWorkerLost
from orchestrator.config import PipelineConfig, parse_config
from orchestrator.lake import storage
from orchestrator.pipeline.capture import pooled
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes
from orchestrator.pipeline.segments import read_changes, segment_paths, taken
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import StateStore
from tests.conftest import fresh_database, pipeline_config, write_config
from tests.integration.test_binlog import position, table_info

pytestmark = pytest.mark.integration


def make_config(tmp_path: Path, server: LocalMariaDB, names: list[str]) -> PipelineConfig:
    return parse_config(pipeline_config(tmp_path, server, [{"name": n} for n in names], name="cap"))


def rows_of(config: PipelineConfig, run_id: str, table: str) -> list[dict[str, Any]]:
    with StateStore(config.state.url) as store:
        return read_changes(store, config.staging_path, run_id, table).to_pylist()


def segment_numbers(
    config: PipelineConfig, run_id: str, tables: list[str], *, durable: bool = True
) -> list[int]:
    """The numbers of the tables' durable segments (as the checkpoint names them), or of every
    segment file on disk (those of attempts that never checkpointed them too)."""
    if durable:
        with StateStore(config.state.url) as store:
            paths = [
                p for t in tables for p in segment_paths(store, config.staging_path, run_id, t)
            ]
    else:
        paths = [
            str(p)
            for t in tables
            for p in (Path(config.staging_path) / run_id / "changes" / t).glob("seg-*")
        ]
    return sorted(int(Path(p).name[4:10]) for p in paths)


# --------------------------------------------------------------------------- segments


def test_segments_hold_ops_keys_and_positions(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    fresh_database(
        mariadb,
        "cap_seg",
        "CREATE TABLE cap_seg.t (a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b))",
        "CREATE TABLE cap_seg.u (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE cap_seg.x (id INT PRIMARY KEY)",
    )
    p0 = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_seg.t VALUES (1, 'x', 1), (2, 'y', 2)",
        "INSERT INTO cap_seg.u VALUES (1, 1)",
        "INSERT INTO cap_seg.x VALUES (1)",
    )
    p1 = position(mariadb)  # u's start: its first insert is already in its snapshot
    mariadb.execute(
        "UPDATE cap_seg.t SET v = 10 WHERE a = 1",
        "UPDATE cap_seg.t SET b = 'z' WHERE a = 2",
        "INSERT INTO cap_seg.u VALUES (2, 2)",
        "DELETE FROM cap_seg.u WHERE id = 1",
        "DELETE FROM cap_seg.t WHERE a = 1",
        "INSERT INTO cap_seg.x VALUES (2)",
    )
    stop = position(mariadb)
    config = make_config(tmp_path, mariadb, ["cap_seg.t", "cap_seg.u"])
    tables = {
        "cap_seg.t": CaptureTable(table_info(mariadb, "cap_seg.t"), ("a", "b"), p0),
        "cap_seg.u": CaptureTable(table_info(mariadb, "cap_seg.u"), ("id",), p1),
    }
    store = StateStore(config.state.url)
    run_id = store.create_run("cap", {}).run_id
    calls: list[int] = []

    result = capture_changes(
        config, store, run_id, tables, stop, batch_rows=2, progress=calls.append
    )

    t = read_changes(store, config.staging_path, run_id, "cap_seg.t")
    assert t.column_names == [
        "_tm_file",
        "_tm_pos",
        "_tm_row",
        "_tm_op",
        "a",
        "b",
        "v",
        "_tm_old_a",
        "_tm_old_b",
    ]
    got = [
        (r["_tm_op"], r["a"], r["b"], r["v"], r["_tm_old_a"], r["_tm_old_b"]) for r in t.to_pylist()
    ]
    assert got == [
        ("I", 1, "x", 1, None, None),
        ("I", 2, "y", 2, None, None),
        ("U", 1, "x", 10, 1, "x"),
        ("U", 2, "z", 2, 2, "y"),
        ("D", 1, "x", 10, 1, "x"),
    ]  # a delete carries its before image
    keys = [(r["_tm_file"], r["_tm_pos"], r["_tm_row"]) for r in t.to_pylist()]
    assert keys == sorted(keys) and keys[0][1] == keys[1][1] and [k[2] for k in keys[:2]] == [0, 1]
    assert all(p0.key < k <= stop.key for k in keys)
    u = rows_of(config, run_id, "cap_seg.u")
    assert [(r["_tm_op"], r["id"], r["v"], r["_tm_old_id"]) for r in u] == [
        ("I", 2, 2, None),
        ("D", 1, 1, 1),
    ]
    numbers = segment_numbers(config, run_id, ["cap_seg.t", "cap_seg.u"])
    assert numbers == list(range(1, result.segments + 1)) and result.segments > 2
    assert result.rows == {"cap_seg.t": 5, "cap_seg.u": 2} and result.end == stop
    assert sum(calls) == 7
    saved = store.capture_checkpoint(run_id)
    assert saved is not None and saved.pop("owners")[0][1] == 1  # one attempt wrote them all
    assert saved == {"position": stop.to_json(), "segments": result.segments, "rows": 7}
    assert not [p for p in Path(config.staging_path).rglob("*") if p.name.endswith(".tmp")]
    # Every segment written is kept for this process's reconcile, as the file holds it.
    for table in ("cap_seg.t", "cap_seg.u"):
        for uri in segment_paths(store, config.staging_path, run_id, table):
            kept = taken(storage.filesystem(uri)[1])
            assert kept is not None and kept.equals(pq.read_table(uri))

    again = capture_changes(config, store, run_id, tables, stop, batch_rows=2)
    assert again.resumed and again.rows == result.rows and again.segments == result.segments
    assert segment_numbers(config, run_id, ["cap_seg.t", "cap_seg.u"]) == numbers


# --------------------------------------------------------------------------- resume

RESUME_TABLES = ["cap_res.t", "cap_res.u"]


def make_workload(server: LocalMariaDB) -> tuple[BinlogPosition, BinlogPosition, int]:
    """Many small transactions, a big one, updates with key changes, deletes, a rotation.

    Returns the start, the stop and the number of changes of the captured tables.
    """
    fresh_database(
        server,
        "cap_res",
        "CREATE TABLE cap_res.t (id INT PRIMARY KEY, v VARCHAR(20))",
        "CREATE TABLE cap_res.u (id INT PRIMARY KEY, n INT)",
        "CREATE TABLE cap_res.noise (id INT PRIMARY KEY)",
    )
    start = position(server)
    statements = []
    for i in range(60):
        statements.append(f"INSERT INTO cap_res.t VALUES ({i}, 'v{i}')")
        if i % 3 == 0:
            statements.append(f"INSERT INTO cap_res.u VALUES ({i}, {i})")
        if i % 5 == 0:
            statements.append(f"INSERT INTO cap_res.noise VALUES ({i})")
    statements.append("INSERT INTO cap_res.t SELECT seq, CONCAT('big', seq) FROM seq_100_to_139")
    statements.append("FLUSH BINARY LOGS")
    statements += [f"UPDATE cap_res.t SET v = 'w{i}' WHERE id = {i}" for i in range(0, 60, 2)]
    statements += [f"UPDATE cap_res.t SET id = {i + 1000} WHERE id = {i}" for i in range(1, 20, 2)]
    statements += [f"DELETE FROM cap_res.u WHERE id = {i}" for i in range(0, 60, 6)]
    statements.append("UPDATE cap_res.u SET n = n + 1")
    server.execute(*statements, database="cap_res")
    stop = position(server)
    changes = 60 + 20 + 40 + 30 + 10 + 10 + 10
    return start, stop, changes


def resume_tables(server: LocalMariaDB, start: BinlogPosition) -> dict[str, CaptureTable]:
    return {name: CaptureTable(table_info(server, name), ("id",), start) for name in RESUME_TABLES}


def all_changes(config: PipelineConfig, run_id: str) -> list[tuple[Any, ...]]:
    out = []
    for table in RESUME_TABLES:
        out += [(table, *r.values()) for r in rows_of(config, run_id, table)]
    return sorted(out, key=lambda r: (r[1], r[2], r[3]))


class FailingStore(StateStore):
    """A state store whose ``fail_at``-th checkpoint save fails, as a crash just before it."""

    def __init__(self, url: str, fail_at: int) -> None:
        super().__init__(url)
        self.saves = 0
        self.fail_at = fail_at

    def save_capture_checkpoint(
        self,
        run_id: str,
        position: dict[str, Any],
        segments: int,
        rows: int,
        owners: list[list[Any]] | None = None,
    ) -> None:
        self.saves += 1
        if self.saves == self.fail_at:
            raise RuntimeError("crash before the checkpoint")
        super().save_capture_checkpoint(run_id, position, segments, rows, owners)


@pytest.fixture(scope="module")
def workload(mariadb: LocalMariaDB) -> tuple[BinlogPosition, BinlogPosition, int]:
    return make_workload(mariadb)


@pytest.fixture
def reference(
    tmp_path: Path, mariadb: LocalMariaDB, workload: tuple[BinlogPosition, BinlogPosition, int]
) -> tuple[PipelineConfig, StateStore, list[tuple[Any, ...]]]:
    """An uninterrupted capture of the workload, and the store the test's own run goes in."""
    start, stop, count = workload
    config = make_config(tmp_path, mariadb, RESUME_TABLES)
    store = StateStore(config.state.url)
    run_id = store.create_run("cap", {}).run_id
    capture_changes(config, store, run_id, resume_tables(mariadb, start), stop)
    expected = all_changes(config, run_id)
    assert len(expected) == count
    assert len({row[1] for row in expected}) == 2  # _tm_file: the workload rotates the binlog
    return config, store, expected


def test_resume_after_interruptions_has_every_change_once(
    mariadb: LocalMariaDB,
    workload: tuple[BinlogPosition, BinlogPosition, int],
    reference: tuple[PipelineConfig, StateStore, list[tuple[Any, ...]]],
) -> None:
    start, stop, _ = workload
    config, store, expected = reference
    tables = resume_tables(mariadb, start)
    run_id = store.create_run("cap", {}).run_id

    calls: list[int] = []

    def interrupt_after_three(rows: int) -> None:  # called right after each checkpoint
        calls.append(rows)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture_changes(
            config, store, run_id, tables, stop, batch_rows=7, progress=interrupt_after_three
        )
    first = store.capture_checkpoint(run_id)
    assert first is not None and first["segments"] > 0
    assert BinlogPosition.from_json(first["position"]) < stop

    # Segments written, then the checkpoint fails: those segments are not durable.
    failing = FailingStore(config.state.url, fail_at=2)
    with pytest.raises(RuntimeError, match="crash before the checkpoint"):
        capture_changes(config, failing, run_id, tables, stop, batch_rows=7)
    second = store.capture_checkpoint(run_id)
    assert second is not None and second["segments"] > first["segments"]
    orphans = [
        n
        for n in segment_numbers(config, run_id, RESUME_TABLES, durable=False)
        if n > second["segments"]
    ]
    assert orphans and max(segment_numbers(config, run_id, RESUME_TABLES)) == second["segments"]

    result = capture_changes(config, store, run_id, tables, stop, batch_rows=7)
    assert result.resumed and result.end == stop
    assert all_changes(config, run_id) == expected  # every change once, none missing
    assert segment_numbers(config, run_id, RESUME_TABLES) == list(range(1, result.segments + 1))
    assert sum(result.rows.values()) == len(expected)
    # The failed attempt's segments are not deleted (a deleter with a stale view of the checkpoint
    # could hit the new owner's), only never read: the same numbers, its own tag.
    on_disk = segment_numbers(config, run_id, RESUME_TABLES, durable=False)
    assert len(on_disk) == result.segments + len(orphans)


def test_a_decoding_worker_killed_fails_the_capture_and_a_rerun_resumes(
    mariadb: LocalMariaDB,
    workload: tuple[BinlogPosition, BinlogPosition, int],
    reference: tuple[PipelineConfig, StateStore, list[tuple[Any, ...]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows events decoded in worker processes (forced for this small binlog, a job every few
    events): a worker killed at its third job (as an OOM kill would) fails the capture itself,
    not a table; the next capture resumes from the checkpoint with every change once."""
    start, stop, _ = workload
    config, store, expected = reference
    tables = resume_tables(mariadb, start)
    run_id = store.create_run("cap", {}).run_id
    monkeypatch.setattr(pooled, "JOB_BYTES", 256)
    monkeypatch.setenv("TIDEMARK_FAILPOINT", "decode.job:3")
    with pytest.raises(
        DecodeWorkerLost, match=r"decoding worker \(pid \d+\) ended with exit code -9"
    ):
        capture_changes(config, store, run_id, tables, stop, batch_rows=7, pool_bytes=0)
    monkeypatch.delenv("TIDEMARK_FAILPOINT")
    result = capture_changes(config, store, run_id, tables, stop, batch_rows=7, pool_bytes=0)
    assert all_changes(config, run_id) == expected
    assert sum(result.rows.values()) == len(expected)


WORKER = """
import json, sys
from orchestrator.binlog.pool import DecodeWorkerLost
from orchestrator.pipeline.capture import pooled
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes
from orchestrator.config import load_config
from orchestrator.positions import BinlogPosition
from orchestrator.source.connection import Source
from orchestrator.state.store import StateStore

spec = json.load(open(sys.argv[1]))
config = load_config(spec["config"])
with Source.from_pipeline(config) as source:
    tables = {name: CaptureTable(source.table_info(name), ("id",), \
BinlogPosition.from_json(spec["start"]))
              for name in spec["tables"]}
capture_changes(config, StateStore(config.state.url), spec["run_id"], tables,
                BinlogPosition.from_json(spec["stop"]), batch_rows=spec["batch_rows"])
"""


def test_sigkill_mid_capture_then_resume(
    tmp_path: Path,
    mariadb: LocalMariaDB,
    workload: tuple[BinlogPosition, BinlogPosition, int],
    reference: tuple[PipelineConfig, StateStore, list[tuple[Any, ...]]],
) -> None:
    start, stop, _ = workload
    config, store, expected = reference
    run_id = store.create_run("cap", {}).run_id
    config_file = write_config(
        tmp_path / "cap.yaml",
        pipeline_config(tmp_path, mariadb, [{"name": n} for n in RESUME_TABLES], name="cap"),
    )
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "config": str(config_file),
                "run_id": run_id,
                "tables": RESUME_TABLES,
                "start": start.to_json(),
                "stop": stop.to_json(),
                "batch_rows": 9,
            }
        )
    )
    env = {**os.environ, "TIDEMARK_FAILPOINT": "capture.checkpoint:4"}
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert worker.returncode == -signal.SIGKILL, worker.stderr[-2000:]
    killed_at = store.capture_checkpoint(run_id)
    assert killed_at is not None and BinlogPosition.from_json(killed_at["position"]) < stop

    result = capture_changes(
        config, store, run_id, resume_tables(mariadb, start), stop, batch_rows=9
    )
    assert result.resumed
    assert all_changes(config, run_id) == expected


def test_nothing_to_capture_still_checkpoints(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    fresh_database(mariadb, "cap_empty", "CREATE TABLE cap_empty.t (id INT PRIMARY KEY)")
    here = position(mariadb)
    config = make_config(tmp_path, mariadb, ["cap_empty.t"])
    store = StateStore(config.state.url)
    run_id = store.create_run("cap", {}).run_id
    tables = {"cap_empty.t": CaptureTable(table_info(mariadb, "cap_empty.t"), ("id",), here)}
    result = capture_changes(config, store, run_id, tables, here)
    assert result.rows == {"cap_empty.t": 0} and result.segments == 0
    assert store.capture_checkpoint(run_id) == {
        "position": here.to_json(),
        "segments": 0,
        "rows": 0,
        "owners": [],
    }
    assert read_changes(store, config.staging_path, run_id, "cap_empty.t").num_rows == 0


def test_segment_files_are_plain_parquet(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    fresh_database(
        mariadb, "cap_pq", "CREATE TABLE cap_pq.t (id BIGINT UNSIGNED PRIMARY KEY, t TIME(6))"
    )
    start = position(mariadb)
    mariadb.execute("INSERT INTO cap_pq.t VALUES (18446744073709551615, '-838:59:59.000001')")
    stop = position(mariadb)
    data = pipeline_config(tmp_path, mariadb, [{"name": "cap_pq.t"}], name="cap")
    data["output"]["staging"] = f"file://{tmp_path}/staging"  # a URI, not a plain path
    config = parse_config(data)
    store = StateStore(config.state.url)
    run_id = store.create_run("cap", {}).run_id
    tables = {"cap_pq.t": CaptureTable(table_info(mariadb, "cap_pq.t"), ("id",), start)}
    capture_changes(config, store, run_id, tables, stop)
    [path] = segment_paths(store, config.staging_path, run_id, "cap_pq.t")
    directory = re.escape(f"file://{tmp_path}/staging/{run_id}/changes/cap_pq.t/")
    assert re.fullmatch(directory + r"seg-000001-[0-9a-f]{8}\.parquet", path)
    table = pq.read_table(path.removeprefix("file://"))
    assert str(table.schema.field("id").type) == "decimal128(20, 0)"
    assert str(table.schema.field("t").type) == "int64"
    assert table.column("t").to_pylist() == [-3_020_399_000_001]
