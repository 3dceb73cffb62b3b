"""The driver JVM's class archive (`orchestrator.services.class_archive`): which options a JVM
about to start gets, from what the cache directory holds."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.services.class_archive import DYNAMIC_MAGIC, archive_key, java_options

CONF = {"spark.driver.extraClassPath": "/jars/mariadb-java-client.jar"}


def _env(cache: Path) -> dict[str, str]:
    return {"TIDEMARK_JVM_CACHE": str(cache), "JAVA_HOME": "/usr/lib/jvm/some-jdk"}


def _archive(cache: Path, name: str, *, complete: bool, age: float = 0.0) -> Path:
    path = cache / name
    path.write_bytes((DYNAMIC_MAGIC if complete else b"\0\0\0\0") + b"\1" * 64)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_an_empty_cache_has_this_jvm_write_the_archive(tmp_path: Path) -> None:
    options = java_options(CONF, _env(tmp_path))
    key = archive_key(CONF, _env(tmp_path))
    assert f"-XX:ArchiveClassesAtExit={tmp_path}/{key}.{os.getpid()}." in options
    assert "-Xlog:cds=off" in options


def test_a_complete_archive_is_mapped_and_older_ones_removed(tmp_path: Path) -> None:
    key = archive_key(CONF, _env(tmp_path))
    old = _archive(tmp_path, f"{key}.1.1.jsa", complete=True, age=600)
    new = _archive(tmp_path, f"{key}.2.2.jsa", complete=True, age=60)
    assert java_options(CONF, _env(tmp_path)).startswith(f"-XX:SharedArchiveFile={new} ")
    assert not old.exists()


def test_an_unfinished_archive_is_never_mapped(tmp_path: Path) -> None:
    """A JVM killed while writing leaves a header of zeros: not mapped; while it may still be
    written (young), no second JVM writes one; once old, it is removed and a new one written."""
    key = archive_key(CONF, _env(tmp_path))
    young = _archive(tmp_path, f"{key}.999999999.1.jsa", complete=False, age=10)
    assert java_options(CONF, _env(tmp_path)) == ""
    os.utime(young, (time.time() - 7200, time.time() - 7200))
    options = java_options(CONF, _env(tmp_path))
    assert "-XX:ArchiveClassesAtExit=" in options and not young.exists()


def test_an_archive_of_another_class_path_is_not_used(tmp_path: Path) -> None:
    other = {"spark.driver.extraClassPath": "/jars/other.jar"}
    _archive(tmp_path, f"{archive_key(other, _env(tmp_path))}.1.1.jsa", complete=True)
    assert "-XX:ArchiveClassesAtExit=" in java_options(CONF, _env(tmp_path))


def test_the_users_own_class_sharing_and_off_are_left_alone(tmp_path: Path) -> None:
    own = {**CONF, "spark.driver.extraJavaOptions": "-Xshare:off"}
    assert java_options(own, _env(tmp_path)) == ""
    assert java_options(CONF, {"TIDEMARK_JVM_CACHE": "off"}) == ""
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_costs_the_speed_up_not_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert java_options(CONF, _env(blocker / "jvm")) == ""
