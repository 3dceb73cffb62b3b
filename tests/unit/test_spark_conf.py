"""`orchestrator.services.spark.session_conf`: the Java options a session's JVMs start with; and
where the driver JVM's crash report goes (`crash_report`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services.spark import (
    JIT_JAVA_OPTION,
    UTC_JAVA_OPTION,
    SessionSettings,
    crash_report,
    session_conf,
)

DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"


def test_the_driver_gets_the_jit_option_and_every_jvm_utc() -> None:
    conf = session_conf(SessionSettings("t", "local[2]"))
    assert conf[DRIVER].split() == [UTC_JAVA_OPTION, JIT_JAVA_OPTION]
    assert conf[EXECUTOR].split() == [UTC_JAVA_OPTION]


def test_the_pipelines_own_options_come_first_and_stay() -> None:
    own = "-Xss4m -Dkey=value"
    conf = session_conf(SessionSettings("t", "local[2]", conf={DRIVER: own}))
    assert conf[DRIVER] == f"{own} {UTC_JAVA_OPTION} {JIT_JAVA_OPTION}"


def test_a_pipeline_naming_the_compile_threshold_keeps_its_own() -> None:
    own = "-XX:CompileThresholdScaling=1"
    conf = session_conf(SessionSettings("t", "local[2]", conf={DRIVER: own}))
    assert conf[DRIVER] == f"{own} {UTC_JAVA_OPTION}"
    assert "CompileThresholdScaling=10" not in conf[DRIVER]


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """A file handler on the root logger, as `orchestrator.app.logs.open_log` adds."""
    path = tmp_path / "p-20261130T000000Z-42.log"
    handler = logging.FileHandler(path)
    logging.getLogger().addHandler(handler)
    try:
        yield path
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def test_the_crash_report_goes_beside_the_log_file(log_file: Path) -> None:
    expected = str(log_file.parent / "p-20261130T000000Z-42.jvm-crash-%p.log")
    assert crash_report(None) == expected
    assert crash_report("-Xss4m") == expected
    assert crash_report("-XX:ErrorFile=/var/tmp/hs_err_%p.log") is None  # the pipeline's own


def test_no_crash_report_option_without_a_log_file_or_with_a_space_in_its_path(
    tmp_path: Path,
) -> None:
    assert crash_report(None) is None  # pytest's handlers write no file
    spaced = tmp_path / "my logs"
    spaced.mkdir()
    handler = logging.FileHandler(spaced / "p.log")
    logging.getLogger().addHandler(handler)
    try:
        assert crash_report(None) is None  # Spark would split the option at the space
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
