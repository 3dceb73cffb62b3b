"""The source MySQL/MariaDB: one PyMySQL connection, retried on transient errors.

Everything Tidemark asks the source outside Spark and the binlog reader goes
through `Source`: table shapes from ``information_schema``, binlog positions,
server variables. A `Source` is not thread-safe; open one per thread.

Connection problems become `SourceNotReady` with one line that names the host,
port and user and says what to check. The password never appears in a message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

import pymysql
import tenacity

from chunking.mysql import SESSION_SQL_MODE, UNBOUNDED_SELECTS
from orchestrator.config import PipelineConfig, SourceConfig
from orchestrator.errors import RunFailed, SourceNotReady, source_timeout
from orchestrator.positions import BinlogPosition, ServerIdentity
from orchestrator.schema.families import SPATIAL_TYPES
from orchestrator.schema.tables import VERSIONED, ColumnInfo, TableInfo, mark_keys
from orchestrator.source.connect import connect
from orchestrator.source.dialect import Dialect
from orchestrator.source.login import login_problem
from orchestrator.source.retry import error_code, is_connection_lost, is_timeout, transient_retry
from orchestrator.source.tls import pymysql_settings

log = logging.getLogger(__name__)

Row = tuple[Any, ...]

_COLUMNS_SQL = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,"
    " DATETIME_PRECISION, CHARACTER_SET_NAME, COLLATION_NAME"
    " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    " ORDER BY ORDINAL_POSITION"
)
_INDEXES_SQL = (
    "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SUB_PART"
    " FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    " ORDER BY INDEX_NAME, SEQ_IN_INDEX"
)
_TABLE_SQL = (
    "SELECT TABLE_ROWS, ENGINE, TABLE_TYPE FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
#: MariaDB gives a declared period column the generation expression ROW START or ROW END.
_ROW_END_SQL = (
    "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s"
    " AND TABLE_NAME = %s AND GENERATION_EXPRESSION = 'ROW END'"
)
_NO_BINLOG = 1381  # ER_NO_BINARY_LOGGING: "You are not using binary logging"
_UNKNOWN_TIME_ZONE = 1298


class Source:
    """A connection to the source server, opened on first use and reopened after a loss.

    Args:
        config: the pipeline's ``source:`` section.
        password: the resolved password (see `PipelineConfig.resolve_password`).
        retry: the policy for transient errors; default `transient_retry()`.
    """

    def __init__(
        self,
        config: SourceConfig,
        password: str,
        *,
        retry: tenacity.Retrying | None = None,
        known_good: bool = False,
    ) -> None:
        self.config = config
        self._password = password
        self._retry = retry if retry is not None else transient_retry()
        self._conn: pymysql.connections.Connection[Any] | None = None
        # known_good: the source worked earlier in this run, so "can't connect" means it is
        # restarting and is retried like a lost connection.
        self._connected_once = known_good
        self._version: str | None = None
        self._connections = 0  # connections opened so far: a reconnect changes it

    @classmethod
    def from_pipeline(cls, config: PipelineConfig, *, known_good: bool = False) -> Source:
        """A `Source` for a pipeline, with the password resolved from its config.

        Args:
            config: the pipeline.
            known_good: the source was reached earlier in this run (a later step).
        """
        return cls(config.source, config.resolve_password(), known_good=known_good)

    def __enter__(self) -> Source:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Source({self.address} as {self.config.user})"

    @property
    def address(self) -> str:
        """``host:port``, for messages."""
        return f"{self.config.host}:{self.config.port}"

    @property
    def connections(self) -> int:
        """Connections opened so far: a statement that reconnected changes it (what a
        transaction began on the connection before is gone)."""
        return self._connections

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(pymysql.err.Error):  # already closed, or a dead socket
                conn.close()

    # ------------------------------------------------------------------ connection

    def _connect(self) -> pymysql.connections.Connection[Any]:
        cfg = self.config
        try:
            conn = connect(
                host=cfg.host,
                port=cfg.port,
                user=cfg.user,
                password=self._password,
                connect_timeout=cfg.connect_timeout,
                read_timeout=cfg.read_timeout,
                write_timeout=cfg.read_timeout,
                charset="utf8mb4",
                autocommit=True,
                **pymysql_settings(cfg.tls),
            )
        except pymysql.err.MySQLError as exc:
            if is_timeout(exc):  # accepted the connection, never greeted: hung, not restarting
                raise self._timeout("its greeting (a new connection)") from exc
            # Too many connections, or a handshake cut short: worth another try. Can't
            # connect: only for a source that worked before (it is restarting); on the
            # first connection a wrong host or port should fail at once.
            if error_code(exc) in (1040, 2013) or (
                is_connection_lost(exc) and self._connected_once
            ):
                raise
            raise SourceNotReady(login_problem(cfg, exc)) from exc
        try:
            with conn.cursor() as cur:
                cur.execute(*_session_settings(cfg, conn.get_server_info()))
        except pymysql.err.MySQLError as exc:
            conn.close()
            if error_code(exc) == _UNKNOWN_TIME_ZONE:
                raise SourceNotReady(
                    f"source.time_zone {cfg.time_zone!r} is unknown to MySQL at {self.address}; "
                    "use an offset such as +00:00, or load the server's time zone tables "
                    "(mariadb-tzinfo-to-sql / mysql_tzinfo_to_sql)"
                ) from exc
            raise
        self._connections += 1
        if not self._connected_once:
            log.debug("connected to %s as %s", self.address, cfg.user)
        self._connected_once = True
        return conn

    def _execute_once(self, sql: str, params: Sequence[Any] | None) -> tuple[list[str], list[Row]]:
        if self._conn is None:
            self._conn = self._connect()
        try:
            with self._conn.cursor() as cur:
                cur.execute(sql, tuple(params) if params is not None else None)
                names = [d[0] for d in cur.description] if cur.description else []
                return names, [tuple(r) for r in cur.fetchall()]
        except pymysql.err.MySQLError as exc:
            if is_connection_lost(exc):
                self.close()
            raise

    def _execute(
        self, sql: str, params: Sequence[Any] | None = None
    ) -> tuple[list[str], list[Row]]:
        """Run one statement under the retry policy; returns column names and rows."""
        try:
            result: tuple[list[str], list[Row]] = self._retry(self._execute_once, sql, params)
        except pymysql.err.MySQLError as exc:
            if is_timeout(exc):
                raise self._timeout(f"the answer to `{' '.join(sql.split()[:6])}`") from exc
            attempts = self._retry.statistics.get("attempt_number", 1)
            if not self._connected_once and (is_connection_lost(exc) or error_code(exc) == 1040):
                raise SourceNotReady(login_problem(self.config, exc)) from exc
            if is_connection_lost(exc):
                raise SourceNotReady(
                    f"lost the connection to MySQL at {self.address} and could not get it back "
                    f"after {attempts} attempt(s) ({exc}); check that the server is up and "
                    "reachable"
                ) from exc
            if error_code(exc) in (1040, 1205, 1213):
                raise RunFailed(
                    f"query on {self.address} kept failing after {attempts} attempt(s) ({exc}); "
                    "a rerun resumes where this one stopped"
                ) from exc
            raise
        return result

    def _timeout(self, waiting_for: str) -> RunFailed | SourceNotReady:
        """A hung source: a `SourceTimeout` after the run started, "not ready" before
        (`doctor`, preflight: the source never answered this process)."""
        error = source_timeout(self.address, self.config.read_timeout, waiting_for)
        return error if self._connected_once else SourceNotReady(str(error))

    # ------------------------------------------------------------------ queries

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        """Run one statement and return its rows; retried (and reconnected) on transient errors.

        Args:
            sql: the statement, with ``%s`` placeholders.
            params: values for the placeholders, escaped by PyMySQL.
        """
        return self._execute(sql, params)[1]

    def batches(self, sql: str, rows: int) -> Iterator[list[Row]]:
        """Run one statement unbuffered and yield its rows, at most ``rows`` at a time (the result
        is streamed: memory holds one batch). Not retried: a lost connection raises
        `SourceNotReady` and a hung one a timeout, and the caller reads again from the start."""
        if self._conn is None:
            self._conn = self._retry(self._connect)
        try:
            with self._conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(sql)
                while batch := cur.fetchmany(rows):
                    yield [tuple(r) for r in batch]
        except pymysql.err.MySQLError as exc:
            if is_timeout(exc):
                self.close()
                raise self._timeout(f"the rows of `{' '.join(sql.split()[:6])}`") from exc
            if is_connection_lost(exc):
                self.close()
                raise SourceNotReady(
                    f"lost the connection to MySQL at {self.address} ({exc})"
                ) from exc
            raise

    def server_version(self) -> str:
        """``SELECT VERSION()``, e.g. ``10.11.6-MariaDB-0+deb12u1-log``."""
        if self._version is None:
            self._version = str(self.query("SELECT VERSION()")[0][0])
        return self._version

    @property
    def dialect(self) -> Dialect:
        """What this server does its own way: MariaDB or MySQL, and which version."""
        return Dialect.from_version(self.server_version())

    def variables(self, *names: str) -> dict[str, str | None]:
        """Global variables by name; None for a variable this server does not have.

        Args:
            names: variable names, e.g. ``"binlog_format"``.
        """
        found: dict[str, str | None] = {}
        if names:
            marks = ", ".join(["%s"] * len(names))
            rows = self.query(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})", names)
            found = {
                str(name).lower(): None if value is None else str(value) for name, value in rows
            }
        return {name: found.get(name.lower()) for name in names}

    def current_user(self) -> str:
        """The account the server matched, as ``user@host`` (``CURRENT_USER()``)."""
        return str(self.query("SELECT CURRENT_USER()")[0][0])

    # ------------------------------------------------------------------ binlog

    def current_position(self) -> BinlogPosition:
        """The server's current binlog position, stamped with the server's identity and the
        GTID set there (None when the server has no GTIDs).

        Asks the dialect's binlog status statement (``SHOW BINARY LOG STATUS`` on MySQL 8.4+,
        ``SHOW MASTER STATUS`` elsewhere) and, on the same connection, the identity; a
        reconnect in between (another server may answer behind a proxy) asks again. MySQL's
        status row holds the GTID set. On MariaDB the identity and ``@@gtid_binlog_pos`` are
        asked in one statement just before and just after the status (`_mariadb_gtid`).

        Raises:
            SourceNotReady: the binlog is off.
        """
        dialect = self.dialect
        around = dialect.identity_gtid_sql
        for _ in range(3):
            before = tuple(self.query(around)[0]) if around is not None else None
            connection = self._connections
            row = self.binlog_status()
            if not row:
                raise self._binlog_off()
            file, pos = str(row["file"]), int(row["position"])
            if around is None:
                server_id, server_uuid = self.query(dialect.identity_sql)[0]
                gtid = row.get("executed_gtid_set")
            else:
                server_id, server_uuid, gtid = self._mariadb_gtid(around, before, file, pos)
            if self._connections == connection:
                break
        else:
            raise RunFailed(
                f"the connection to {self.address} was lost each time its binlog position "
                "was read; check that the server is up, then rerun"
            )
        gtid_set = str(gtid).replace("\n", "") if gtid else None
        return BinlogPosition(file, pos).on(
            ServerIdentity(int(server_id), _text(server_uuid)), gtid_set
        )

    def _mariadb_gtid(self, around: str, before: Any, file: str, pos: int) -> tuple[Any, ...]:
        """The identity and GTID position at ``file``:``pos``, which the binlog status statement
        just read after ``before``, the row of ``around`` (`Dialect.identity_gtid_sql`: the
        identity and ``@@gtid_binlog_pos``).

        MariaDB gives an event group its GTID (the one ``@@gtid_binlog_pos`` then shows) and
        writes its events under the binlog's lock, which the status statement takes too. So
        when the same server answers the same before and after, no group was written meanwhile,
        and the position is the end of the groups that set names: the set at the position.
        Otherwise (a commit came in between) the identity and ``BINLOG_GTID_POS`` of the
        position are asked. That function reads the binlog file from its start up to the
        position: 0.1-0.14 s of the server's time at 500 MiB into a file (docs/performance.md,
        "Incremental"), and a run asks the current position at least twice."""
        after = tuple(self.query(around)[0])
        if after == before:
            return after
        return tuple(self.query(self.dialect.position_identity_sql, (file, pos))[0])

    def binlog_status(self) -> dict[str, Any]:
        """The row of the dialect's binlog status statement by lower-case column name: ``file``,
        ``position``, ``binlog_do_db``, ``binlog_ignore_db`` (the same on MariaDB and MySQL) and,
        on MySQL, ``executed_gtid_set``; empty when the binlog is off."""
        names, rows = self._execute(self.dialect.binlog_status_sql)
        return dict(zip((n.lower() for n in names), rows[0], strict=True)) if rows else {}

    def identity(self) -> ServerIdentity:
        """Which server answers: ``@@server_id``, and ``@@server_uuid`` on MySQL."""
        server_id, server_uuid = self.query(self.dialect.identity_sql)[0]
        return ServerIdentity(int(server_id), _text(server_uuid))

    def binlogs(self) -> list[tuple[str, int]]:
        """The binlog files still on the server, ``(name, size)``, oldest first.

        Raises:
            SourceNotReady: the binlog is off.
        """
        try:
            rows = self.query("SHOW BINARY LOGS")
        except pymysql.err.MySQLError as exc:
            if error_code(exc) == _NO_BINLOG:
                raise self._binlog_off() from exc
            raise
        return [(str(r[0]), int(r[1])) for r in rows]

    def oldest_binlog(self) -> str | None:
        """The oldest binlog file still on the server, or None if there is none."""
        logs = self.binlogs()
        return logs[0][0] if logs else None

    def _binlog_off(self) -> SourceNotReady:
        return SourceNotReady(
            f"the binlog is off on {self.address} (log_bin = OFF); start the server with "
            "log_bin enabled (my.cnf: log_bin = binlog) and a server_id"
        )

    # ------------------------------------------------------------------ tables

    def table_info(self, name: str) -> TableInfo:
        """A table's columns (ordinal order), keys and row estimate from ``information_schema``.

        ``unique_not_null_keys`` lists every unique index whose columns are all NOT
        NULL and fully indexed (no prefix), the primary key first when there is one.

        Args:
            name: ``database.table``.

        Raises:
            SourceNotReady: the table does not exist (or the user cannot see it).
        """
        database, _, table = name.partition(".")
        found = self.query(_TABLE_SQL, (database, table))
        if not found:
            raise SourceNotReady(
                f"table {name} does not exist on {self.address} (as seen by user "
                f"`{self.config.user}`); check the table name in the config's tables list "
                "and that the user has SELECT on it"
            )
        rows, engine, kind = found[0]
        info = shaped(
            database,
            table,
            self.query(_COLUMNS_SQL, (database, table)),
            self.query(_INDEXES_SQL, (database, table)),
            rows,
            engine,
            kind,
        )
        return self.with_row_end(self.with_srids(info))

    def with_row_end(self, info: TableInfo) -> TableInfo:
        """``info`` with the ``GENERATED ALWAYS AS ROW END`` column a system-versioned table
        declares (`TableInfo.row_end`); one query, and only for such a table."""
        if not info.versioned:
            return info
        found = self.period_end(info.database, info.table)
        return dataclasses.replace(info, row_end=found[0] if found else None)

    def period_end(self, database: str, table: str) -> tuple[str, str] | None:
        """The name and ``COLUMN_TYPE`` of the ``GENERATED ALWAYS AS ROW END`` column a
        system-versioned table declares; None when it declares none (its hidden one is a
        `orchestrator.schema.tables.PERIOD_BY_TIME`)."""
        found = self.query(_ROW_END_SQL, (database, table))
        if not found:
            return None
        name, column_type = found[0]
        return _text(name) or "", (_text(column_type) or "").lower()

    def with_srids(self, info: TableInfo) -> TableInfo:
        """``info`` with the SRID each spatial column declares (`ColumnInfo.srid`); one query, and
        only for a table that has spatial columns."""
        sql = self.dialect.srid_sql
        if sql is None or not any(c.data_type in SPATIAL_TYPES for c in info.columns):
            return info
        declared = {
            (_text(name) or "").lower(): _int(srid)
            for name, srid in self.query(sql, (info.database, info.table))
        }
        return dataclasses.replace(
            info,
            columns=tuple(
                dataclasses.replace(c, srid=declared.get(c.name.lower()))
                if c.data_type in SPATIAL_TYPES
                else c
                for c in info.columns
            ),
        )


def _session_settings(cfg: SourceConfig, version: str) -> tuple[str, tuple[object, ...]]:
    """The ``SET`` of each source session: its time zone, `SESSION_SQL_MODE`, REPEATABLE READ
    (`Dialect.isolation`), no statement time limit (`Dialect.statement_limit`) and
    `UNBOUNDED_SELECTS`."""
    dialect = Dialect.from_version(version)
    limit = f", {dialect.statement_limit} = 0" if dialect.statement_limit else ""
    unbounded = "".join(f", {k} = {v}" for k, v in UNBOUNDED_SELECTS.items())
    return (
        f"SET time_zone = %s, sql_mode = %s, {dialect.isolation} = 'REPEATABLE-READ'{limit}"
        f"{unbounded}",
        (cfg.time_zone, SESSION_SQL_MODE),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ReadSession:
    """What the Spark reads' sessions follow from the source (`reads_session`): its dialect,
    and whether it gives its clients TLS (this process's connections have it)."""

    dialect: Dialect
    tls: bool


_read_sessions: dict[tuple[str, int], ReadSession] = {}
_read_sessions_lock = threading.Lock()


def reads_session(config: PipelineConfig) -> ReadSession:
    """The source's `ReadSession`, asked once a process (its version, the session status
    ``Ssl_cipher``) for the Spark reads' settings (`orchestrator.pipeline.read.jdbc.jdbc_url`)."""
    key = (config.source.host, config.source.port)
    with _read_sessions_lock:
        if key not in _read_sessions:
            with Source.from_pipeline(config, known_good=True) as source:
                rows = source.query("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
                _read_sessions[key] = ReadSession(source.dialect, bool(rows and rows[0][1]))
        return _read_sessions[key]


def shaped(
    database: str,
    table: str,
    column_rows: Sequence[Row],
    index_rows: Sequence[Row],
    rows: Any,
    engine: Any,
    kind: Any,
) -> TableInfo:
    """A table's `TableInfo` from its ``information_schema`` rows (COLUMNS, STATISTICS) and
    TABLES' row estimate, engine and type, its key columns marked (`mark_keys`)."""
    columns = tuple(_column(r) for r in column_rows)
    primary, uniques = _keys(list(index_rows), columns)
    return TableInfo(
        database=database,
        table=table,
        columns=mark_keys(columns, [primary, *uniques]),
        primary_key=primary,
        unique_not_null_keys=uniques,
        row_estimate=int(rows or 0),
        engine=None if engine is None else str(engine),
        versioned=_text(kind) == VERSIONED,
        kind=_text(kind),
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _column(row: Row) -> ColumnInfo:
    name, data_type, column_type, nullable, precision, scale, dt_precision, charset, collation = row
    return ColumnInfo(
        name=_text(name) or "",
        data_type=(_text(data_type) or "").lower(),
        column_type=_text(column_type) or "",
        nullable=_text(nullable) == "YES",
        precision=_int(precision),
        scale=_int(scale),
        datetime_precision=_int(dt_precision),
        charset=_text(charset),
        collation=_text(collation),
    )


def _keys(
    rows: list[Row], columns: tuple[ColumnInfo, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """The primary key and the unique NOT NULL keys from ``information_schema.STATISTICS`` rows."""
    not_null = {c.name for c in columns if not c.nullable}
    indexes: dict[str, list[str | None]] = {}
    unique: set[str] = set()
    for index, non_unique, column, sub_part in rows:
        index = _text(index) or ""
        # A prefix (sub_part) or expression (no column) index says nothing about whole values.
        indexes.setdefault(index, []).append(None if sub_part is not None else _text(column))
        if int(non_unique) == 0:
            unique.add(index)
    primary: tuple[str, ...] = ()
    keys: list[tuple[str, ...]] = []
    for index in sorted(unique, key=lambda i: (i != "PRIMARY", i)):
        cols = indexes[index]
        if any(c is None or c not in not_null for c in cols):
            continue
        key = tuple(c for c in cols if c is not None)
        if index == "PRIMARY":
            primary = key
        keys.append(key)
    return primary, tuple(keys)
