"""Airflow across workers: the CeleryExecutor with a Redis broker and two Celery workers, each in
its own working directory with its own ``TMPDIR`` and ``HOME``; Airflow's metadata, Tidemark's
state store and the Iceberg catalog on PostgreSQL; staging and lake on S3 (moto's server).

A DAG run snapshots both tables (Spark reads them in the read tasks), a second run applies the
binlog; each published table equals its source. Every task reads only what the state store, the
object store and the source hold: no task could read a file another task left on its worker's
disk, since the two workers share no directory Tidemark writes to.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.services import jars
from tests.conftest import s3_output
from tests.dags.sources import (
    SOURCE_PASSWORD,
    SOURCE_USER,
    connection_json,
    create_tables,
    write_pipeline,
)
from tests.e2e.stack import AirflowStack, wait_for
from tests.iceberg_readers import assert_readers_equal_source
from tests.services import S3_SECRET_KEY, LocalPostgres, LocalRedis, MotoS3

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DB = "tm_celery"
DAG_ID = f"tidemark_{DB}"
CONN_ID = "tidemark_celery_source"
RUN_TIMEOUT = 900
WORKERS = ("worker-a", "worker-b")


def _database(postgres: LocalPostgres, prefix: str) -> str:
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/{name}"


@pytest.fixture(scope="module")
def deployment(
    mariadb: LocalMariaDB,
    postgres: LocalPostgres,
    redis_server: LocalRedis,
    s3_server: MotoS3,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[AirflowStack, Path, str]]:
    work = tmp_path_factory.mktemp("celery")
    bucket = s3_server.create_bucket(f"celery-{uuid.uuid4().hex[:8]}")
    create_tables(mariadb, DB)
    configs = work / "configs"
    path = write_pipeline(
        configs,
        work,
        mariadb,
        DB,
        CONN_ID,
        output=s3_output(s3_server, bucket),
        state={"url": _database(postgres, "state")},
    )
    data = yaml.safe_load(path.read_text())
    data["spark"]["conf"]["spark.driver.memory"] = "512m"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    home = work / "airflow"
    home.mkdir()
    metadata = _database(postgres, "airflow")
    stack = AirflowStack(
        home=home,
        executor="CeleryExecutor",
        extra_env={
            "TIDEMARK_CONFIG_DIR": str(configs),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata,
            # psycopg 3 serves SQLAlchemy's async engine too (Airflow's default wants asyncpg)
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata,
            "AIRFLOW__CELERY__BROKER_URL": redis_server.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": redis_server.url.replace("/0", "/1"),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            # each worker has a HOME of its own: the jars are where .ci/setup put them
            jars.REPO_ENV: str(jars.repository()),
        },
    )
    try:
        stack.start()
        for name in WORKERS:
            stack.start_celery_worker(name, work / name)
        yield stack, path, bucket
    except Exception:
        for name in ("api-server", "scheduler", "dag-processor", *WORKERS):
            print(f"--- airflow {name} log ---\n{stack.log_tail(name)}")
        raise
    finally:
        stack.stop()


def _run(airflow: AirflowStack) -> dict[tuple[str, int], str]:
    """Trigger a DAG run, wait for it; the state of each task instance."""
    run_id = airflow.api(
        "POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}}
    ).json()["dag_run_id"]

    def finished() -> str | None:
        airflow.check_alive()
        state = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return str(state) if state in ("success", "failed") else None

    state = wait_for(f"DAG run {run_id}", finished, timeout=RUN_TIMEOUT, interval=3)
    tis = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()
    summary = {(t["task_id"], t["map_index"]): t["state"] for t in tis["task_instances"]}
    assert state == "success", summary
    return summary


def test_a_dag_run_across_two_celery_workers_publishes_tables_equal_to_the_source(
    deployment: tuple[AirflowStack, Path, str],
    mariadb: LocalMariaDB,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    airflow, config_path, _ = deployment

    def listed() -> Any:
        airflow.check_alive()
        response = airflow.api("GET", f"/dags/{DAG_ID}", expect=None)
        return response.json() if response.status_code == 200 else None

    wait_for(f"the dag-processor to load {DAG_ID}", listed, timeout=300, interval=2)
    airflow.api(
        "POST",
        "/pools",
        json={"name": f"tidemark_{DB}_source", "slots": 2, "description": "source connections"},
        expect=201,
    )
    airflow.api(
        "POST",
        "/connections",
        expect=201,
        json={
            "connection_id": CONN_ID,
            "conn_type": "mysql",
            "host": "127.0.0.1",
            "port": mariadb.port,
            "login": SOURCE_USER,
            "password": SOURCE_PASSWORD,
        },
    )
    airflow.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})

    first = _run(airflow)
    assert sum(1 for task, _ in first if task == "read") >= 2, first
    mariadb.execute(
        f"UPDATE {DB}.t1 SET name = 'changed' WHERE id <= 10",
        f"DELETE FROM {DB}.t2 WHERE id < 5",
        f"INSERT INTO {DB}.t1 VALUES (5001, 'new', 1)",
    )
    _run(airflow)

    # the test reads the source as the workers do, through the connection
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(mariadb))
    config = load_config(config_path)
    assert_readers_equal_source(config, [f"{DB}.t1", f"{DB}.t2"])
    work = config_path.parent.parent
    ran = {}
    for name in WORKERS:
        log = (work / name / "worker.log").read_text(errors="replace")
        ran[name] = len(re.findall(r"Task execute_workload\[[^\]]+\] received", log))
        for secret in (S3_SECRET_KEY, SOURCE_PASSWORD):
            assert secret not in log, f"a secret in {name}'s log"
    assert all(ran.values()), f"each worker must have run tasks: {ran}"
    assert not (work / "lake").exists() and not (work / "_staging").exists()
