"""A process that runs again and again (`run --every`) keeps no more open files per run."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline
from tests.integration.conftest import run_plain

pytestmark = pytest.mark.integration


def _open(path: Path) -> int:
    """This process's open files of ``path`` and its WAL."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return count


def test_runs_that_publish_keep_no_more_open_files(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """Each run that published opened the SQL catalog on the SQLite state file, and SQLite kept
    each closed connection's file open while the store's connection held its lock: one more
    open file per run (the test process passed 1024 with them). The run's end now closes its
    catalogs' connections."""
    db = "open_files"
    fresh_database(
        mariadb,
        db,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        "INSERT INTO t SELECT seq, seq FROM seq_1_to_50",
    )
    config = load_pipeline(tmp_path, mariadb, [{"name": f"{db}.t"}], name=db)
    state = tmp_path / "state.db"
    run_plain(config)
    after_first = _open(state)
    for n in range(4):
        mariadb.execute(f"UPDATE t SET v = v + 1 WHERE id = {n + 1}", database=db)
        run_plain(config)
    assert _open(state) <= after_first
    assert_lake_equals_source(config, mariadb, [f"{db}.t"])
