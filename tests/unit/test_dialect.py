"""orchestrator.source.dialect: what MariaDB and MySQL do differently, one row per server."""

from __future__ import annotations

import pytest

from orchestrator.source.dialect import Dialect

# VERSION() (or handshake) string -> flavor, version, binlog status statement, GTID query?, SUPER
# counts?
SERVERS = [
    ("10.11.6-MariaDB-0+deb12u1-log", "mariadb", (10, 11, 6), "SHOW MASTER STATUS", True, False),
    ("5.5.5-10.6.18-MariaDB", "mariadb", (10, 6, 18), "SHOW MASTER STATUS", True, False),
    ("11.4.2-MariaDB", "mariadb", (11, 4, 2), "SHOW MASTER STATUS", True, False),
    ("8.0.36", "mysql", (8, 0, 36), "SHOW MASTER STATUS", False, True),
    ("8.0.36-28", "mysql", (8, 0, 36), "SHOW MASTER STATUS", False, True),  # Percona Server
    ("8.3.0", "mysql", (8, 3, 0), "SHOW MASTER STATUS", False, True),
    ("8.4.2", "mysql", (8, 4, 2), "SHOW BINARY LOG STATUS", False, True),
    ("9.1.0", "mysql", (9, 1, 0), "SHOW BINARY LOG STATUS", False, True),
]


@pytest.mark.parametrize(
    ("version", "flavor", "numbers", "status_sql", "gtid_query", "super_counts"),
    SERVERS,
    ids=[row[0] for row in SERVERS],
)
def test_server(
    version: str,
    flavor: str,
    numbers: tuple[int, ...],
    status_sql: str,
    gtid_query: bool,
    super_counts: bool,
) -> None:
    dialect = Dialect.from_version(version)
    assert (dialect.flavor, dialect.version) == (flavor, numbers)
    assert dialect.binlog_status_sql == status_sql
    assert (dialect.gtid_position_sql is not None) is gtid_query
    assert {"REPLICATION CLIENT", "BINLOG MONITOR"} <= dialect.binlog_monitor_privileges
    assert ("SUPER" in dialect.binlog_monitor_privileges) is super_counts
    assert dialect.grants_include_active_roles is (flavor == "mariadb")
    assert str(dialect) == f"{dialect.name} {'.'.join(map(str, numbers))}"


def test_an_unreadable_version_is_an_old_mysql() -> None:
    dialect = Dialect.from_version("unknown")
    assert (dialect.flavor, dialect.version, str(dialect)) == ("mysql", (), "MySQL")
    assert dialect.binlog_status_sql == "SHOW MASTER STATUS"
