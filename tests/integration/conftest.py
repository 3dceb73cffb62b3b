"""Integration fixtures: one local SparkSession for the whole test session.

The machine is small and shared, so every Spark test uses this one session
(``local[2]``, no UI, few shuffle partitions, 1 GB driver) made by the same
factory the engine uses, `orchestrator.pipeline.context.spark_session`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import DEFAULT_JDBC_JAR, PipelineConfig, parse_config
from tests.conftest import fresh_database, load_pipeline

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.enabled": "true",
}


def spark_test_config(
    tmp_path: Path,
    source: dict[str, Any] | None = None,
    tables: list[dict[str, Any]] | None = None,
    **output: Any,
) -> PipelineConfig:
    """A pipeline config for Spark tests: output under ``tmp_path``, the test Spark settings."""
    return parse_config(
        {
            "pipeline": "spark_tests",
            "source": source or {"host": "127.0.0.1", "port": 1, "user": "nobody", "server_id": 1},
            "spark": {"master": "local[2]", "conf": dict(SPARK_CONF)},
            "output": {"path": str(tmp_path / "lake"), **output},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": tables or [{"name": "x.y"}],
        },
        check_env=False,
    )


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's SparkSession (skips when Java or the JDBC driver jar is missing)."""
    if not os.path.exists(DEFAULT_JDBC_JAR):
        pytest.skip(f"{DEFAULT_JDBC_JAR} missing (Debian package libmariadb-java)")
    from orchestrator.pipeline.context import spark_session

    config = spark_test_config(tmp_path_factory.mktemp("spark"))
    session = spark_session(config)
    yield session
    session.stop()


def two_table_pipeline(
    mariadb: LocalMariaDB, tmp_path: Path, db: str, create: str, fill: str, rows: tuple[int, int]
) -> PipelineConfig:
    """Database ``db`` (made anew) with tables ``t`` and ``other`` (``create``/``fill`` are
    formatted with ``db``, ``name`` and ``rows``) and a pipeline of both, small chunks, no
    margin."""
    fresh_database(mariadb, db)
    for name, count in zip(("t", "other"), rows, strict=True):
        mariadb.execute(
            create.format(db=db, name=name), fill.format(db=db, name=name, rows=count), database=db
        )
    return load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.t"}, {"name": f"{db}.other"}],
        name=db,
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
    )


def both_readers(tmp_path: Path, mariadb: LocalMariaDB, db: str) -> PipelineConfig:
    """A pipeline of ``db.spark`` (several chunks: read by Spark) and ``db.driver`` (one chunk:
    read by the driver), which a test fills with the same rows."""
    return load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.spark", "chunk_size": 2}, {"name": f"{db}.driver"}],
        name=db,
        defaults={"read_margin_seconds": 0.0},
    )


def run_plain(config: PipelineConfig) -> None:
    """One plain ``tidemark run`` of every table, which must succeed."""
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0


def before_first_pass(
    monkeypatch: pytest.MonkeyPatch, server: LocalMariaDB, database: str, *statements: str
) -> list[int]:
    """Run ``statements`` in ``database`` once, when the next run's capture ends its first pass
    (after every read batch, after preflight and planning, before ``H`` is recorded): DDL there
    is seen by the capture alone, which re-reads inside the run. Returns the passes counted."""
    from orchestrator.pipeline.capture import passes

    real = passes.prepare_rereads
    calls: list[int] = []

    def first(*args: Any, **kwargs: Any) -> bool:
        if not calls:
            server.execute(*statements, database=database)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(passes, "prepare_rereads", first)
    return calls
