"""The driver JVM a session starts runs with the Java options `session_conf` gives it: the UTC
time zone and the JIT compilers' threshold (`orchestrator.services.spark.JIT_JAVA_OPTION`); a
session that writes an event log is stopped at the process's exit, which finishes the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zstandard

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.spark import JIT_JAVA_OPTION, UTC_JAVA_OPTION
from tests.conftest import assert_lake_equals_source, chunked_config, fresh_database
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration]
pytestmark = [pytest.mark.integration]


def test_the_driver_jvm_runs_with_the_session_options(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    arguments = list(
        jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    assert UTC_JAVA_OPTION in arguments
    assert JIT_JAVA_OPTION in arguments
    scaling = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    ).getVMOption("CompileThresholdScaling")
    assert scaling.getValue() == "10.0"


@pytest.mark.slow
def test_a_run_that_writes_a_spark_event_log_finishes_it(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spark.eventLog.enabled``: the log of a run's session was left in progress for good (a
    history server lists it as incomplete): the process ended its JVM without stopping it. Set
    where clusters set it, in ``spark-defaults.conf`` (``SPARK_CONF_DIR``), not the pipeline."""
    db = "tm_event_log"
    fresh_database(
        mariadb,
        db,
        "CREATE TABLE big (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO big SELECT seq, seq FROM seq_1_to_{LOCAL_ROWS + 2000}",
        "ANALYZE TABLE big",
    )
    events, defaults = tmp_path / "events", tmp_path / "spark-conf"
    events.mkdir()
    defaults.mkdir()
    (defaults / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events}\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(defaults))
    config = chunked_config(tmp_path, mariadb, [f"{db}.big"], db)

    run = tidemark(config)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "spark session stopped in" in run.stdout + run.stderr
    assert_lake_equals_source(config, mariadb, [f"{db}.big"])
    (log,) = events.iterdir()  # Spark 4 rolls its event logs: a directory of them
    statuses = [p.name for p in log.iterdir() if p.name.startswith("appstatus_")]
    assert statuses and not any(s.endswith(".inprogress") for s in statuses), statuses
    said = b"".join(
        zstandard.ZstdDecompressor().stream_reader(p.open("rb"), read_across_frames=True).read()
        for p in log.glob("events_*.zstd")
    )
    assert b'"Event":"SparkListenerApplicationEnd"' in said
