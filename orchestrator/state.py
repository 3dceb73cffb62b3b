"""The state store: what has been planned, read, captured and published.

SQLAlchemy 2.x Core over any URL: an SQLite file by default (WAL, a busy
timeout, foreign keys on), PostgreSQL or MySQL for deployments where Airflow
workers sit on several machines. The ``tm_*`` tables are created on first use;
``tm_schema_version`` holds the schema's version, and ``MIGRATIONS`` upgrades
an older store step by step. A store newer than this code is refused.

Positions, key bounds, option and info dicts are stored as JSON text: the
caller hands in JSON-able values and gets the same values back (big integers
and nested lists included). Timestamps are timezone-aware UTC.

Every method is its own short transaction: a process killed at any point
leaves the store consistent, and each step's result is recorded before the
step returns, so a rerun skips what is done. On SQLite, writing transactions
start with ``BEGIN IMMEDIATE`` so that processes sharing the file queue for
the write lock instead of failing on a stale read snapshot.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    DateTime,
    Dialect,
    Engine,
    ForeignKey,
    Index,
    Insert,
    Integer,
    MetaData,
    Row,
    String,
    Table,
    Text,
    TypeDecorator,
    and_,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.types import TypeEngine

from orchestrator.errors import RunLocked, StateError

log = logging.getLogger("tidemark.state")

RunStatus = Literal["running", "failed", "succeeded"]
TableMode = Literal["snapshot", "incremental"]
TableStatus = Literal["planned", "read", "captured", "reconciled", "published"]
ChunkStatus = Literal["pending", "done"]

#: ``MIGRATIONS[i]`` upgrades a store from schema version ``i + 1`` to ``i + 2``,
#: inside the transaction that then records the new version.
MIGRATIONS: list[Callable[[Connection], None]] = []

SQLITE_BUSY_TIMEOUT_MS = 30_000
_PG_SCHEMA_LOCK_KEY = 0x7469_6465  # pg_advisory_xact_lock key serialising schema creation
_LOCK_ATTEMPTS = 5


def code_schema_version() -> int:
    """The schema version this code writes: 1 plus one per migration."""
    return 1 + len(MIGRATIONS)


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    pipeline: str
    status: RunStatus
    options: dict[str, Any]  # {"tables": [...], "snapshot": bool, "chunk_size": int|None}
    start_position: dict[str, Any] | None  # P0, BinlogPosition.to_json()
    high_position: dict[str, Any] | None  # H
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True, slots=True)
class RunTableRecord:
    run_id: str
    table: str  # "db.table"
    mode: TableMode
    status: TableStatus
    strategy: str | None
    chunk_key: list[str]
    info: dict[str, Any]  # columns, planning numbers, from_position for incremental, ...
    rows: int | None
    version: int | None


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    run_id: str
    table: str
    index: int  # 0.. within the table
    batch: int  # batch number within the run (a batch spans one table)
    start: Any  # JSON-encoded key bound (list of values) or None = unbounded
    end: Any
    where: str  # SQL predicate for the chunk
    status: ChunkStatus
    low: dict[str, Any] | None  # L, recorded before the batch's reads started
    high: dict[str, Any] | None  # Hb, recorded after they ended
    rows: int | None
    bytes: int | None
    path: str | None
    attempts: int


@dataclass(frozen=True, slots=True)
class TableCheckpoint:
    pipeline: str
    table: str
    version: int
    position: dict[str, Any]  # H of the published version
    rows: int
    manifest: str  # path/URI of the version's manifest
    run_id: str
    published_at: datetime


@dataclass(frozen=True, slots=True)
class LockRecord:
    """Who holds a pipeline's lock. ``pid`` is None when the holder asked for lease-only."""

    pipeline: str
    holder: str
    hostname: str
    pid: int | None
    acquired_at: datetime
    refreshed_at: datetime


@dataclass(frozen=True, slots=True)
class TableProgress:
    """One table of a run, for ``tidemark status``: ``rows_read`` sums the done chunks."""

    run_id: str
    run_status: RunStatus
    table: str
    mode: TableMode
    status: TableStatus
    chunks_done: int
    chunks_total: int
    rows_read: int
    rows: int | None
    version: int | None


# --- column types --------------------------------------------------------------


class _UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes everywhere; stored naive-UTC where the column has no zone."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=dialect.name == "postgresql"))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"timestamp {value.isoformat()} has no time zone; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class _JsonText(TypeDecorator[Any]):
    """A JSON-able value as ``json.dumps`` text; Python None is SQL NULL."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.LONGTEXT())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value, allow_nan=False)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


# --- schema --------------------------------------------------------------------

METADATA = MetaData()
_NAME = String(255)
_RUN_ID = String(64)
_LONG_TEXT = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
_MYSQL: dict[str, Any] = {"mysql_charset": "utf8mb4"}  # names, paths and predicates may be any unicode


def _run_fk() -> Column[str]:
    return Column("run_id", _RUN_ID, ForeignKey("tm_runs.run_id"), primary_key=True)


SCHEMA = Table(
    "tm_schema_version", METADATA,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
PIPELINES = Table(
    "tm_pipelines", METADATA,
    Column("name", _NAME, primary_key=True),
    Column("created_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
RUNS = Table(
    "tm_runs", METADATA,
    Column("run_id", _RUN_ID, primary_key=True),
    Column("pipeline", _NAME, ForeignKey("tm_pipelines.name"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("options", _JsonText, nullable=False),
    Column("start_position", _JsonText),
    Column("high_position", _JsonText),
    Column("created_at", _UTCDateTime, nullable=False),
    Column("updated_at", _UTCDateTime, nullable=False),
    Column("finished_at", _UTCDateTime),
    Column("error", _LONG_TEXT),
    Index("tm_runs_pipeline_created", "pipeline", "created_at"),
    **_MYSQL,
)
RUN_TABLES = Table(
    "tm_run_tables", METADATA,
    _run_fk(),
    Column("table_name", _NAME, primary_key=True),
    Column("mode", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("strategy", String(64)),
    Column("chunk_key", _JsonText, nullable=False),
    Column("info", _JsonText, nullable=False),
    Column("row_count", BigInteger),
    Column("version", Integer),
    **_MYSQL,
)
CHUNKS = Table(
    "tm_chunks", METADATA,
    _run_fk(),
    Column("table_name", _NAME, primary_key=True),
    Column("chunk_index", Integer, primary_key=True, autoincrement=False),
    Column("batch_no", Integer, nullable=False),
    Column("start_bound", _JsonText),
    Column("end_bound", _JsonText),
    Column("where_sql", _LONG_TEXT, nullable=False),
    Column("status", String(16), nullable=False),
    Column("low_position", _JsonText),
    Column("high_position", _JsonText),
    Column("row_count", BigInteger),
    Column("byte_count", BigInteger),
    Column("path", _LONG_TEXT),
    Column("attempts", Integer, nullable=False),
    Index("tm_chunks_run_batch", "run_id", "batch_no"),
    **_MYSQL,
)
CAPTURE_CHECKPOINTS = Table(
    "tm_capture_checkpoints", METADATA,
    _run_fk(),
    Column("position", _JsonText, nullable=False),
    Column("segments", Integer, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("updated_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
TABLE_CHECKPOINTS = Table(
    "tm_table_checkpoints", METADATA,
    Column("pipeline", _NAME, ForeignKey("tm_pipelines.name"), primary_key=True),
    Column("table_name", _NAME, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("position", _JsonText, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("manifest", _LONG_TEXT, nullable=False),
    Column("run_id", _RUN_ID, nullable=False),  # no FK: a checkpoint outlives its run's rows
    Column("published_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
LOCKS = Table(
    "tm_locks", METADATA,
    Column("pipeline", _NAME, primary_key=True),
    Column("holder", _NAME, nullable=False),
    Column("hostname", _NAME, nullable=False),
    Column("pid", Integer),
    Column("token", String(32), nullable=False),  # changes on every takeover: compare-and-swap
    Column("acquired_at", _UTCDateTime, nullable=False),
    Column("refreshed_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)

FORGET_KINDS = ("runs", "run_tables", "chunks", "capture_checkpoints", "table_checkpoints", "locks")


def _now() -> datetime:
    return datetime.now(UTC)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" hook emits BEGIN instead
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get("tm_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _make_engine(url: URL) -> Engine:
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _insert_ignore(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """INSERT that does nothing when the primary key exists (race-free where the dialect can)."""
    statement: Insert
    name = conn.dialect.name
    if name == "sqlite":
        statement = sqlite.insert(table).values(values).on_conflict_do_nothing()
    elif name == "postgresql":
        statement = postgresql.insert(table).values(values).on_conflict_do_nothing()
    elif name in ("mysql", "mariadb"):
        statement = insert(table).values(values).prefix_with("IGNORE")
    else:
        keys = [table.c[c.name] == values[c.name] for c in table.primary_key.columns]
        if conn.scalar(select(func.count()).select_from(table).where(*keys)):
            return
        statement = insert(table).values(values)
    conn.execute(statement)


def _chunk_rows(chunks: list[ChunkRecord]) -> list[dict[str, Any]]:
    return [{"run_id": c.run_id, "table_name": c.table, "chunk_index": c.index,
             "batch_no": c.batch, "start_bound": c.start, "end_bound": c.end,
             "where_sql": c.where, "status": c.status, "low_position": c.low,
             "high_position": c.high, "row_count": c.rows, "byte_count": c.bytes,
             "path": c.path, "attempts": c.attempts} for c in chunks]


def _run_record(r: Row[Any]) -> RunRecord:
    return RunRecord(r.run_id, r.pipeline, r.status, r.options, r.start_position, r.high_position,
                     r.created_at, r.updated_at, r.finished_at, r.error)


def _run_table_record(r: Row[Any]) -> RunTableRecord:
    return RunTableRecord(r.run_id, r.table_name, r.mode, r.status, r.strategy, r.chunk_key,
                          r.info, r.row_count, r.version)


def _chunk_record(r: Row[Any]) -> ChunkRecord:
    return ChunkRecord(r.run_id, r.table_name, r.chunk_index, r.batch_no, r.start_bound,
                       r.end_bound, r.where_sql, r.status, r.low_position, r.high_position,
                       r.row_count, r.byte_count, r.path, r.attempts)


def _table_checkpoint(r: Row[Any]) -> TableCheckpoint:
    return TableCheckpoint(r.pipeline, r.table_name, r.version, r.position, r.row_count,
                           r.manifest, r.run_id, r.published_at)


def _lock_record(r: Row[Any]) -> LockRecord:
    return LockRecord(r.pipeline, r.holder, r.hostname, r.pid, r.acquired_at, r.refreshed_at)


def _locked_message(lock: LockRecord, config_path: str | None) -> str:
    pid = "pid unknown" if lock.pid is None else f"pid {lock.pid}"
    config = config_path or "<pipeline config>"
    return (f"pipeline {lock.pipeline} is locked by run {lock.holder} on host {lock.hostname} "
            f"({pid}) since {lock.acquired_at.isoformat(timespec='seconds')} (last refreshed "
            f"{lock.refreshed_at.isoformat(timespec='seconds')}); wait for it to finish, or if "
            f"that process is gone run `tidemark reset --config {config} --unlock`")


class StateStore:
    """The pipeline state behind one SQLAlchemy URL.

    Args:
        url: an SQLAlchemy URL, e.g. ``sqlite:////var/lib/tidemark/state.db`` or
            ``postgresql+psycopg://tidemark@db/tidemark``.

    Raises:
        StateError: the URL is invalid, its driver is missing, the store is
            unreachable, or its schema is newer than this code.
    """

    def __init__(self, url: str) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StateError("state.url is not a valid SQLAlchemy URL "
                             "(e.g. sqlite:////var/lib/tidemark/state.db)") from None
        #: The URL with its password masked: safe for messages and logs.
        self.url = parsed.render_as_string(hide_password=True)
        self._password = parsed.password
        try:
            self._engine = _make_engine(parsed)
        except (NoSuchModuleError, ImportError) as exc:
            raise StateError(f"state store at {self.url}: cannot load the driver "
                             f"{parsed.drivername} ({self._scrub(exc)}); install it") from None
        try:
            self._ensure_schema()
        except DBAPIError as exc:
            self._engine.dispose()
            raise StateError(f"state store at {self.url} is unreachable or unusable: "
                             f"{self._scrub(exc.orig)}") from None
        except BaseException:
            self._engine.dispose()
            raise

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _scrub(self, error: object) -> str:
        message = str(error).strip()
        return message.replace(str(self._password), "***") if self._password else message

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[Connection]:
        """One short transaction; ``write`` takes SQLite's write lock up front."""
        with self._engine.connect() as conn:
            if write:
                conn.execution_options(tm_write=True)
            with conn.begin():
                yield conn

    # --- schema ----------------------------------------------------------------------
    def _stored_version(self, conn: Connection) -> int | None:
        if not inspect(conn).has_table(SCHEMA.name):
            return None
        return conn.scalar(select(SCHEMA.c.version).where(SCHEMA.c.id == 1))

    def _too_new(self, found: int, code: int) -> StateError:
        return StateError(f"state store at {self.url} has schema version {found}, newer than "
                          f"this Tidemark ({code}); upgrade Tidemark")

    def _ensure_schema(self) -> None:
        code = code_schema_version()
        with self._tx(write=False) as conn:
            found = self._stored_version(conn)
        if found == code:
            return
        if found is not None and found > code:
            raise self._too_new(found, code)
        with self._tx() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK_KEY})
            found = self._stored_version(conn)
            if found is None:
                METADATA.create_all(conn)
                conn.execute(insert(SCHEMA).values(id=1, version=code, updated_at=_now()))
                log.info("created the state store schema (version %d) at %s", code, self.url)
            elif found > code:
                raise self._too_new(found, code)
            elif found < code:
                for version in range(found, code):
                    log.info("migrating the state store at %s from schema version %d to %d",
                             self.url, version, version + 1)
                    MIGRATIONS[version - 1](conn)
                conn.execute(update(SCHEMA).values(version=code, updated_at=_now()))

    # --- the pipeline lock: one active run per pipeline -------------------------
    def acquire_lock(self, pipeline: str, holder: str, *, lease_seconds: float = 900,
                     config_path: str | None = None, track_pid: bool = True) -> None:
        """Take the pipeline's lock for ``holder`` (re-entrant for the same holder).

        A re-entrant call refreshes the lock and records the calling process as
        its owner. The lock is taken over, with a warning, when it is stale: its
        host is this host and its pid is gone, or it was not refreshed for
        ``lease_seconds``. Race-free: a primary-key INSERT takes a free lock, a
        compare-and-swap on the lock's token takes over a stale one.

        Args:
            pipeline: the pipeline name.
            holder: who holds it, e.g. an Airflow run id; the same string re-enters.
            lease_seconds: how long an unrefreshed lock stays valid.
            config_path: the config file, named in the "how to unlock" advice.
            track_pid: False records no pid, so the lock outlives this process
                (a lock held across Airflow tasks) and only the lease expires it.

        Raises:
            RunLocked: another holder's lock is live; the message names holder,
                host, pid, since when, and the fix.
        """
        host, pid = socket.gethostname(), (os.getpid() if track_pid else None)
        for _ in range(_LOCK_ATTEMPTS):
            now = _now()
            try:
                with self._tx() as conn:
                    conn.execute(insert(LOCKS).values(
                        pipeline=pipeline, holder=holder, hostname=host, pid=pid,
                        token=uuid.uuid4().hex, acquired_at=now, refreshed_at=now))
                return
            except IntegrityError:
                pass  # someone holds it: look at who
            with self._tx() as conn:
                row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
                if row is None:
                    continue  # released meanwhile: try the INSERT again
                if row.holder == holder:
                    conn.execute(update(LOCKS).where(LOCKS.c.pipeline == pipeline,
                                                     LOCKS.c.token == row.token)
                                 .values(hostname=host, pid=pid, refreshed_at=now))
                    return
                current = _lock_record(row)
                reason = self._stale_reason(current, now, lease_seconds)
                if reason is None:
                    raise RunLocked(_locked_message(current, config_path))
                swapped = conn.execute(
                    update(LOCKS).where(LOCKS.c.pipeline == pipeline, LOCKS.c.token == row.token)
                    .values(holder=holder, hostname=host, pid=pid, token=uuid.uuid4().hex,
                            acquired_at=now, refreshed_at=now))
                if swapped.rowcount == 1:
                    log.warning("took over the stale lock of pipeline %s from run %s on host %s "
                                "(pid %s, since %s): %s", pipeline, current.holder,
                                current.hostname, current.pid, current.acquired_at.isoformat(),
                                reason)
                    return
        raise StateError(f"could not take the lock of pipeline {pipeline}: it changed hands "
                         f"{_LOCK_ATTEMPTS} times while trying; retry")

    @staticmethod
    def _stale_reason(lock: LockRecord, now: datetime, lease_seconds: float) -> str | None:
        if lock.pid is not None and lock.hostname == socket.gethostname() and not _pid_alive(lock.pid):
            return "its process is gone"
        if now - lock.refreshed_at > timedelta(seconds=lease_seconds):
            return f"not refreshed for more than {lease_seconds:g} s"
        return None

    def lock_info(self, pipeline: str) -> LockRecord | None:
        """Who holds the pipeline's lock, or None when it is free."""
        with self._tx(write=False) as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
        return None if row is None else _lock_record(row)

    def refresh_lock(self, pipeline: str, holder: str) -> None:
        """Extend ``holder``'s lease. Raises RunLocked when the lock is no longer its own."""
        with self._tx() as conn:
            done = conn.execute(update(LOCKS).where(LOCKS.c.pipeline == pipeline,
                                                    LOCKS.c.holder == holder)
                                .values(refreshed_at=_now()))
        if done.rowcount != 1:
            now_held = self.lock_info(pipeline)
            owner = "nobody" if now_held is None else f"run {now_held.holder} on {now_held.hostname}"
            raise RunLocked(f"pipeline {pipeline}'s lock is no longer held by run {holder} (now: "
                            f"{owner}); stop this run, it was presumed dead, and rerun")

    def release_lock(self, pipeline: str, holder: str) -> None:
        """Drop the lock if ``holder`` has it; a no-op otherwise."""
        with self._tx() as conn:
            conn.execute(delete(LOCKS).where(LOCKS.c.pipeline == pipeline, LOCKS.c.holder == holder))

    def force_unlock(self, pipeline: str) -> None:
        """Drop the pipeline's lock whoever holds it (``tidemark reset --unlock``)."""
        with self._tx() as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
            conn.execute(delete(LOCKS).where(LOCKS.c.pipeline == pipeline))
        if row is not None:
            log.warning("removed the lock of pipeline %s held by run %s on host %s (pid %s)",
                        pipeline, row.holder, row.hostname, row.pid)

    # --- runs ------------------------------------------------------------------
    def unfinished_run(self, pipeline: str) -> RunRecord | None:
        """The pipeline's latest run if its status is running or failed.

        A failed run that a later run superseded is not returned: resuming it
        would publish an older state over a newer one.
        """
        latest = self.runs(pipeline, limit=1)
        return latest[0] if latest and latest[0].status in ("running", "failed") else None

    def create_run(self, pipeline: str, options: dict[str, Any]) -> RunRecord:
        """Start a run with status running; its id sorts by creation time."""
        now = _now()
        run_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
        with self._tx() as conn:
            _insert_ignore(conn, PIPELINES, {"name": pipeline, "created_at": now})
            conn.execute(insert(RUNS).values(run_id=run_id, pipeline=pipeline, status="running",
                                             options=options, created_at=now, updated_at=now))
        return self.get_run(run_id)

    def get_run(self, run_id: str) -> RunRecord:
        with self._tx(write=False) as conn:
            row = conn.execute(select(RUNS).where(RUNS.c.run_id == run_id)).first()
        if row is None:
            raise StateError(f"run {run_id} is not in the state store at {self.url}")
        return _run_record(row)

    def runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        """The pipeline's runs, newest first."""
        query = (select(RUNS).where(RUNS.c.pipeline == pipeline)
                 .order_by(RUNS.c.created_at.desc(), RUNS.c.run_id.desc()).limit(limit))
        with self._tx(write=False) as conn:
            return [_run_record(r) for r in conn.execute(query)]

    def _update_run(self, run_id: str, values: dict[str, Any]) -> None:
        with self._tx() as conn:
            done = conn.execute(update(RUNS).where(RUNS.c.run_id == run_id)
                                .values(updated_at=_now(), **values))
        if done.rowcount != 1:
            raise StateError(f"run {run_id} is not in the state store at {self.url}")

    def set_run_positions(self, run_id: str, *, start: dict[str, Any] | None = None,
                          high: dict[str, Any] | None = None) -> None:
        """Record P0 and/or H; a position left None keeps its stored value."""
        values = {k: v for k, v in (("start_position", start), ("high_position", high)) if v is not None}
        self._update_run(run_id, values)

    def finish_run(self, run_id: str, status: RunStatus, error: str | None = None) -> None:
        """Set the run's status; ``running`` (a resumed run) clears finished_at and error."""
        finished = None if status == "running" else _now()
        self._update_run(run_id, {"status": status, "error": error, "finished_at": finished})

    # --- tables in a run -------------------------------------------------------
    def add_run_table(self, run_id: str, table: str, mode: TableMode, *, strategy: str | None,
                      chunk_key: list[str], info: dict[str, Any],
                      chunks: list[ChunkRecord] | None = None) -> None:
        """Add a table to the run as planned; if it is there, replace its plan, keep its status.

        ``chunks`` are inserted in the same transaction, so a crash never leaves a
        table planned without its chunks (or chunks without their table).
        """
        key = and_(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == table)
        plan = {"mode": mode, "strategy": strategy, "chunk_key": chunk_key, "info": info}
        try:
            with self._tx() as conn:
                if conn.execute(update(RUN_TABLES).where(key).values(plan)).rowcount == 0:
                    conn.execute(insert(RUN_TABLES).values(run_id=run_id, table_name=table,
                                                           status="planned", **plan))
                if chunks:
                    conn.execute(insert(CHUNKS), _chunk_rows(chunks))
        except IntegrityError as exc:
            raise StateError(f"cannot plan {table} in run {run_id}: its chunks are already planned, "
                             f"or the run does not exist ({self._scrub(exc.orig)})") from None

    def run_tables(self, run_id: str) -> list[RunTableRecord]:
        query = select(RUN_TABLES).where(RUN_TABLES.c.run_id == run_id).order_by(RUN_TABLES.c.table_name)
        with self._tx(write=False) as conn:
            return [_run_table_record(r) for r in conn.execute(query)]

    def set_table_status(self, run_id: str, table: str, status: TableStatus, *,
                         rows: int | None = None, version: int | None = None,
                         info: dict[str, Any] | None = None) -> None:
        """Set the status; ``rows``/``version`` when given; ``info`` keys merge into the stored info."""
        key = and_(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == table)
        with self._tx() as conn:
            stored = conn.scalar(select(RUN_TABLES.c.info).where(key))
            if stored is None:
                raise StateError(f"table {table} is not part of run {run_id}")
            values: dict[str, Any] = {"status": status}
            if rows is not None:
                values["row_count"] = rows
            if version is not None:
                values["version"] = version
            if info:
                values["info"] = {**stored, **info}
            conn.execute(update(RUN_TABLES).where(key).values(values))

    # --- chunks ----------------------------------------------------------------
    def add_chunks(self, chunks: list[ChunkRecord]) -> None:
        """Insert a table's planned chunks in one transaction.

        Raises:
            StateError: a chunk is already planned, or its run does not exist.
        """
        if not chunks:
            return
        try:
            with self._tx() as conn:
                conn.execute(insert(CHUNKS), _chunk_rows(chunks))
        except IntegrityError as exc:
            first = chunks[0]
            raise StateError(f"cannot plan chunks of {first.table} in run {first.run_id}: "
                             f"they are already planned, or the run does not exist "
                             f"({self._scrub(exc.orig)})") from None

    def chunks(self, run_id: str, *, table: str | None = None, batch: int | None = None,
               status: ChunkStatus | None = None) -> list[ChunkRecord]:
        """The run's chunks, filtered by whichever of table/batch/status are given,
        ordered by table then index."""
        query = select(CHUNKS).where(CHUNKS.c.run_id == run_id)
        if table is not None:
            query = query.where(CHUNKS.c.table_name == table)
        if batch is not None:
            query = query.where(CHUNKS.c.batch_no == batch)
        if status is not None:
            query = query.where(CHUNKS.c.status == status)
        query = query.order_by(CHUNKS.c.table_name, CHUNKS.c.chunk_index)
        with self._tx(write=False) as conn:
            return [_chunk_record(r) for r in conn.execute(query)]

    def batches(self, run_id: str) -> list[int]:
        """The run's distinct batch numbers, ascending."""
        query = (select(CHUNKS.c.batch_no).where(CHUNKS.c.run_id == run_id).distinct()
                 .order_by(CHUNKS.c.batch_no))
        with self._tx(write=False) as conn:
            return list(conn.scalars(query))

    def mark_batch_started(self, run_id: str, batch: int, low: dict[str, Any]) -> None:
        """Record L for every pending chunk of the batch and count an attempt."""
        with self._tx() as conn:
            conn.execute(update(CHUNKS)
                         .where(CHUNKS.c.run_id == run_id, CHUNKS.c.batch_no == batch,
                                CHUNKS.c.status == "pending")
                         .values(low_position=low, attempts=CHUNKS.c.attempts + 1))

    def mark_chunk_done(self, run_id: str, table: str, index: int, *, high: dict[str, Any],
                        rows: int, bytes: int, path: str) -> None:
        """Record a read chunk: status done, Hb, rows, bytes and its staging path."""
        with self._tx() as conn:
            done = conn.execute(update(CHUNKS).where(*self._chunk_key(run_id, table, [index]))
                                .values(status="done", high_position=high, row_count=rows,
                                        byte_count=bytes, path=path))
        if done.rowcount != 1:
            raise StateError(f"run {run_id} has no chunk {index} of table {table}")

    def reset_chunks(self, run_id: str, table: str, indexes: list[int]) -> None:
        """Back to pending (e.g. their L is in a purged binlog); attempts are kept."""
        with self._tx() as conn:
            conn.execute(update(CHUNKS).where(*self._chunk_key(run_id, table, indexes))
                         .values(status="pending", low_position=None, high_position=None,
                                 row_count=None, byte_count=None, path=None))

    @staticmethod
    def _chunk_key(run_id: str, table: str, indexes: list[int]) -> list[ColumnElement[bool]]:
        return [CHUNKS.c.run_id == run_id, CHUNKS.c.table_name == table,
                CHUNKS.c.chunk_index.in_(indexes)]

    # --- capture checkpoints ----------------------------------------------------
    def capture_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        """{"position": {...}, "segments": int, "rows": int} or None."""
        query = select(CAPTURE_CHECKPOINTS).where(CAPTURE_CHECKPOINTS.c.run_id == run_id)
        with self._tx(write=False) as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return {"position": row.position, "segments": row.segments, "rows": row.row_count}

    def save_capture_checkpoint(self, run_id: str, position: dict[str, Any], segments: int,
                                rows: int) -> None:
        """Record (replacing any earlier one) how far the run's capture has written."""
        values = {"position": position, "segments": segments, "row_count": rows,
                  "updated_at": _now()}
        with self._tx() as conn:
            key = CAPTURE_CHECKPOINTS.c.run_id == run_id
            if conn.execute(update(CAPTURE_CHECKPOINTS).where(key).values(values)).rowcount == 0:
                conn.execute(insert(CAPTURE_CHECKPOINTS).values(run_id=run_id, **values))

    # --- table checkpoints (published versions) -----------------------------------
    def table_checkpoint(self, pipeline: str, table: str) -> TableCheckpoint | None:
        found = self._table_checkpoints(pipeline, table)
        return found[0] if found else None

    def table_checkpoints(self, pipeline: str) -> list[TableCheckpoint]:
        """The pipeline's published tables, by table name."""
        return self._table_checkpoints(pipeline, None)

    def _table_checkpoints(self, pipeline: str, table: str | None) -> list[TableCheckpoint]:
        query = select(TABLE_CHECKPOINTS).where(TABLE_CHECKPOINTS.c.pipeline == pipeline)
        if table is not None:
            query = query.where(TABLE_CHECKPOINTS.c.table_name == table)
        with self._tx(write=False) as conn:
            rows = conn.execute(query.order_by(TABLE_CHECKPOINTS.c.table_name))
            return [_table_checkpoint(r) for r in rows]

    def save_table_checkpoint(self, checkpoint: TableCheckpoint) -> None:
        """Record (replacing the table's earlier one) a published version."""
        c = checkpoint
        if c.published_at.tzinfo is None:
            raise ValueError(f"published_at of {c.table} has no time zone; pass an aware UTC datetime")
        key = and_(TABLE_CHECKPOINTS.c.pipeline == c.pipeline, TABLE_CHECKPOINTS.c.table_name == c.table)
        values = {"version": c.version, "position": c.position, "row_count": c.rows,
                  "manifest": c.manifest, "run_id": c.run_id, "published_at": c.published_at}
        with self._tx() as conn:
            _insert_ignore(conn, PIPELINES, {"name": c.pipeline, "created_at": _now()})
            if conn.execute(update(TABLE_CHECKPOINTS).where(key).values(values)).rowcount == 0:
                conn.execute(insert(TABLE_CHECKPOINTS).values(pipeline=c.pipeline,
                                                              table_name=c.table, **values))

    # --- status ------------------------------------------------------------------
    def status_rows(self, pipeline: str, run_id: str | None = None) -> list[TableProgress]:
        """Per table of a run (default: the pipeline's latest), its progress; [] if no run."""
        run = self.get_run(run_id) if run_id else next(iter(self.runs(pipeline, limit=1)), None)
        if run is None:
            return []
        done = CHUNKS.c.status == "done"
        counts = (select(CHUNKS.c.table_name, func.count().label("total"),
                         func.sum(case((done, 1), else_=0)).label("done"),
                         func.sum(case((done, CHUNKS.c.row_count), else_=0)).label("rows_read"))
                  .where(CHUNKS.c.run_id == run.run_id).group_by(CHUNKS.c.table_name))
        with self._tx(write=False) as conn:
            by_table = {r.table_name: r for r in conn.execute(counts)}
        result = []
        for t in self.run_tables(run.run_id):
            c = by_table.get(t.table)
            result.append(TableProgress(
                run.run_id, run.status, t.table, t.mode, t.status,
                int(c.done or 0) if c else 0, int(c.total) if c else 0,
                int(c.rows_read or 0) if c else 0, t.rows, t.version))
        return result

    # --- reset -----------------------------------------------------------------
    def forget(self, pipeline: str, tables: list[str] | None = None, *,
               dry_run: bool = False) -> dict[str, int]:
        """Drop runs/chunks/checkpoints of the pipeline (or only the named tables'
        rows); returns counts per kind of what was (or, dry_run, would be) dropped.

        Args:
            pipeline: the pipeline name.
            tables: None drops everything of the pipeline, its lock included;
                otherwise only these tables' run_tables, chunks and table checkpoints.
            dry_run: count, delete nothing.

        Returns:
            A count for every kind in ``FORGET_KINDS``.
        """
        in_runs = select(RUNS.c.run_id).where(RUNS.c.pipeline == pipeline)
        chunks = CHUNKS.c.run_id.in_(in_runs)
        run_tables = RUN_TABLES.c.run_id.in_(in_runs)
        checkpoints = TABLE_CHECKPOINTS.c.pipeline == pipeline
        targets: list[tuple[str, Table, ColumnElement[bool]]]
        if tables is None:
            targets = [("chunks", CHUNKS, chunks), ("run_tables", RUN_TABLES, run_tables),
                       ("capture_checkpoints", CAPTURE_CHECKPOINTS,
                        CAPTURE_CHECKPOINTS.c.run_id.in_(in_runs)),
                       ("runs", RUNS, RUNS.c.pipeline == pipeline),
                       ("table_checkpoints", TABLE_CHECKPOINTS, checkpoints),
                       ("locks", LOCKS, LOCKS.c.pipeline == pipeline)]
        else:
            targets = [("chunks", CHUNKS, and_(chunks, CHUNKS.c.table_name.in_(tables))),
                       ("run_tables", RUN_TABLES, and_(run_tables, RUN_TABLES.c.table_name.in_(tables))),
                       ("table_checkpoints", TABLE_CHECKPOINTS,
                        and_(checkpoints, TABLE_CHECKPOINTS.c.table_name.in_(tables)))]
        counts = dict.fromkeys(FORGET_KINDS, 0)
        with self._tx() as conn:
            for kind, table, where in targets:
                if dry_run:
                    counts[kind] = conn.scalar(select(func.count()).select_from(table).where(where)) or 0
                else:
                    counts[kind] = conn.execute(delete(table).where(where)).rowcount
            if tables is None and not dry_run:
                conn.execute(delete(PIPELINES).where(PIPELINES.c.name == pipeline))
        return counts

    def close(self) -> None:
        """Close the store's connections."""
        self._engine.dispose()
