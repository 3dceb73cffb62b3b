"""No secret leaks from a pipeline on S3: a snapshot DAG run (``dag.test()``), an incremental
``tidemark run``, then ``status`` and ``doctor``, with the S3 secret key in an environment
variable ``output.s3.secret_key_env`` names and the source password in an Airflow connection.
Neither appears in any log line (the captured output, the run's log files), ``status`` or
``doctor`` output, XCom value, rendered template field or asset event.

The tables are small enough for the driver to read (one chunk each): no Spark session starts in
the test process, whose shared session has no S3 connector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from tests.conftest import s3_output
from tests.dags.sources import REPO, SOURCE_PASSWORD, connection_json, create_tables, write_pipeline
from tests.dags.test_dag_run import load_dag_of, stored_values, task_states
from tests.iceberg_readers import assert_readers_equal_source
from tests.services import S3_SECRET_KEY, MotoS3

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]

DB = "tm_dags3"
CONN_ID = "tidemark_dags3_source"
SECRETS = {"the S3 secret key": S3_SECRET_KEY, "the source password": SOURCE_PASSWORD}


def _cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
        env=dict(os.environ),
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout + done.stderr


def test_a_pipeline_on_s3_leaks_no_secret(
    mariadb: LocalMariaDB,
    s3_server: MotoS3,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    create_tables(mariadb, DB)
    configs = tmp_path / "configs"
    path = write_pipeline(
        configs, tmp_path, mariadb, DB, CONN_ID, output=s3_output(s3_server, s3_bucket)
    )
    data = yaml.safe_load(path.read_text())
    data["defaults"]["chunk_size"] = 10_000  # one chunk a table: the driver reads them
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(mariadb))
    tables = [f"{DB}.t1", f"{DB}.t2"]

    run = load_dag_of(monkeypatch, configs, f"tidemark_{DB}").test()
    assert run.state == "success", task_states(run)
    mariadb.execute(
        f"UPDATE {DB}.t1 SET name = 'changed' WHERE id <= 10", f"DELETE FROM {DB}.t2 WHERE id < 5"
    )
    outputs = {
        "run": _cli(path, "run", "--no-progress"),
        "status": _cli(path, "status"),
        "doctor": _cli(path, "doctor"),
    }
    config = load_config(path)
    assert_readers_equal_source(config, tables)
    assert not (tmp_path / "lake").exists(), "the lake is on S3 only"

    captured = "".join(capfd.readouterr())
    stored = stored_values_of(run.run_id)
    assert stored["xcom"] and stored["rendered"], "the DAG run stored XComs and rendered fields"
    logs = {str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*.log*") if p.is_file()}
    assert logs, "the CLI run wrote its log file"
    for name, secret in SECRETS.items():
        for what, value in (
            ("XCom", stored["xcom"]),
            ("rendered template fields", stored["rendered"]),
            ("asset events", stored["events"]),
            ("the DAG run's log lines", captured),
            *((f"`tidemark {verb}` output", text) for verb, text in outputs.items()),
            *((f"log file {p}", text) for p, text in logs.items()),
        ):
            assert secret not in json.dumps(value, default=str), f"{name} leaked into {what}"


def stored_values_of(run_id: str) -> dict[str, object]:
    """`stored_values` of this module's DAG."""
    import tests.dags.test_dag_run as dag_run

    saved = dag_run.DB
    dag_run.DB = DB
    try:
        return stored_values(run_id)
    finally:
        dag_run.DB = saved
