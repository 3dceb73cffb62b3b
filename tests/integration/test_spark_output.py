"""`orchestrator.services.spark`: the driver JVM's output goes to the log, not to stderr.

Airflow records a task's stderr as ERROR lines, so a JVM writing its banner and
log4j warnings there made every successful read task look failed. A fresh
Python process starts a session, runs a job and stops; its stderr must be empty
and the JVM's lines must come out of the ``tidemark.jvm`` logger.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import DEFAULT_JDBC_JAR

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration]

SCRIPT = """
import logging, sys
from pathlib import Path
logging.basicConfig(stream=sys.stdout, level=logging.INFO, \
format="%(levelname)s %(name)s %(message)s")
from tests.integration.conftest import spark_test_config
from orchestrator.pipeline.context import spark_session
spark = spark_session(spark_test_config(Path(sys.argv[1])))
assert spark.range(10).count() == 10
spark.stop()
"""


def test_jvm_output_is_logged_not_written_to_stderr(tmp_path: Path) -> None:
    if not os.path.exists(DEFAULT_JDBC_JAR):
        pytest.skip(f"{DEFAULT_JDBC_JAR} missing (Debian package libmariadb-java)")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.strip() == ""
    jvm_lines = [line for line in result.stdout.splitlines() if " tidemark.jvm " in line]
    assert any("log level" in line for line in jvm_lines), result.stdout[-3000:]
    assert all(line.startswith("INFO ") for line in jvm_lines), jvm_lines
