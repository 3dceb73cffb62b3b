"""The driver JVM a session starts runs with the Java options `session_conf` gives it: the UTC
time zone and the JIT compilers' threshold (`orchestrator.services.spark.JIT_JAVA_OPTION`)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.services.spark import JIT_JAVA_OPTION, UTC_JAVA_OPTION

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
