"""Two pipelines given the same table and lake (a config copied, its pipeline renamed or its
state store moved): each table belongs in one pipeline's output, which no config check can see
across configs, so each run checks the version it finds in the lake (docs/operations.md).

Before, a snapshot of the second pipeline that finished after the first had published a later
version put the table back in time, and the first pipeline's next run applied the changes from
its own later position to that older version: a wrong table with exit 0 (the changes between
the two positions were lost). Now that publish fails the table, naming the likely cause, and a
run that goes on from a version another writer published says so.

Two pipelines with their own ``output.path`` but one Iceberg catalog (by default the state
store's database: one state store for both) share the catalog's name of a table they both
write. Before, the second one's versions were committed to the first one's Iceberg table, so a
catalog reader got either pipeline's rows; now `doctor` finds such a table before any read,
it fails alone at publish, naming the fix, and ``reset --purge-output`` leaves another
pipeline's catalog table alone. Real MariaDB, `tidemark`
processes (one killed at a failpoint), pyiceberg reading the catalog."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.lake.iceberg import open_catalog
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.test_resume import tidemark

pytestmark = pytest.mark.integration

DB = "two_pipes"
TABLE = f"{DB}.t"


def _configs(mariadb: LocalMariaDB, tmp_path: Path, *, own_lake: bool = False) -> tuple[Path, Path]:
    """Pipelines ``first`` and ``second`` of one table: one lake and two state stores, or
    (``own_lake``) one state store, and so one catalog, and two lakes."""
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    mariadb.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        "INSERT INTO t SELECT seq, seq FROM seq_1_to_100",
        database=DB,
    )
    first = pipeline_config(tmp_path, mariadb, [{"name": TABLE}], "first")
    second = copy.deepcopy(first)
    second["pipeline"] = "second"
    if own_lake:
        second["output"] = {"path": str(tmp_path / "second-lake")}
    else:
        second["state"] = {"url": f"sqlite:///{tmp_path / 'second.db'}"}
    return write_config(tmp_path / "first.yaml", first), write_config(
        tmp_path / "second.yaml", second
    )


def _current(tmp_path: Path) -> dict[str, object]:
    return dict(
        json.loads((tmp_path / "lake" / DB / "t" / "_tidemark" / "current.json").read_text())
    )


def test_a_version_older_than_the_lakes_is_not_published(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    first, second = _configs(mariadb, tmp_path)
    assert tidemark(first).returncode == 0
    mariadb.execute("UPDATE t SET v = -1 WHERE id < 10", database=DB)
    # the second pipeline's snapshot reads and reconciles, then dies before publishing
    assert tidemark(second, failpoint="reconcile.table_done:1").returncode != 0
    mariadb.execute("UPDATE t SET v = -2 WHERE id > 90", database=DB)
    assert tidemark(first).returncode == 0  # a later version: the table with both changes
    later = _current(tmp_path)

    resumed = tidemark(second)

    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "later than this run's" in resumed.stderr
    assert "is another pipeline writing this table?" in resumed.stderr
    assert _current(tmp_path) == later, "the lake was taken back"
    mariadb.execute("UPDATE t SET v = -3 WHERE id = 50", database=DB)
    assert tidemark(first).returncode == 0
    assert_lake_equals_source(first, mariadb, [TABLE])


def test_a_later_version_another_pipeline_published_is_gone_on_from_with_a_warning(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    first, second = _configs(mariadb, tmp_path)
    assert tidemark(first).returncode == 0
    mariadb.execute("UPDATE t SET v = -1 WHERE id < 10", database=DB)
    assert tidemark(second).returncode == 0  # a snapshot: a later version, of a run not the first's
    mariadb.execute("UPDATE t SET v = -2 WHERE id > 90", database=DB)

    went_on = tidemark(first)

    assert went_on.returncode == 0, went_on.stderr[-3000:]
    assert "is another pipeline writing this table?" in went_on.stdout + went_on.stderr
    assert "where this pipeline's version goes on: applied on it" in went_on.stdout + went_on.stderr
    assert_lake_equals_source(first, mariadb, [TABLE])


def _doctor(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _catalog_table(config: Path) -> tuple[str, set[str]]:
    """The catalog's table of TABLE: its location and the run ids of its snapshots."""
    loaded = open_catalog(load_config(config)).load_table(TABLE)
    runs = {s.summary.get("tidemark.run-id") for s in loaded.snapshots() if s.summary}
    return loaded.location(), {r for r in runs if r}


def test_a_table_of_another_lake_in_the_same_catalog_is_left_alone(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    first, second = _configs(mariadb, tmp_path, own_lake=True)
    assert tidemark(first).returncode == 0
    location, runs = _catalog_table(first)
    doctor = _doctor(second)
    assert doctor.returncode == 3, doctor.stdout + doctor.stderr
    (line,) = [x for x in doctor.stdout.splitlines() if x.startswith("FAIL  Iceberg catalog")]
    assert f"{TABLE} at {location}/metadata/" in line and "its own output.catalog.name" in line

    refused = tidemark(second)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"the Iceberg catalog's table {TABLE} is at {location}" in refused.stderr
    assert "give one of them its own output.catalog.name" in refused.stderr
    assert _catalog_table(first) == (location, runs), "the first pipeline's table was written"
    reset = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator", "reset", "--config", str(second)),
            *("--purge-output", "--yes"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert "another pipeline's; left in the catalog" in reset.stdout + reset.stderr
    assert _catalog_table(first) == (location, runs), "reset dropped the first pipeline's table"

    # the fix: a catalog name of its own
    data = yaml.safe_load(second.read_text())
    data["output"]["catalog"] = {"name": "second"}
    write_config(second, data)
    assert load_config(second).output.catalog.name == "second"
    mariadb.execute("UPDATE t SET v = -1 WHERE id < 10", database=DB)
    assert tidemark(second).returncode == 0
    assert tidemark(first).returncode == 0
    assert_lake_equals_source(first, mariadb, [TABLE])
    assert_lake_equals_source(second, mariadb, [TABLE])
    assert _catalog_table(second)[0] == f"file://{tmp_path / 'second-lake' / DB / 't'}"
    assert _doctor(second).returncode == 0
    assert _catalog_table(first)[0] == location
