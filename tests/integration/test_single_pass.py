"""A snapshot reads each row once: the chunk files the read writes become the first version's files.

The steps run one by one against a private MariaDB, with changes made to some chunks' key
ranges after their read: the published version keeps every other chunk file as the read
wrote it (the same inode: moved, not rewritten), rewrites exactly the changed chunks, and
equals the source. A text key whose collation orders otherwise than the files (their order
is UTF-8 bytes) makes the chunk ranges overlap: Spark then reconciles the whole table, and
the result equals the source as well.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app import steps
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.lake import storage
from orchestrator.pipeline.context import table_dir
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, load_pipeline
from tests.iceberg_readers import assert_readers_equal_source

pytestmark = pytest.mark.integration


def _run_steps(config: Any, spark: Any, between: Any) -> dict[str, dict[int, int]]:
    """plan, read every batch, ``between()``, capture, reconcile, publish; returns per table
    the inode of each chunk file as the read left it, by chunk index."""
    handle = steps.plan(config, holder="test", tables=None)
    for batch in handle.batches:
        steps.read_batch(config, handle.run_id, batch.batch, spark=spark, holder="test")
    between()
    steps.capture(config, handle.run_id)
    store = StateStore(config.state.url)
    try:
        inodes: dict[str, dict[int, int]] = {}
        for chunk in store.chunks(handle.run_id):
            for uri in storage.list_files(chunk.path or "", suffix=".parquet"):
                if storage.parquet_rows(uri):
                    inodes.setdefault(chunk.table, {})[chunk.index] = os.stat(uri).st_ino
    finally:
        store.close()
    steps.reconcile(config, handle.run_id, spark=spark)
    steps.publish(config, handle.run_id, holder="test")
    return inodes


def test_unchanged_chunk_files_become_the_version_as_read(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "single_pass"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(30) NOT NULL, d DATE)",
        f"INSERT INTO {db}.t SELECT seq, CONCAT('row ', seq), '2024-01-01' + INTERVAL seq DAY"
        f" FROM seq_1_to_5000",
        database=db,
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.t"}],
        name="single_pass",
        defaults={"chunk_size": 500, "batch_chunks": 4, "read_margin_seconds": 0.0},
    )

    def change() -> None:  # after the reads: chunk 2 (1001..1500), chunk 7 (3501..4000), the tail
        mariadb.execute(
            f"UPDATE {db}.t SET v = 'changed' WHERE id IN (1200, 1300)",
            f"DELETE FROM {db}.t WHERE id = 3600",
            f"UPDATE {db}.t SET id = 9000 WHERE id = 3700",
            f"INSERT INTO {db}.t VALUES (7000, 'tail', NULL)",
        )

    inodes = _run_steps(config, spark, change)[f"{db}.t"]
    assert len(inodes) == 10
    assert_lake_equals_source(config, mariadb, [f"{db}.t"])
    assert_readers_equal_source(config, [f"{db}.t"])
    tdir = Path(table_dir(config, f"{db}.t"))
    manifest = json.loads((tdir / "_tidemark" / "current.json").read_text())
    published = {os.stat(tdir / f).st_ino for f in manifest["files"]}
    kept = {i for i, inode in inodes.items() if inode in published}
    assert kept == set(range(10)) - {2, 7}, "every chunk file without a change is published as read"
    assert len(manifest["files"]) == 11  # ten chunks and a new tail file
    assert manifest["version"] == 1 and manifest["rows"] == 5000


def test_overlapping_text_chunks_are_reconciled_whole(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "single_pass_ci"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(
        f"CREATE TABLE {db}.tags (tag VARCHAR(40) NOT NULL PRIMARY KEY, n INT NOT NULL)"
        " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci",
        f"INSERT INTO {db}.tags SELECT CONCAT(ELT(seq % 2 + 1, 'Tag', 'tag'),"
        " LPAD(seq, 5, '0')), seq"
        f" FROM seq_1_to_3000",
        database=db,
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.tags"}],
        name="single_pass_ci",
        defaults={"chunk_size": 500, "batch_chunks": 6, "read_margin_seconds": 0.0},
    )
    caplog.set_level(logging.INFO, logger="orchestrator.pipeline.reconcile.rewrite")
    _run_steps(
        config, spark, lambda: mariadb.execute(f"UPDATE {db}.tags SET n = -n WHERE n % 100 = 0")
    )
    assert any("Spark reconciles the whole table" in r.getMessage() for r in caplog.records)
    assert_lake_equals_source(config, mariadb, [f"{db}.tags"])
    assert_readers_equal_source(config, [f"{db}.tags"])
