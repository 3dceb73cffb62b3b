"""`orchestrator.services.failures`: a failure's chain reduced to the cause a user can act on."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pymysql
import pytest

from orchestrator.app.logs import prune_logs
from orchestrator.app.run import other_servers
from orchestrator.config import PipelineConfig
from orchestrator.config.pipeline import parse_config
from orchestrator.errors import RunFailed, StateError, source_timeout
from orchestrator.services.failures import describe, root_cause


def chained(*messages: BaseException) -> BaseException:
    """``messages[0]`` raised from ``messages[1]`` raised from ... (outermost first)."""
    for outer, inner in itertools.pairwise(messages):
        outer.__cause__ = inner
    return messages[0]


CASES = [
    (
        chained(
            RuntimeError("An error occurred while calling o150.parquet."),
            OSError("java.io.IOException: No space left on device"),
        ),
        "no space left on device",
    ),
    (
        OSError(28, "No space left on device", "/lake/shop/t/x.parquet"),
        "no space left on device on /lake/shop/t/x.parquet",
    ),
    (
        RuntimeError(
            "java.io.IOException: Mkdirs failed to create file:/data/lake/_staging/r1 "
            "(exists=false, cwd=file:/work)"
        ),
        "permission denied on /data/lake/_staging/r1",
    ),
    (PermissionError(13, "Permission denied", "/data/lake"), "permission denied on /data/lake"),
    (
        RuntimeError(
            "org.apache.hadoop.fs.ParentNotDirectoryException: /tmp/blocker (is not a directory)"
        ),
        "a parent of the path is a regular file, not a directory on /tmp/blocker",
    ),
    (
        NotADirectoryError(20, "Not a directory", "/tmp/blocker/lake"),
        "a parent of the path is a regular file, not a directory on /tmp/blocker/lake",
    ),
    (
        RuntimeError(
            "java.sql.SQLNonTransientConnectionException: Could not connect to "
            "address=(host=127.0.0.1)(port=3306)(type=master) : Socket fail to connect"
        ),
        "connection lost to 127.0.0.1:3306",
    ),
    (
        RuntimeError(
            "(2003, \"Can't connect to MySQL server "
            "on '10.0.0.5' ([Errno 111] Connection refused)\")"
        ),
        "connection lost",
    ),
    (
        chained(
            RuntimeError(
                "lost the connection to MySQL at 127.0.0.1:53033 and could not get it back"
            ),
            ConnectionRefusedError(111, "Connection refused"),
        ),
        "connection lost to 127.0.0.1:53033",
    ),
    (
        RuntimeError("java.lang.OutOfMemoryError: Java heap space"),
        "the Spark driver ran out of memory (Java OutOfMemoryError)",
    ),
    (
        RuntimeError("Lost executor 1: java.lang.OutOfMemoryError: Java heap space"),
        "the Spark executor ran out of memory (Java OutOfMemoryError)",
    ),
    (
        RuntimeError("(sqlite3.OperationalError) unable to open database file"),
        "the state store cannot be written (read-only database file or directory)",
    ),
    (
        RuntimeError(
            "java.sql.SQLNonTransientConnectionException: Could not connect to "
            "address=(host=10.1.1.1)(port=3307)(type=master) : Read timed out"
        ),
        "no answer from the source 10.1.1.1:3307 within source.read_timeout",
    ),
    (
        pymysql.err.OperationalError(
            2013, "Lost connection to MySQL server during query (timed out)"
        ),
        "no answer from the source within source.read_timeout",
    ),
    (  # Debian's MariaDB Connector/J 2.7 against a CA it was not given (seen here)
        RuntimeError(
            "read of d.big chunks 4..7 failed: java.sql.SQLNonTransientConnectionException: "
            "Could not connect to address=(host=127.0.0.1)(port=40307)(type=master) : Could "
            "not connect to 127.0.0.1:40307 : PKIX path building failed: "
            "sun.security.provider.certpath.SunCertPathBuilderException: unable to find valid "
            "certification path to requested target"
        ),
        "the TLS certificate of the source 127.0.0.1:40307 failed the check source.tls asks for",
    ),
    (  # a Spark read over the user's MAX_USER_CONNECTIONS (seen here, Connector/J 2.7)
        RuntimeError(
            "read of d.big chunks 0..3 failed: java.sql.SQLSyntaxErrorException: Could not "
            "connect to address=(host=127.0.0.1)(port=47899)(type=master) : (conn=21) User 'tm' "
            "has exceeded the 'max_user_connections' resource (current value: 3)"
        ),
        "the source user `tm` opened more connections than it may hold at once (3), "
        "MAX_USER_CONNECTIONS",
    ),
    (  # a Spark read of a user created REQUIRE X509, without its certificate (seen here)
        RuntimeError(
            "read of d.big chunks 0..1 failed: java.sql.SQLException: Access denied for user "
            "'tm_x509'@'127.0.0.1' (using password: YES)"
        ),
        "the source refused the login of user `tm_x509` from 127.0.0.1 (access denied)",
    ),
    (  # executors on a host the user's grants leave out (MariaDB's words, error 1130)
        RuntimeError(
            "read of d.big chunks 0..1 failed: java.sql.SQLException: Host '10.0.1.7' is not "
            "allowed to connect to this MariaDB server"
        ),
        "the source refused a login from 10.0.1.7 (access denied)",
    ),
]


@pytest.mark.parametrize(("exc", "what"), CASES)
def test_root_cause(exc: BaseException, what: str) -> None:
    cause = root_cause(exc)
    assert cause is not None and cause.what == what
    assert "\n" not in describe(exc) and "then rerun" in describe(exc)


def test_innermost_cause_wins() -> None:
    exc = chained(
        RuntimeError("Connection reset while writing"), OSError("No space left on device")
    )
    assert describe(exc).startswith("no space left on device")


def test_a_state_store_on_mysql_refusing_its_login_is_not_taken_for_a_spark_read() -> None:
    """A MySQL or MariaDB state store words a wrong password as the source does; only a JDBC
    driver's refusal is a Spark read's."""
    refused = StateError(
        "state store at mysql+pymysql://st:***@127.0.0.1:57011/tmstate is unreachable or "
        "unusable: (1045, \"Access denied for user 'st'@'127.0.0.1' (using password: YES)\")"
    )
    cause = root_cause(refused)
    assert cause is None or "source refused" not in cause.what


def test_unknown_failure_is_its_first_line() -> None:
    assert root_cause(ValueError("something odd\nmore")) is None
    assert describe(ValueError("something odd\nmore")) == "something odd"


def test_out_of_memory_names_the_setting() -> None:
    assert "spark.driver.memory" in describe(
        RuntimeError("java.lang.OutOfMemoryError: Java heap space")
    )


def test_lost_connection_names_the_source_its_messages_do_not() -> None:
    exc = RuntimeError(
        "(2003, \"Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)\")"
    )
    assert root_cause(exc, "127.0.0.1:3306").what == "connection lost to 127.0.0.1:3306"


def _config(tmp_path: Path, state_url: str) -> PipelineConfig:
    """A pipeline whose state store is at ``state_url`` or, without one, in a SQLite file with
    its Iceberg catalog on PostgreSQL at pg.internal:6543."""
    catalog = "" if state_url else "postgresql+psycopg://u:pw@pg.internal:6543/catalog"
    return parse_config(
        {
            "pipeline": "p",
            "source": {"host": "db.internal", "port": 3306, "user": "u", "server_id": 7},
            "output": {"path": str(tmp_path), **({"catalog": {"uri": catalog}} if catalog else {})},
            "state": {"url": state_url or f"sqlite:///{tmp_path}/s.db"},
            "tables": [{"name": "a.b"}],
        },
        check_env=False,
    )


#: A lost PostgreSQL server as SQLAlchemy raises it over psycopg (libpq's message).
POSTGRES_DOWN = (
    '(psycopg.OperationalError) connection failed: connection to server at "pg.internal" '
    "(10.0.0.5), port 6543 failed: Connection refused\n\tIs the server running on that host "
    "and accepting TCP/IP connections?"
)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql+psycopg://u:pw@pg.internal:6543/state", "the state store (state.url)"),
        ("", "the Iceberg catalog (output.catalog's uri)"),
    ],
)
def test_a_lost_state_store_or_catalog_is_named_not_taken_for_the_source(
    tmp_path: Path, url: str, named: str
) -> None:
    """The run's one line names the server it lost: a PostgreSQL state store or SQL catalog
    refusing connections is not "connection lost to <the source>; check that the source is up"."""
    config = _config(tmp_path, url)
    servers = other_servers(config)
    assert servers["pg.internal:6543"] == named
    error = chained(
        RunFailed("cannot open the Iceberg catalog `tidemark` (output.catalog): ..."),
        Exception(POSTGRES_DOWN),
    )
    cause = root_cause(error, "db.internal:3306", servers)
    assert cause is not None
    assert cause.what == f"connection lost to {named} at pg.internal:6543"
    assert "source" not in cause.fix
    # without the servers it is read as before: a lost connection, the source's fix
    assert str(root_cause(error, "db.internal:3306")).startswith("connection lost to pg.internal")
    # the source's own lost connection still names the source
    source_lost = pymysql.err.OperationalError(2013, "Lost connection to server during query")
    assert root_cause(source_lost, "db.internal:3306", servers) == root_cause(
        source_lost, "db.internal:3306"
    )
    assert "db.internal:3306" in str(root_cause(source_lost, "db.internal:3306", servers))


def test_a_failed_airflow_task_names_the_lost_server_as_the_cli_does(tmp_path: Path) -> None:
    from orchestrator.app.airflow_dags import _described

    error = chained(RunFailed("cannot open the Iceberg catalog"), Exception(POSTGRES_DOWN))
    assert _described(_config(tmp_path, ""), error) == (
        "connection lost to the Iceberg catalog (output.catalog's uri) at pg.internal:6543; "
        "check that it is up and reachable, then rerun"
    )


def test_a_hung_source_says_what_was_waited_for_not_connection_lost() -> None:
    """A `SourceTimeout` wins over the "Lost connection" of the PyMySQL error under it."""
    exc = chained(
        source_timeout("db:3306", 5, "the binlog after b.000002:4"),
        pymysql.err.OperationalError(
            2013, "Lost connection to MySQL server during query (timed out)"
        ),
    )
    cause = root_cause(exc, "db:3306")
    assert cause is not None
    assert cause.what == (
        "no answer from the source db:3306 for 5 s (source.read_timeout) while "
        "waiting for the binlog after b.000002:4"
    )
    assert "raise source.read_timeout" in cause.fix


def test_old_run_logs_are_pruned_keeping_the_newest_and_the_young(tmp_path: Path) -> None:
    day = 86400.0
    now = 100 * day
    ages = {
        f"p-2026010{i}T000000Z-{i}.log": i * 3 * day for i in range(1, 6)
    }  # 3, 6, ... 15 days old
    for name, age in ages.items():
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (now - age, now - age))
    (tmp_path / "other-20260101T000000Z-1.log").write_text("another pipeline's")
    os.utime(tmp_path / "other-20260101T000000Z-1.log", (0, 0))
    deleted = prune_logs(str(tmp_path), "p", keep=2, days=7, now=now)
    # the newest 2 (3 and 6 days) stay; of the rest only those younger than 7 days would: none
    assert sorted(Path(p).name for p in deleted) == sorted(list(ages)[2:])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*list(ages)[:2], "other-20260101T000000Z-1.log"]
    )
    assert prune_logs(str(tmp_path), "p", keep=0, days=4, now=now) == [
        str(tmp_path / list(ages)[1])
    ]


def test_rotated_run_logs_are_pruned_too(tmp_path: Path) -> None:
    day = 86400.0
    now = 100 * day
    names = [
        "p-20260101T000000Z-7.log",
        "p-20260101T000000Z-7.log.1",
        "p-20260101T000000Z-7.log.2",
        "p-20260101T000000Z-7.log.old",
    ]
    for name in names:
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (now - 30 * day, now - 30 * day))
    deleted = prune_logs(str(tmp_path), "p", keep=0, days=7, now=now)
    assert sorted(Path(p).name for p in deleted) == names[:3]  # not a file of another name
