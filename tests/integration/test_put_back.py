"""An older ``current.json`` put back after a run planned a table (a stale writer's put-back in
the one instant docs/design.md "One writer" allows, or a copy restored by hand) must not have
the run's changes applied to it: before, the run reconciled on the older version and published
it as the next one, and the changes between the two versions were lost for good (found by a
review). Now the table fails alone, naming the cause, and the next run reads it again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import (
    assert_lake_equals_source,
    fresh_database,
    pipeline_config,
    start_run,
    write_config,
)
from tests.integration.test_failures import run

pytestmark = pytest.mark.integration

DB = "put_back"


def test_a_version_put_back_after_planning_fails_the_table_then_it_is_read_again(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    fresh_database(
        mariadb,
        DB,
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO t SELECT seq, 'orig' FROM seq_1_to_100",
    )
    config = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path, mariadb, [{"name": f"{DB}.t"}], name=DB, defaults={"read_margin_seconds": 0.0}
        ),
    )
    assert run(config).returncode == 0
    mariadb.execute("UPDATE t SET v = 'second' WHERE id = 1", database=DB)
    assert run(config).returncode == 0  # version 2
    mariadb.execute("UPDATE t SET v = 'third' WHERE id = 2", database=DB)
    killed = start_run(config, failpoint="capture.reading")  # planned on version 2, then killed
    killed.communicate(timeout=300)
    assert killed.returncode != 0
    meta = tmp_path / "lake" / DB / "t" / "_tidemark"
    shutil.copy(meta / "versions" / "000001.json", meta / "current.json")  # version 1 put back
    resumed = run(config)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "current.json was replaced" in resumed.stdout + resumed.stderr
    assert run(config).returncode == 0  # checkpoint at version 2, current.json at 1: read again
    assert_lake_equals_source(config, mariadb, [f"{DB}.t"])
