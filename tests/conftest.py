"""Shared fixtures: a private MariaDB (session-scoped) and helpers to build configs."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.demo.localdb import LocalMariaDB

HAVE_MARIADB = shutil.which("mariadbd") is not None or Path("/usr/sbin/mariadbd").exists()


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """One private MariaDB with ROW/FULL/FULL binlog for the whole session.

    Tests create their own databases in it (name them after the test) so they
    do not see each other's tables.
    """
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create(base_dir=tmp_path_factory.mktemp("mariadb"))
    server.start()
    yield server
    server.destroy()


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def pipeline_config(tmp_path: Path, server: LocalMariaDB, tables: list[dict[str, Any]],
                    name: str = "test", **overrides: Any) -> dict[str, Any]:
    """A complete pipeline config dict pointing at ``server``, with state and output under tmp_path."""
    config: dict[str, Any] = {
        "pipeline": name,
        "source": server.source_config(),
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false",
                                                  "spark.sql.shuffle.partitions": "4"}},
        "output": {"path": str(tmp_path / "lake")},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "defaults": {"chunk_size": 1000, "batch_chunks": 4, "read_margin_seconds": 0.05},
        "tables": tables,
    }
    config.update(overrides)
    return config
