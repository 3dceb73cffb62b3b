"""The state store's schema: column types, tables, migrations, backends.

``orchestrator.state.store`` re-exports every public name here; import them from there.
This module also holds what differs per backend: the engine (SQLite pragmas and
``BEGIN IMMEDIATE``), an INSERT that ignores an existing key, and creating or
migrating the schema (``ensure_schema``).

Positions, key bounds, option and info dicts are stored as JSON text
(``_JsonText``): the caller hands in JSON-able values and gets the same values
back (big integers and nested lists included). Timestamps (``_UTCDateTime``)
are timezone-aware UTC.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Dialect,
    Engine,
    ForeignKey,
    Index,
    Insert,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql, sqlite  # postgresql: imported by a store on it only
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeEngine

from orchestrator.errors import StateError

log = logging.getLogger("tidemark.state")


#: ``MIGRATIONS[i]`` upgrades a store from schema version ``i + 1`` to ``i + 2``,
#: inside the transaction that then records the new version (filled in below the tables).
MIGRATIONS: list[Callable[[Connection], None]] = []

SQLITE_BUSY_TIMEOUT_MS = 30_000
_PG_SCHEMA_LOCK_KEY = 0x7469_6465  # pg_advisory_xact_lock key serialising schema creation


def code_schema_version() -> int:
    """The schema version this code writes: 1 plus one per migration."""
    return 1 + len(MIGRATIONS)


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
            raise ValueError(
                f"timestamp {value.isoformat()} has no time zone; pass an aware UTC datetime"
            )
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
_MYSQL: dict[str, Any] = {
    "mysql_charset": "utf8mb4"
}  # names, paths and predicates may be any unicode


def _run_fk() -> Column[str]:
    return Column("run_id", _RUN_ID, ForeignKey("tm_runs.run_id"), primary_key=True)


SCHEMA = Table(
    "tm_schema_version",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
PIPELINES = Table(
    "tm_pipelines",
    METADATA,
    Column("name", _NAME, primary_key=True),
    Column("created_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)
RUNS = Table(
    "tm_runs",
    METADATA,
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
    "tm_run_tables",
    METADATA,
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
    "tm_chunks",
    METADATA,
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
    Column("file_ranges", _JsonText),
    Index("tm_chunks_run_batch", "run_id", "batch_no"),
    **_MYSQL,
)
CAPTURE_CHECKPOINTS = Table(
    "tm_capture_checkpoints",
    METADATA,
    _run_fk(),
    Column("position", _JsonText, nullable=False),
    Column("segments", Integer, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("updated_at", _UTCDateTime, nullable=False),
    # [[writer, first segment], ...]: which capture attempt wrote each durable segment
    # (`orchestrator.pipeline.segments`); NULL before schema 2 (segments without a writer tag)
    Column("owners", _JsonText),
    **_MYSQL,
)
TABLE_CHECKPOINTS = Table(
    "tm_table_checkpoints",
    METADATA,
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
    "tm_locks",
    METADATA,
    Column("pipeline", _NAME, primary_key=True),
    Column("holder", _NAME, nullable=False),
    Column("hostname", _NAME, nullable=False),
    Column("pid", Integer),
    Column("token", String(32), nullable=False),  # changes on every takeover: compare-and-swap
    Column("acquired_at", _UTCDateTime, nullable=False),
    Column("refreshed_at", _UTCDateTime, nullable=False),
    Column("lease_seconds", Integer),  # the holder's lease; NULL before schema 2 (then 900 s)
    **_MYSQL,
)

TABLE_SETS = Table(
    "tm_table_sets",
    METADATA,  # the tables a pipeline's patterns matched when a run was last planned
    Column("pipeline", _NAME, ForeignKey("tm_pipelines.name"), primary_key=True),
    Column("run_id", _RUN_ID, nullable=False),  # no FK: it outlives its run's rows
    Column("patterns", _JsonText, nullable=False),  # [PatternMatch.to_json(), ...]
    Column(
        "dropped", _JsonText, nullable=False
    ),  # published tables no pattern finds at the source any more
    Column("updated_at", _UTCDateTime, nullable=False),
    **_MYSQL,
)

FORGET_KINDS = ("runs", "run_tables", "chunks", "capture_checkpoints", "table_checkpoints", "locks")


def _now() -> datetime:
    return datetime.now(UTC)


# --- migrations ---------------------------------------------------------------------


def _add_column(conn: Connection, table: Table, name: str) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for a nullable column declared on ``table`` above."""
    kind = table.c[name].type.compile(dialect=conn.dialect)
    conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}"))


def _fencing(conn: Connection) -> None:
    """Schema 2: the lock records its holder's lease; the capture checkpoint records which
    attempt wrote each durable segment (one writer per run, fenced: docs/design.md)."""
    _add_column(conn, LOCKS, "lease_seconds")
    _add_column(conn, CAPTURE_CHECKPOINTS, "owners")


MIGRATIONS.append(_fencing)


def _table_sets(conn: Connection) -> None:
    """Schema 3: ``tm_table_sets``, what a pipeline's table patterns matched (issue 16)."""
    TABLE_SETS.create(conn, checkfirst=True)


MIGRATIONS.append(_table_sets)


def _chunk_ranges(conn: Connection) -> None:
    """Schema 4: ``tm_chunks.file_ranges``, the data files a read wrote with their key ranges."""
    _add_column(conn, CHUNKS, "file_ranges")


MIGRATIONS.append(_chunk_ranges)


# --- backends: engine, insert-or-ignore, creating and migrating the schema ------------


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


#: This process's engines by URL (`engine_for`): a store opened again (each step of a run opens
#: one; ``run --every`` runs again and again) reuses its engine, its pooled connections and
#: the statements it compiled (SQLAlchemy's statement cache is the engine's).
_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()
#: A forked child's copies of its parent's engines: kept, never used nor closed (`_forget_engines`).
_INHERITED: list[Engine] = []


def engine_for(url: URL) -> tuple[Engine, bool]:
    """The engine of ``url`` and whether it is shared (kept for the process): any database but
    an SQLite in-memory one (each store of it is a database of its own) or URI."""
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and (
        not database or database == ":memory:" or database.startswith("file:")
    ):
        return _make_engine(url), False
    key = url.render_as_string(hide_password=False)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = _make_engine(url)
    return engine, True


def forget_engine(engine: Engine) -> None:
    """A shared engine through which a store could not be opened is not shared again: the next
    store of its URL makes a new one (the stores using this one go on with it)."""
    with _ENGINES_LOCK:
        for key, found in list(_ENGINES.items()):
            if found is engine:
                del _ENGINES[key]


def release_engines() -> None:
    """Close the shared engines' idle connections (they keep their compiled statements): between
    the runs of a long-lived process no SQLite file stays open, so its WAL is checkpointed, and a
    state store replaced or deleted meanwhile is opened anew by the next run, not used unlinked."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
    for engine in engines:
        engine.dispose()


def _forget_engines() -> None:
    """In a forked child: its parent's connections are the parent's (SQLite's locks and a
    server's sessions are not shared across a fork); the child opens its own."""
    global _ENGINES_LOCK
    _ENGINES_LOCK = threading.Lock()  # another thread may have held it at the fork
    _INHERITED.extend(_ENGINES.values())
    _ENGINES.clear()


os.register_at_fork(after_in_child=_forget_engines)


def _make_engine(url: URL) -> Engine:
    if url.get_backend_name() != "sqlite":
        return unprepared(create_engine(url, pool_pre_ping=True))
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def unprepared(engine: Engine) -> Engine:
    """``engine``, whose connections send every statement unprepared where the driver would
    prepare it on the server: psycopg 3 does at a statement's fifth run on a connection
    (``prepare_threshold``). Behind a pooler in transaction mode (PgBouncer before 1.21, which
    Airflow's Helm chart puts before its database) the next transaction may run on another
    server connection, which lacks the statement or holds another client's of the same name:
    every run failed with 'prepared statement "_pg3_0" does not exist' (or "already exists").
    A state store's statements are few and small. Connections opened before are closed."""
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "connect", _no_server_prepare)
        engine.dispose()
    return engine


def _no_server_prepare(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.prepare_threshold = None


def _insert_ignore(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """INSERT that does nothing when the primary key exists (race-free where the dialect can)."""
    statement: Insert
    name = conn.dialect.name
    if name == "sqlite":
        statement = sqlite.insert(table).values(values).on_conflict_do_nothing()
    elif name == "postgresql":
        from sqlalchemy.dialects import postgresql  # imported by a store on PostgreSQL only

        statement = postgresql.insert(table).values(values).on_conflict_do_nothing()
    elif name in ("mysql", "mariadb"):
        statement = insert(table).values(values).prefix_with("IGNORE")
    else:
        keys = [table.c[c.name] == values[c.name] for c in table.primary_key.columns]
        if conn.scalar(select(func.count()).select_from(table).where(*keys)):
            return
        statement = insert(table).values(values)
    conn.execute(statement)


def _stored_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(SCHEMA.name):
        return None
    return conn.scalar(select(SCHEMA.c.version).where(SCHEMA.c.id == 1))


def _too_new(url: str, found: int, code: int) -> StateError:
    return StateError(
        f"state store at {url} has schema version {found}, newer than "
        f"this Tidemark ({code}); upgrade Tidemark"
    )


def ensure_schema(tx: Callable[..., AbstractContextManager[Connection]], url: str) -> None:
    """Create the schema on an empty store, or run ``MIGRATIONS`` on an older one.

    Args:
        tx: the store's transaction factory; ``tx(write=False)`` opens a read.
        url: the store's URL with its password masked, for messages and logs.

    Raises:
        StateError: the stored schema is newer than this code.
    """
    code = code_schema_version()
    with tx(write=False) as conn:
        found = _stored_version(conn)
    if found == code:
        return
    if found is not None and found > code:
        raise _too_new(url, found, code)
    with tx() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK_KEY})
        found = _stored_version(conn)
        if found is None:
            METADATA.create_all(conn)
            conn.execute(insert(SCHEMA).values(id=1, version=code, updated_at=_now()))
            log.info("created the state store schema (version %d) at %s", code, url)
        elif found > code:
            raise _too_new(url, found, code)
        elif found < code:
            for version in range(found, code):
                log.info(
                    "migrating the state store at %s from schema version %d to %d",
                    url,
                    version,
                    version + 1,
                )
                MIGRATIONS[version - 1](conn)
            conn.execute(update(SCHEMA).values(version=code, updated_at=_now()))
