"""`orchestrator.runtime.failures`: a failure's chain reduced to the cause a user can act on."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.runtime.failures import describe, root_cause


def chained(*messages: BaseException) -> BaseException:
    """``messages[0]`` raised from ``messages[1]`` raised from ... (outermost first)."""
    for outer, inner in itertools.pairwise(messages):
        outer.__cause__ = inner
    return messages[0]


CASES = [
    (chained(RuntimeError("An error occurred while calling o150.parquet."),
             OSError("java.io.IOException: No space left on device")),
     "no space left on device"),
    (OSError(28, "No space left on device", "/lake/shop/t/x.parquet"),
     "no space left on device on /lake/shop/t/x.parquet"),
    (RuntimeError("java.io.IOException: Mkdirs failed to create file:/data/lake/_staging/r1 "
                  "(exists=false, cwd=file:/work)"),
     "permission denied on /data/lake/_staging/r1"),
    (PermissionError(13, "Permission denied", "/data/lake"), "permission denied on /data/lake"),
    (RuntimeError("org.apache.hadoop.fs.ParentNotDirectoryException: /tmp/blocker (is not a directory)"),
     "a parent of the path is a regular file, not a directory on /tmp/blocker"),
    (NotADirectoryError(20, "Not a directory", "/tmp/blocker/lake"),
     "a parent of the path is a regular file, not a directory on /tmp/blocker/lake"),
    (RuntimeError("java.sql.SQLNonTransientConnectionException: Could not connect to "
                  "address=(host=127.0.0.1)(port=3306)(type=master) : Socket fail to connect"),
     "connection lost to 127.0.0.1:3306"),
    (RuntimeError("(2003, \"Can't connect to MySQL server on '10.0.0.5' ([Errno 111] Connection refused)\")"),
     "connection lost"),
    (chained(RuntimeError("lost the connection to MySQL at 127.0.0.1:53033 and could not get it back"),
             ConnectionRefusedError(111, "Connection refused")),
     "connection lost to 127.0.0.1:53033"),
    (RuntimeError("java.lang.OutOfMemoryError: Java heap space"),
     "the Spark driver ran out of memory (Java OutOfMemoryError)"),
    (RuntimeError("Lost executor 1: java.lang.OutOfMemoryError: Java heap space"),
     "the Spark executor ran out of memory (Java OutOfMemoryError)"),
    (RuntimeError("(sqlite3.OperationalError) unable to open database file"),
     "the state store cannot be written (read-only database file or directory)"),
]


@pytest.mark.parametrize(("exc", "what"), CASES)
def test_root_cause(exc: BaseException, what: str) -> None:
    cause = root_cause(exc)
    assert cause is not None and cause.what == what
    assert "\n" not in describe(exc) and "then rerun" in describe(exc)


def test_innermost_cause_wins() -> None:
    exc = chained(RuntimeError("Connection reset while writing"), OSError("No space left on device"))
    assert describe(exc).startswith("no space left on device")


def test_unknown_failure_is_its_first_line() -> None:
    assert root_cause(ValueError("something odd\nmore")) is None
    assert describe(ValueError("something odd\nmore")) == "something odd"


def test_out_of_memory_names_the_setting() -> None:
    assert "spark.driver.memory" in describe(RuntimeError("java.lang.OutOfMemoryError: Java heap space"))


def test_lost_connection_names_the_source_its_messages_do_not() -> None:
    exc = RuntimeError("(2003, \"Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)\")")
    assert root_cause(exc, "127.0.0.1:3306").what == "connection lost to 127.0.0.1:3306"
