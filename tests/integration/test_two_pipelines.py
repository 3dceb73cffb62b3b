"""Two pipelines given the same table and lake (a config copied, its pipeline renamed or its
state store moved): each table belongs in one pipeline's output, which no config check can see
across configs, so each run checks the version it finds in the lake (docs/operations.md).

Before, a snapshot of the second pipeline that finished after the first had published a later
version put the table back in time, and the first pipeline's next run applied the changes from
its own later position to that older version: a wrong table with exit 0 (the changes between
the two positions were lost). Now that publish fails the table, naming the likely cause, and a
run that goes on from a version another writer published says so. Real MariaDB, `tidemark run`
processes (one killed at a failpoint)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config

pytestmark = pytest.mark.integration

DB = "two_pipes"
TABLE = f"{DB}.t"


def _configs(mariadb: LocalMariaDB, tmp_path: Path) -> tuple[Path, Path]:
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    mariadb.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        "INSERT INTO t SELECT seq, seq FROM seq_1_to_100",
        database=DB,
    )
    first = pipeline_config(tmp_path, mariadb, [{"name": TABLE}], "first")
    second = copy.deepcopy(first)
    second["pipeline"] = "second"
    second["state"] = {"url": f"sqlite:///{tmp_path / 'second.db'}"}
    return write_config(tmp_path / "first.yaml", first), write_config(
        tmp_path / "second.yaml", second
    )


def _run(config: Path, failpoint: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_FAILPOINT"}
    if failpoint:
        env["TIDEMARK_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _current(tmp_path: Path) -> dict[str, object]:
    return dict(
        json.loads((tmp_path / "lake" / DB / "t" / "_tidemark" / "current.json").read_text())
    )


def test_a_version_older_than_the_lakes_is_not_published(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    first, second = _configs(mariadb, tmp_path)
    assert _run(first).returncode == 0
    mariadb.execute("UPDATE t SET v = -1 WHERE id < 10", database=DB)
    # the second pipeline's snapshot reads and reconciles, then dies before publishing
    assert _run(second, "reconcile.table_done:1").returncode != 0
    mariadb.execute("UPDATE t SET v = -2 WHERE id > 90", database=DB)
    assert _run(first).returncode == 0  # a later version: the table with both changes
    later = _current(tmp_path)

    resumed = _run(second)

    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "later than this run's" in resumed.stderr
    assert "is another pipeline writing this table?" in resumed.stderr
    assert _current(tmp_path) == later, "the lake was taken back"
    mariadb.execute("UPDATE t SET v = -3 WHERE id = 50", database=DB)
    assert _run(first).returncode == 0
    assert_lake_equals_source(first, mariadb, [TABLE])


def test_a_later_version_another_pipeline_published_is_gone_on_from_with_a_warning(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    first, second = _configs(mariadb, tmp_path)
    assert _run(first).returncode == 0
    mariadb.execute("UPDATE t SET v = -1 WHERE id < 10", database=DB)
    assert _run(second).returncode == 0  # a snapshot: a later version, of a run not the first's
    mariadb.execute("UPDATE t SET v = -2 WHERE id > 90", database=DB)

    went_on = _run(first)

    assert went_on.returncode == 0, went_on.stderr[-3000:]
    assert "is another pipeline writing this table?" in went_on.stdout + went_on.stderr
    assert "where this pipeline's version goes on: applied on it" in went_on.stdout + went_on.stderr
    assert_lake_equals_source(first, mariadb, [TABLE])
