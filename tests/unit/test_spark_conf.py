"""`orchestrator.services.spark.session_conf`: the Java options a session's JVMs start with."""

from __future__ import annotations

from orchestrator.services.spark import (
    JIT_JAVA_OPTION,
    UTC_JAVA_OPTION,
    SessionSettings,
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
