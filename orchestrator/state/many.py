"""What a run of many tables records in one transaction: its tables' plans, a read batch's chunks,
its published checkpoints, and the tables its patterns matched.

A pipeline of thousands of small tables pays a transaction per call (on SQLite, a write lock
and a WAL commit each): these methods take lists, so a step records all its tables at once.
``ManyTablesMixin`` holds these ``StateStore`` methods; it needs the store's ``_tx``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Text,
    and_,
    bindparam,
    create_engine,
    insert,
    inspect,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from orchestrator.errors import StateError
from orchestrator.state.records import (
    ChunkRead,
    PlannedTable,
    RunTableRecord,
    TableCheckpoint,
    TableMode,
    TableSetRecord,
    TableStatus,
    _chunk_rows,
    _run_table_record,
    _table_set_record,
)
from orchestrator.state.schema import (
    CHUNKS,
    PIPELINES,
    RUN_TABLES,
    TABLE_CHECKPOINTS,
    TABLE_SETS,
    _insert_ignore,
    _now,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("tidemark.state")

#: Seconds `peek_table_set` waits for a state store to connect and to answer: DAG parsing waits
#: for it, for every pipeline of a configs folder (libpq's ``connect_timeout`` counts 2 at least).
PEEK_TIMEOUT_SECONDS = 2
#: The driver arguments that bound a peek's waits, by DBAPI driver (others: none known). On
#: PostgreSQL the statements' wait is bounded by a ``SET LOCAL statement_timeout`` in the peek's
#: transaction, not by the ``options`` of the connection's start: PgBouncer refuses a connection
#: that names ``options`` ("unsupported startup parameter") unless told to ignore it.
_PEEK_CONNECT_ARGS: dict[str, dict[str, Any]] = {
    "psycopg": {"connect_timeout": PEEK_TIMEOUT_SECONDS},
    "psycopg2": {"connect_timeout": PEEK_TIMEOUT_SECONDS},
    "pg8000": {"timeout": PEEK_TIMEOUT_SECONDS},
    "pymysql": {
        "connect_timeout": PEEK_TIMEOUT_SECONDS,
        "read_timeout": PEEK_TIMEOUT_SECONDS,
        "write_timeout": PEEK_TIMEOUT_SECONDS,
    },
    "mysqldb": {
        "connect_timeout": PEEK_TIMEOUT_SECONDS,
        "read_timeout": PEEK_TIMEOUT_SECONDS,
        "write_timeout": PEEK_TIMEOUT_SECONDS,
    },
    "pysqlite": {"timeout": PEEK_TIMEOUT_SECONDS},  # a database locked by a writer
}
#: How long a store that did not answer a peek is not asked again by this process (seconds): the
#: pipelines of one configs folder often share a store, and a parse must not wait for each.
PEEK_RETRY_SECONDS = 60.0
_UNANSWERED: dict[str, float] = {}

#: Tables a step records in one transaction (their checkpoints, their reconciled results): a
#: crash loses at most this many tables' records, which the rerun redoes.
RECORD_TABLES = 200


class ManyTablesMixin:
    """The many-tables methods of ``StateStore``."""

    if TYPE_CHECKING:

        def _tx(
            self, *, write: bool = True, fenced: bool = True
        ) -> AbstractContextManager[Connection]: ...

    def add_run_tables(self, run_id: str, plans: Sequence[PlannedTable]) -> None:
        """Add tables to the run as planned, with their chunks, all in one transaction (tables
        not in the run yet: `add_run_table` replaces one plan)."""
        if not plans:
            return
        rows = [
            {
                "run_id": run_id,
                "table_name": p.table,
                "status": "planned",
                "mode": p.mode,
                "strategy": p.strategy,
                "chunk_key": p.chunk_key,
                "info": p.info,
            }
            for p in plans
        ]
        chunks = [c for p in plans for c in p.chunks]
        with self._tx() as conn:
            conn.execute(insert(RUN_TABLES), rows)
            if chunks:
                conn.execute(insert(CHUNKS), _chunk_rows(chunks))

    def mark_chunks_done(
        self, run_id: str, reads: Sequence[ChunkRead], *, high: dict[str, Any]
    ) -> None:
        """Record read chunks (status done, ``Hb``, rows, bytes, staging path, the files' key
        ranges when known) in one transaction."""
        if not reads:
            return
        statement = (
            update(CHUNKS)
            .where(
                CHUNKS.c.run_id == bindparam("b_run"),
                CHUNKS.c.table_name == bindparam("b_table"),
                CHUNKS.c.chunk_index == bindparam("b_index"),
            )
            .values(
                status="done",
                high_position=high,
                row_count=bindparam("b_rows"),
                byte_count=bindparam("b_bytes"),
                path=bindparam("b_path"),
                file_ranges=bindparam("b_ranges"),
            )
        )
        params = [
            {
                "b_run": run_id,
                "b_table": r.table,
                "b_index": r.index,
                "b_rows": r.rows,
                "b_bytes": r.bytes,
                "b_path": r.path,
                "b_ranges": r.ranges,
            }
            for r in reads
        ]
        starts = {r.table: r.start for r in reads if r.start is not None}
        with self._tx() as conn:
            done = conn.execute(statement, params)
            if done.rowcount not in (-1, len(reads)):
                raise StateError(
                    f"run {run_id}: {len(reads) - done.rowcount} of the chunks read are not "
                    "in its plan"
                )
            if starts:  # a read at one exact position: the table's capture starts there
                _merge_info(conn, run_id, {t: {"from_position": p} for t, p in starts.items()})

    def publish_tables(
        self, run_id: str, checkpoints: Sequence[TableCheckpoint], status: TableStatus = "published"
    ) -> None:
        """Record many published tables in one transaction: each one's checkpoint, and its status,
        row count and version in the run (a statement per kind of change, not per table)."""
        if not checkpoints:
            return
        for c in checkpoints:
            _aware(c)
        by_pipeline: dict[str, list[TableCheckpoint]] = {}
        for c in checkpoints:
            by_pipeline.setdefault(c.pipeline, []).append(c)
        with self._tx() as conn:
            for pipeline, group in by_pipeline.items():
                _insert_ignore(conn, PIPELINES, {"name": pipeline, "created_at": _now()})
                _save_checkpoints(conn, pipeline, group)
            conn.execute(
                update(RUN_TABLES)
                .where(
                    RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == bindparam("b_table")
                )
                .values(
                    status=status, row_count=bindparam("b_rows"), version=bindparam("b_version")
                ),
                [
                    {"b_table": c.table, "b_rows": c.rows, "b_version": c.version}
                    for c in checkpoints
                ],
            )

    def advance_tables(
        self, run_id: str, old: TableStatus, new: TableStatus, info: dict[str, Any]
    ) -> list[str]:
        """Every table of the run with status ``old`` gets status ``new``, the ``info`` keys merged
        into its stored info, in one transaction; returns those tables."""
        query = select(RUN_TABLES.c.table_name, RUN_TABLES.c.info).where(
            RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.status == old
        )
        statement = (
            update(RUN_TABLES)
            .where(
                RUN_TABLES.c.run_id == run_id,
                RUN_TABLES.c.table_name == bindparam("b_table"),
                RUN_TABLES.c.status == old,
            )
            .values(status=new, info=bindparam("b_info"))
        )
        with self._tx() as conn:
            stored = conn.execute(query).tuples().all()
            if stored:
                conn.execute(
                    statement, [{"b_table": t, "b_info": {**(i or {}), **info}} for t, i in stored]
                )
        return [t for t, _ in stored]

    def merge_tables_info(self, run_id: str, infos: dict[str, dict[str, Any]]) -> None:
        """Each named table's ``infos`` entry merged into its stored info, in one transaction; the
        tables' status stays."""
        if infos:
            with self._tx() as conn:
                _merge_info(conn, run_id, infos)

    def run_tables_where(
        self, run_id: str, *, status: TableStatus | None = None, info_key: str | None = None
    ) -> list[RunTableRecord]:
        """The run's tables with ``status`` and (when given) ``info_key`` in their info, by name:
        the few a question is about, without decoding every table's info (a run may have
        thousands)."""
        query = (
            select(RUN_TABLES)
            .where(RUN_TABLES.c.run_id == run_id)
            .order_by(RUN_TABLES.c.table_name)
        )
        if status is not None:
            query = query.where(RUN_TABLES.c.status == status)
        if (
            info_key is not None
        ):  # the JSON text holds the key quoted; checked on the decoded info below
            query = query.where(type_coerce(RUN_TABLES.c.info, Text).like(f'%"{info_key}"%'))
        with self._tx(write=False) as conn:
            records = [_run_table_record(r) for r in conn.execute(query)]
        return [r for r in records if info_key is None or info_key in r.info]

    def run_table_states(self, run_id: str) -> list[tuple[str, TableMode, TableStatus]]:
        """``(table, mode, status)`` of each table of the run, by name (no info decoded)."""
        query = (
            select(RUN_TABLES.c.table_name, RUN_TABLES.c.mode, RUN_TABLES.c.status)
            .where(RUN_TABLES.c.run_id == run_id)
            .order_by(RUN_TABLES.c.table_name)
        )
        with self._tx(write=False) as conn:
            return [(t, m, s) for t, m, s in conn.execute(query).tuples()]

    def reconciled_tables(
        self, run_id: str, done: Sequence[tuple[str, int, dict[str, Any]]]
    ) -> None:
        """Record many reconciled tables in one transaction: ``(table, rows at H, info)`` each,
        the ``info`` keys merged into the stored info (as `StateStore.set_table_status`)."""
        if not done:
            return
        tables = [table for table, _, _ in done]
        query = select(RUN_TABLES.c.table_name, RUN_TABLES.c.info).where(
            RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name.in_(tables)
        )
        statement = (
            update(RUN_TABLES)
            .where(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == bindparam("b_table"))
            .values(status="reconciled", row_count=bindparam("b_rows"), info=bindparam("b_info"))
        )
        with self._tx() as conn:
            stored = dict(conn.execute(query).tuples().all())
            missing = [t for t in tables if t not in stored]
            if missing:
                raise StateError(f"table {missing[0]} is not part of run {run_id}")
            conn.execute(
                statement,
                [
                    {"b_table": t, "b_rows": rows, "b_info": {**(stored[t] or {}), **info}}
                    for t, rows, info in done
                ],
            )

    def segment_marks(self, run_id: str) -> dict[str, int]:
        """Per table of the run whose changes were voided (a re-read, a table planned late), the
        ``segments_after`` its info records (`orchestrator.pipeline.segments.voided`). Only those
        few rows are decoded: reconcile asks once per table, and a run may have thousands."""
        query = select(RUN_TABLES.c.table_name, RUN_TABLES.c.info).where(
            RUN_TABLES.c.run_id == run_id,
            type_coerce(RUN_TABLES.c.info, Text).like('%"segments_after"%'),
        )  # the JSON text, not a value
        with self._tx(write=False) as conn:
            rows = conn.execute(query).all()
        return {table: int(info.get("segments_after", 0)) for table, info in rows}

    def save_table_set(
        self, pipeline: str, run_id: str, patterns: list[dict[str, Any]], dropped: list[str]
    ) -> None:
        """Record (replacing the last) what the pipeline's patterns matched when ``run_id`` was
        planned."""
        values = {"run_id": run_id, "patterns": patterns, "dropped": dropped, "updated_at": _now()}
        with self._tx() as conn:
            _insert_ignore(conn, PIPELINES, {"name": pipeline, "created_at": _now()})
            key = TABLE_SETS.c.pipeline == pipeline
            if conn.execute(update(TABLE_SETS).where(key).values(values)).rowcount == 0:
                conn.execute(insert(TABLE_SETS).values(pipeline=pipeline, **values))

    def table_set(self, pipeline: str) -> TableSetRecord | None:
        """What the pipeline's patterns matched when a run was last planned (None: never)."""
        with self._tx(write=False) as conn:
            row = conn.execute(select(TABLE_SETS).where(TABLE_SETS.c.pipeline == pipeline)).first()
        return None if row is None else _table_set_record(row)


def _merge_info(conn: Connection, run_id: str, infos: dict[str, dict[str, Any]]) -> None:
    """Each named table's ``infos`` entry merged into its stored info."""
    key = (RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name.in_(list(infos)))
    stored = conn.execute(select(RUN_TABLES.c.table_name, RUN_TABLES.c.info).where(*key)).all()
    conn.execute(
        update(RUN_TABLES)
        .where(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == bindparam("b_table"))
        .values(info=bindparam("b_info")),
        [{"b_table": t, "b_info": {**(i or {}), **infos[t]}} for t, i in stored],
    )


def _aware(c: TableCheckpoint) -> None:
    if c.published_at.tzinfo is None:
        raise ValueError(f"published_at of {c.table} has no time zone; pass an aware UTC datetime")


def _checkpoint_values(c: TableCheckpoint) -> dict[str, Any]:
    return {
        "version": c.version,
        "position": c.position,
        "row_count": c.rows,
        "manifest": c.manifest,
        "run_id": c.run_id,
        "published_at": c.published_at,
    }


def save_checkpoint(conn: Connection, c: TableCheckpoint) -> None:
    """Insert or replace one table's checkpoint inside ``conn``'s transaction."""
    _aware(c)
    key = and_(
        TABLE_CHECKPOINTS.c.pipeline == c.pipeline, TABLE_CHECKPOINTS.c.table_name == c.table
    )
    values = _checkpoint_values(c)
    if conn.execute(update(TABLE_CHECKPOINTS).where(key).values(values)).rowcount == 0:
        conn.execute(
            insert(TABLE_CHECKPOINTS).values(pipeline=c.pipeline, table_name=c.table, **values)
        )


def _save_checkpoints(
    conn: Connection, pipeline: str, checkpoints: Sequence[TableCheckpoint]
) -> None:
    """Insert or replace many checkpoints of one pipeline inside ``conn``'s transaction: one
    UPDATE for those that exist, one INSERT for the others, each executed for many rows."""
    tables = [c.table for c in checkpoints]
    existing = set(
        conn.execute(
            select(TABLE_CHECKPOINTS.c.table_name).where(
                TABLE_CHECKPOINTS.c.pipeline == pipeline, TABLE_CHECKPOINTS.c.table_name.in_(tables)
            )
        ).scalars()
    )
    replaced = [
        {"b_table": c.table, **{f"b_{k}": v for k, v in _checkpoint_values(c).items()}}
        for c in checkpoints
        if c.table in existing
    ]
    if replaced:
        columns = _checkpoint_values(checkpoints[0]).keys()
        conn.execute(
            update(TABLE_CHECKPOINTS)
            .where(
                TABLE_CHECKPOINTS.c.pipeline == pipeline,
                TABLE_CHECKPOINTS.c.table_name == bindparam("b_table"),
            )
            .values({k: bindparam(f"b_{k}") for k in columns}),
            replaced,
        )
    added = [
        {"pipeline": pipeline, "table_name": c.table, **_checkpoint_values(c)}
        for c in checkpoints
        if c.table not in existing
    ]
    if added:
        conn.execute(insert(TABLE_CHECKPOINTS), added)


def peek_table_set(url: str, pipeline: str) -> TableSetRecord | None:
    """`ManyTablesMixin.table_set` without opening a `StateStore`: nothing is created or migrated,
    and a store that does not exist, cannot be read or has no table set gives None. For Airflow's
    DAG parsing, which must never write (the trigger form lists the tables patterns matched) and
    must stay fast: each wait is bounded by `PEEK_TIMEOUT_SECONDS`, and a store that did not
    answer is not asked again for `PEEK_RETRY_SECONDS`."""
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite" and not os.path.isfile(parsed.database or ""):
            return None  # connecting would create the file
        engine = create_engine(
            parsed,
            connect_args=dict(_PEEK_CONNECT_ARGS.get(parsed.get_driver_name(), {})),
            poolclass=NullPool,
        )
    except Exception:  # an unusable URL or driver: nothing to peek at (validate reports it)
        return None
    key = parsed.render_as_string(hide_password=True)
    if time.monotonic() - _UNANSWERED.get(key, -PEEK_RETRY_SECONDS) < PEEK_RETRY_SECONDS:
        return None
    try:
        with engine.connect() as conn:
            if parsed.get_backend_name() == "postgresql":  # this transaction's statements
                conn.execute(text(f"SET LOCAL statement_timeout = {PEEK_TIMEOUT_SECONDS * 1000}"))
            if not inspect(conn).has_table(TABLE_SETS.name):
                return None
            row = conn.execute(select(TABLE_SETS).where(TABLE_SETS.c.pipeline == pipeline)).first()
        return None if row is None else _table_set_record(row)
    except Exception as exc:  # unreachable, slow or locked: the form offers the entries alone
        _UNANSWERED[key] = time.monotonic()
        log.warning(
            "state store %s did not answer (%s): the trigger form of pipeline %s offers its "
            "config's table entries only",
            key,
            type(exc).__name__,
            pipeline,
        )
        return None
    finally:
        engine.dispose()
