"""What differs between MariaDB and MySQL, in one place: a source server's `Dialect`.

Tidemark reads both. They differ in how a server names itself, in the statement
giving the current binlog position (MySQL 8.4 has only ``SHOW BINARY LOG
STATUS``), in where a position's GTID set comes from, in the privilege names
``SHOW GRANTS`` prints (MariaDB 10.5+ prints REPLICATION CLIENT as BINLOG
MONITOR), and in whether ``SHOW GRANTS`` includes the active roles' privileges.
Everything else Tidemark sends is common SQL. The JDBC driver classes of the
two Connector/Js live here too (either driver reads either server).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Flavor = Literal["mariadb", "mysql"]

#: The JDBC driver class of MariaDB Connector/J.
MARIADB_DRIVER = "org.mariadb.jdbc.Driver"
#: The JDBC driver class of MySQL Connector/J.
MYSQL_DRIVER = "com.mysql.cj.jdbc.Driver"

_VERSION = re.compile(r"\d+(?:\.\d+)*")


@dataclass(frozen=True, slots=True)
class Dialect:
    """A source server's flavor and version, and the SQL and privilege names that follow.

    Attributes:
        flavor: ``mariadb`` or ``mysql``.
        version: the release as numbers, e.g. ``(10, 11, 6)``; empty if unreadable.
    """

    flavor: Flavor
    version: tuple[int, ...] = ()

    @classmethod
    def from_version(cls, version: str) -> Dialect:
        """The dialect of a server from its ``VERSION()`` (or handshake) string.

        >>> Dialect.from_version("10.11.6-MariaDB-0+deb12u1-log")
        Dialect(flavor='mariadb', version=(10, 11, 6))
        >>> Dialect.from_version("5.5.5-10.11.6-MariaDB")  # the handshake's prefix for old replicas
        Dialect(flavor='mariadb', version=(10, 11, 6))
        >>> Dialect.from_version("8.4.2")
        Dialect(flavor='mysql', version=(8, 4, 2))
        """
        flavor: Flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
        text = version.removeprefix("5.5.5-") if flavor == "mariadb" else version
        found = _VERSION.match(text)
        return cls(flavor, tuple(int(n) for n in found.group().split(".")) if found else ())

    def __str__(self) -> str:
        """``MariaDB 10.11.6``."""
        return f"{self.name} {'.'.join(map(str, self.version))}".rstrip()

    @property
    def name(self) -> str:
        """The product's name, for messages: ``MariaDB`` or ``MySQL``."""
        return "MariaDB" if self.flavor == "mariadb" else "MySQL"

    @property
    def binlog_status_sql(self) -> str:
        """The statement whose row holds the current binlog ``File`` and ``Position``.

        >>> (Dialect("mysql", (8, 4, 0)).binlog_status_sql,
        ...  Dialect("mariadb", (11, 4)).binlog_status_sql)
        ('SHOW BINARY LOG STATUS', 'SHOW MASTER STATUS')
        """
        if self.flavor == "mysql" and self.version >= (8, 4):
            return "SHOW BINARY LOG STATUS"  # MySQL 8.4 removed SHOW MASTER STATUS
        return "SHOW MASTER STATUS"

    @property
    def isolation(self) -> str:
        """The session variable of the transaction isolation level: ``tx_isolation`` on MariaDB
        before 11.1 and MySQL before 5.7.20, ``transaction_isolation`` since (MySQL 8 has only
        it). Tidemark's sessions set it to REPEATABLE-READ, the server's default: a global READ
        UNCOMMITTED read rows a transaction then rolled back into the lake, READ COMMITTED takes
        no consistent snapshot (`orchestrator.source.snapshot`).

        >>> Dialect("mariadb", (10, 11, 6)).isolation, Dialect("mysql", (8, 0, 36)).isolation
        ('tx_isolation', 'transaction_isolation')
        """
        newer = (11, 1) if self.flavor == "mariadb" else (5, 7, 20)
        return "transaction_isolation" if self.version >= newer else "tx_isolation"

    @property
    def statement_limit(self) -> str | None:
        """The session variable that bounds a statement's time: MariaDB's ``max_statement_time``
        (any statement), MySQL's ``max_execution_time`` (a SELECT; from 5.7.8); None before.

        Tidemark's sessions set it to 0, no limit, as MariaDB's ``mariadb-dump`` does: a global
        limit a DBA set against runaway queries cut a long read short (a table read whole by
        the driver, a chunk), and the run failed as if the source were hung, at every rerun.
        ``source.read_timeout`` bounds each wait instead, and a chunk's statement.

        >>> Dialect("mariadb", (10, 11)).statement_limit, Dialect("mysql", (8, 0)).statement_limit
        ('max_statement_time', 'max_execution_time')
        >>> Dialect("mysql", (5, 6, 40)).statement_limit is None
        True
        """
        if self.flavor == "mariadb":
            return "max_statement_time"
        return "max_execution_time" if self.version >= (5, 7, 8) else None

    @property
    def gtid_position_sql(self) -> str | None:
        """The query of the GTID set at a binlog position (``%s`` for file and position);
        None on MySQL, whose binlog status row carries it as ``Executed_Gtid_Set``."""
        return "SELECT BINLOG_GTID_POS(%s, %s)" if self.flavor == "mariadb" else None

    @property
    def identity_sql(self) -> str:
        """The query of the server's identity: ``server_id`` and ``server_uuid`` (NULL on
        MariaDB, which has none).

        >>> Dialect("mysql").identity_sql, Dialect("mariadb").identity_sql
        ('SELECT @@global.server_id, @@global.server_uuid', 'SELECT @@global.server_id, NULL')
        """
        return (
            "SELECT @@global.server_id, "
            f"{'NULL' if self.flavor == 'mariadb' else '@@global.server_uuid'}"
        )

    @property
    def identity_gtid_sql(self) -> str | None:
        """`identity_sql` and the GTID set at the end of the binlog (MariaDB's
        ``gtid_binlog_pos``); None on MySQL, whose binlog status row carries the set.

        >>> Dialect("mariadb").identity_gtid_sql, Dialect("mysql").identity_gtid_sql
        ('SELECT @@global.server_id, NULL, @@global.gtid_binlog_pos', None)
        """
        return (
            self.identity_sql + ", @@global.gtid_binlog_pos" if self.flavor == "mariadb" else None
        )

    @property
    def position_identity_sql(self) -> str:
        """`identity_sql` and, on MariaDB, the GTID set at a binlog position (``%s`` for file and
        position; NULL on MySQL): asked on the connection that read the position, right after it."""
        return self.identity_sql + (
            ", BINLOG_GTID_POS(%s, %s)" if self.flavor == "mariadb" else ", NULL"
        )

    @property
    def srid_sql(self) -> str | None:
        """The query of the SRIDs a table's spatial columns declare (``%s`` for the database and
        the table; rows of column name and SRID): MariaDB's ``GEOMETRY_COLUMNS`` (0 for a column
        declaring none), MySQL 8's ``COLUMNS.SRS_ID`` (NULL for one declaring none); None on MySQL
        before 8, where no column declares one.

        >>> Dialect("mysql", (5, 7, 44)).srid_sql is None
        True
        """
        if self.flavor == "mariadb":
            return (
                "SELECT G_GEOMETRY_COLUMN, SRID FROM information_schema.GEOMETRY_COLUMNS"
                " WHERE G_TABLE_SCHEMA = %s AND G_TABLE_NAME = %s"
            )
        if self.version >= (8,):
            return (
                "SELECT COLUMN_NAME, SRS_ID FROM information_schema.COLUMNS"
                " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND SRS_ID IS NOT NULL"
            )
        return None

    def logs_cascades(self, native_foreign_keys: str | None) -> bool:
        """Whether the server writes row events for the child rows its foreign-key actions change:
        MySQL 9.6 and later run foreign keys in the SQL layer, which logs them, unless started with
        ``innodb_native_foreign_keys=ON`` (``native_foreign_keys``: that variable's value, None
        where the server lacks it); InnoDB's own cascades (MariaDB, MySQL before 9.6) log nothing.

        >>> Dialect.from_version("9.6.0").logs_cascades("OFF")
        True
        >>> Dialect.from_version("9.6.0").logs_cascades("ON")
        False
        >>> Dialect.from_version("9.5.0").logs_cascades(None)
        False
        >>> Dialect.from_version("11.8.2-MariaDB-log").logs_cascades(None)
        False
        """
        if self.flavor != "mysql" or self.version < (9, 6):
            return False
        return (native_foreign_keys or "OFF").upper() not in ("ON", "1")

    @property
    def binlog_monitor_privileges(self) -> frozenset[str]:
        """The privileges (any one) that let a user read binlog positions (``SHOW BINARY LOGS``
        and `binlog_status_sql`), as ``SHOW GRANTS`` prints them.

        REPLICATION CLIENT is printed as BINLOG MONITOR by MariaDB 10.5+; on MySQL,
        SUPER implies it.

        >>> sorted(Dialect("mysql").binlog_monitor_privileges)
        ['BINLOG MONITOR', 'REPLICATION CLIENT', 'SUPER']
        """
        names = {"REPLICATION CLIENT", "BINLOG MONITOR"}
        return frozenset(names if self.flavor == "mariadb" else names | {"SUPER"})

    @property
    def grants_include_active_roles(self) -> bool:
        """Whether plain ``SHOW GRANTS`` includes the active roles' privileges: MariaDB's
        does; MySQL's shows them only when asked ``USING`` the roles."""
        return self.flavor == "mariadb"
