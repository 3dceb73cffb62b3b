"""Foreign-key cascades reach the lake (docs/design.md, "Foreign-key cascades").

MariaDB's InnoDB runs ``ON DELETE``/``ON UPDATE`` ``CASCADE`` and ``SET NULL`` inside the
engine and writes no row event for the child rows it changes; Tidemark derives them from the
parents' row events. Each test changes parents between (or during) runs on the private MariaDB
and ends with every table equal to the source through its manifest, pyiceberg and DuckDB
(`tests.iceberg_readers`). Before the derivation, each of them kept the child rows the source
deleted or changed through their parent.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig, load_config
from tests.conftest import pipeline_config, write_config
from tests.iceberg_readers import assert_readers_equal_source
from tests.integration.conftest import run_plain

pytestmark = pytest.mark.integration


def pipeline(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    db: str,
    statements: list[str],
    tables: list[str],
    **defaults: Any,
) -> PipelineConfig:
    """Database ``db`` made anew by ``statements``, and a pipeline of ``tables`` in it."""
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(*statements, database=db)
    return load_config(
        write_config(
            tmp_path / "p.yaml",
            pipeline_config(
                tmp_path,
                mariadb,
                [{"name": f"{db}.{t}"} for t in tables],
                name=db,
                defaults={"read_margin_seconds": 0.0, **defaults},
            ),
        )
    )


def equal(config: PipelineConfig, db: str, tables: list[str]) -> None:
    assert_readers_equal_source(config, [f"{db}.{t}" for t in tables])


FAMILY = [
    "CREATE TABLE p (id INT PRIMARY KEY, name VARCHAR(20))",
    "CREATE TABLE c (id INT PRIMARY KEY, pid INT, note VARCHAR(20),"
    " CONSTRAINT c_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE g (id INT PRIMARY KEY, cid INT, w INT,"
    " CONSTRAINT g_c FOREIGN KEY (cid) REFERENCES c (id) ON DELETE SET NULL)",
    "INSERT INTO p SELECT seq, CONCAT('p', seq) FROM seq_1_to_40",
    "INSERT INTO c SELECT seq, 1 + seq % 40, CONCAT('c', seq) FROM seq_1_to_400",
    "INSERT INTO g SELECT seq, 1 + seq % 400, seq FROM seq_1_to_800",
]


def test_delete_update_and_set_null_cascades_three_levels(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: parents deleted and re-keyed, children (ON DELETE CASCADE ON UPDATE
    CASCADE) and grandchildren (ON DELETE SET NULL) all in the pipeline, between runs."""
    db = "casc_family"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    mariadb.execute(
        "DELETE FROM p WHERE id <= 10",  # 100 children deleted, 200 grandchildren set null
        "UPDATE p SET id = id + 1000 WHERE id BETWEEN 11 AND 20",  # 100 children re-pointed
        "UPDATE c SET note = 'own change' WHERE id % 40 = 21",  # own changes among them
        database=db,
    )
    caplog.set_level(logging.WARNING)
    run_plain(config)
    equal(config, db, tables)
    assert "re-read" not in caplog.text  # derived, not read again
