"""Test data shared by tests/dags and tests/e2e: two small tables, a pipeline config, readers.

The source password reaches the tasks only through an Airflow connection
(``source.airflow_conn_id``), so the tests also check the Airflow 3 credential
path and that the password shows up nowhere else.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import fresh_database, pipeline_config, write_config

REPO = Path(__file__).resolve().parents[2]
SOURCE_USER = "tm_airflow"
#: Distinctive, so a leak into a log, an XCom or a rendered field is easy to find.
SOURCE_PASSWORD = "pw-Xq7-never-logged"
ENGINE_MODULES = (
    "orchestrator.pipeline.read.step",
    "orchestrator.pipeline.capture.step",
    "orchestrator.pipeline.reconcile.rewrite",
    "orchestrator.pipeline.publish.step",
)


def engine_missing() -> str | None:
    """Why a real run cannot work yet (the engine not landed), or None when it can."""
    from orchestrator.app import steps

    if "NotImplementedError" in inspect.getsource(steps):
        return "orchestrator.app.steps still raises NotImplementedError (engine not landed yet)"
    missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"engine modules not landed yet: {', '.join(missing)}"
    return None


def create_tables(server: LocalMariaDB, db: str, rows: int = 300) -> None:
    """``<db>.t1`` and ``<db>.t2`` with ``rows`` rows each, and the snapshot user."""
    server.create_user(SOURCE_USER, SOURCE_PASSWORD)
    fresh_database(server, db)
    for table in ("t1", "t2"):
        server.execute(
            f"CREATE TABLE {db}.{table} (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
            "qty INT NULL) ENGINE=InnoDB"
        )
        values = ", ".join(f"({i}, '{table}-{i}', {i % 17})" for i in range(1, rows + 1))
        server.execute(f"INSERT INTO {db}.{table} VALUES {values}")


def write_pipeline(
    folder: Path, work: Path, server: LocalMariaDB, db: str, conn_id: str, **overrides: Any
) -> Path:
    """``<folder>/<db>.yaml``: pipeline ``db`` over ``<db>.t1`` and ``<db>.t2``, state and lake in
    ``work``."""
    config = pipeline_config(
        work, server, [{"name": f"{db}.t1"}, {"name": f"{db}.t2"}], name=db, **overrides
    )
    config["source"] = {
        "host": "127.0.0.1",
        "port": server.port,
        "user": SOURCE_USER,
        "server_id": 54100,
        "airflow_conn_id": conn_id,
    }
    config["defaults"] = {"chunk_size": 100, "batch_chunks": 2, "read_margin_seconds": 0.05}
    folder.mkdir(parents=True, exist_ok=True)
    return write_config(folder / f"{db}.yaml", config)


def connection_json(server: LocalMariaDB) -> str:
    """The Airflow connection of the source, in the JSON form ``AIRFLOW_CONN_*`` accepts."""
    return json.dumps(
        {
            "conn_type": "mysql",
            "host": "127.0.0.1",
            "port": server.port,
            "login": SOURCE_USER,
            "password": SOURCE_PASSWORD,
        }
    )


def manifest(lake: Path, table: str) -> dict[str, Any] | None:
    """The table's current manifest (docs/output.md), or None before a publish."""
    path = lake / table.replace(".", "/") / "_tidemark" / "current.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def published_rows(lake: Path, table: str) -> set[tuple[Any, ...]]:
    """The rows of the table's current version, read with pyarrow as docs/output.md says."""
    current = manifest(lake, table)
    assert current is not None, f"{table} was never published"
    base = lake / table.replace(".", "/")
    dataset = ds.dataset([str(base / f) for f in current["files"]], format="parquet")
    return {(r["id"], r["name"], r["qty"]) for r in dataset.to_table().to_pylist()}


def source_rows(server: LocalMariaDB, table: str) -> set[tuple[Any, ...]]:
    """The rows of the source table now."""
    return set(server.execute(f"SELECT id, name, qty FROM {table}"))
