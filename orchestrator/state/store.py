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

The records live in ``orchestrator.state.records``; column types, tables and migrations in
``orchestrator.state.schema``, the pipeline lock in ``orchestrator.state.lock``;
this module re-exports their public names, so import them from here.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    and_,
    case,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError

from orchestrator.errors import StateError
from orchestrator.state.chunks import ChunksMixin
from orchestrator.state.lock import Guard, PipelineLockMixin
from orchestrator.state.many import ManyTablesMixin, save_checkpoint
from orchestrator.state.records import (
    ChunkRead,
    ChunkRecord,
    ChunkStatus,
    LockRecord,
    PlannedTable,
    RunRecord,
    RunStatus,
    RunTableRecord,
    TableCheckpoint,
    TableMode,
    TableProgress,
    TableSetRecord,
    TableStatus,
    _chunk_rows,
    _run_record,
    _run_table_record,
    _table_checkpoint,
)
from orchestrator.state.schema import (
    CAPTURE_CHECKPOINTS,
    CHUNKS,
    FORGET_KINDS,
    LOCKS,
    METADATA,
    MIGRATIONS,
    PIPELINES,
    RUN_TABLES,
    RUNS,
    SCHEMA,
    SQLITE_BUSY_TIMEOUT_MS,
    TABLE_CHECKPOINTS,
    TABLE_SETS,
    _insert_ignore,
    _now,
    code_schema_version,
    engine_for,
    ensure_schema,
    forget_engine,
    unprepared,
)
from orchestrator.state.tables import RunTablesMixin

__all__ = [
    "CAPTURE_CHECKPOINTS",
    "CHUNKS",
    "FORGET_KINDS",
    "LOCKS",
    "METADATA",
    "MIGRATIONS",
    "PIPELINES",
    "RUNS",
    "RUN_TABLES",
    "SCHEMA",
    "SQLITE_BUSY_TIMEOUT_MS",
    "TABLE_CHECKPOINTS",
    "TABLE_SETS",
    "ChunkRead",
    "ChunkRecord",
    "ChunkStatus",
    "LockRecord",
    "PlannedTable",
    "RunRecord",
    "RunStatus",
    "RunTableRecord",
    "StateStore",
    "TableCheckpoint",
    "TableMode",
    "TableProgress",
    "TableSetRecord",
    "TableStatus",
    "code_schema_version",
    "log",
    "unprepared",
]

log = logging.getLogger("tidemark.state")


class StateStore(PipelineLockMixin, RunTablesMixin, ChunksMixin, ManyTablesMixin):
    """The pipeline state behind one SQLAlchemy URL.

    The pipeline lock (``acquire_lock``, ``renew_lock``, ``lock_info``, ``release_lock``,
    ``force_unlock``) comes from ``PipelineLockMixin``; ``fail_table`` and
    ``drop_from_run`` from ``RunTablesMixin``; the chunk methods from ``ChunksMixin``; what many
    tables record in one transaction (``add_run_tables``, ``mark_chunks_done``, ``publish_tables``,
    ``save_table_set``, ``table_set``) from ``ManyTablesMixin``.

    Args:
        url: an SQLAlchemy URL, e.g. ``sqlite:////var/lib/tidemark/state.db`` or
            ``postgresql+psycopg://tidemark@db/tidemark``.
        guard: the fence of the pipeline lock this store writes under (`orchestrator.state.lock`):
            every writing transaction checks it first and fails with `LockLost` once the lock
            was taken over. None: unfenced (status, reset, tests).

    Raises:
        StateError: the URL is invalid, its driver is missing, the store is
            unreachable, or its schema is newer than this code.
    """

    def __init__(self, url: str, guard: Guard | None = None) -> None:
        self.guard = guard
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StateError(
                "state.url is not a valid SQLAlchemy URL "
                "(e.g. sqlite:////var/lib/tidemark/state.db)"
            ) from None
        #: The URL with its password masked: safe for messages and logs.
        self.url = parsed.render_as_string(hide_password=True)
        self._password = parsed.password
        try:
            self._engine, self._shared = engine_for(parsed)
        except (NoSuchModuleError, ImportError) as exc:
            raise StateError(
                f"state store at {self.url}: cannot load the driver "
                f"{parsed.drivername} ({self._scrub(exc)}); install it"
            ) from None
        try:
            ensure_schema(functools.partial(self._tx, fenced=False), self.url)
        except DBAPIError as exc:
            self._drop()
            raise StateError(
                f"state store at {self.url} is unreachable or unusable: {self._scrub(exc.orig)}"
            ) from None
        except BaseException:
            if not self._shared:
                self._engine.dispose()
            raise

    def _drop(self) -> None:
        """The engine after a store could not be opened through it: not shared again, or closed."""
        if self._shared:
            forget_engine(self._engine)
        else:
            self._engine.dispose()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _scrub(self, error: object) -> str:
        message = str(error).strip()
        return message.replace(str(self._password), "***") if self._password else message

    @contextmanager
    def _tx(self, *, write: bool = True, fenced: bool = True) -> Iterator[Connection]:
        """One short transaction; ``write`` takes SQLite's write lock up front and, on a
        fenced store, first confirms the fence (`LockLost`: nothing of it is written)."""
        with self._engine.connect() as conn:
            if write:
                conn.execution_options(tm_write=True)
            with conn.begin():
                if write and fenced and self.guard is not None:
                    self.guard.confirm(conn)
                yield conn

    def check_fence(self) -> None:
        """Before a file of the run is written or deleted: raise `LockLost` if the lock may be
        lost."""
        if self.guard is not None:
            self.guard.check()

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
            conn.execute(
                insert(RUNS).values(
                    run_id=run_id,
                    pipeline=pipeline,
                    status="running",
                    options=options,
                    created_at=now,
                    updated_at=now,
                )
            )
        return self.get_run(run_id)

    def get_run(self, run_id: str) -> RunRecord:
        with self._tx(write=False) as conn:
            row = conn.execute(select(RUNS).where(RUNS.c.run_id == run_id)).first()
        if row is None:
            raise StateError(f"run {run_id} is not in the state store at {self.url}")
        return _run_record(row)

    def runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        """The pipeline's runs, newest first."""
        query = (
            select(RUNS)
            .where(RUNS.c.pipeline == pipeline)
            .order_by(RUNS.c.created_at.desc(), RUNS.c.run_id.desc())
            .limit(limit)
        )
        with self._tx(write=False) as conn:
            return [_run_record(r) for r in conn.execute(query)]

    def _update_run(self, run_id: str, values: dict[str, Any]) -> None:
        with self._tx() as conn:
            done = conn.execute(
                update(RUNS).where(RUNS.c.run_id == run_id).values(updated_at=_now(), **values)
            )
        if done.rowcount != 1:
            raise StateError(f"run {run_id} is not in the state store at {self.url}")

    def set_run_positions(
        self,
        run_id: str,
        *,
        start: dict[str, Any] | None = None,
        high: dict[str, Any] | None = None,
    ) -> None:
        """Record P0 and/or H; a position left None keeps its stored value."""
        values = {
            k: v for k, v in (("start_position", start), ("high_position", high)) if v is not None
        }
        self._update_run(run_id, values)

    def finish_run(self, run_id: str, status: RunStatus, error: str | None = None) -> None:
        """Set the run's status; ``running`` (a resumed run) clears finished_at and error."""
        finished = None if status == "running" else _now()
        self._update_run(run_id, {"status": status, "error": error, "finished_at": finished})

    # --- tables in a run -------------------------------------------------------
    def add_run_table(
        self,
        run_id: str,
        table: str,
        mode: TableMode,
        *,
        strategy: str | None,
        chunk_key: list[str],
        info: dict[str, Any],
        chunks: list[ChunkRecord] | None = None,
        replan: bool = False,
    ) -> None:
        """Add a table to the run as planned; if it is there, replace its plan, keep its status.

        ``chunks`` are inserted in the same transaction, so a crash never leaves a
        table planned without its chunks (or chunks without their table). ``replan``
        first drops the table's chunks and sets it back to ``planned`` (a re-read).
        """
        key = and_(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == table)
        plan: dict[str, Any] = {
            "mode": mode,
            "strategy": strategy,
            "chunk_key": chunk_key,
            "info": info,
        }
        try:
            with self._tx() as conn:
                if replan:
                    conn.execute(
                        delete(CHUNKS).where(
                            CHUNKS.c.run_id == run_id, CHUNKS.c.table_name == table
                        )
                    )
                    plan["status"] = "planned"
                if conn.execute(update(RUN_TABLES).where(key).values(plan)).rowcount == 0:
                    conn.execute(
                        insert(RUN_TABLES).values(
                            run_id=run_id, table_name=table, status="planned", **plan
                        )
                    )
                if chunks:
                    conn.execute(insert(CHUNKS), _chunk_rows(chunks))
        except IntegrityError as exc:
            raise StateError(
                f"cannot plan {table} in run {run_id}: its chunks are already planned, "
                f"or the run does not exist ({self._scrub(exc.orig)})"
            ) from None

    def run_tables(self, run_id: str) -> list[RunTableRecord]:
        query = (
            select(RUN_TABLES)
            .where(RUN_TABLES.c.run_id == run_id)
            .order_by(RUN_TABLES.c.table_name)
        )
        with self._tx(write=False) as conn:
            return [_run_table_record(r) for r in conn.execute(query)]

    def set_table_status(
        self,
        run_id: str,
        table: str,
        status: TableStatus,
        *,
        rows: int | None = None,
        version: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Set the status; ``rows``/``version`` when given; ``info`` keys merge into the stored
        info."""
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

    # --- capture checkpoints ----------------------------------------------------
    def capture_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        """{"position": {...}, "segments": int, "rows": int, "owners": [[writer, first], ...]} or
        None. ``owners``: which capture attempt wrote the durable segments from which number on
        (`orchestrator.pipeline.segments`); a checkpoint of schema 1 has untagged ones (``""``)."""
        query = select(CAPTURE_CHECKPOINTS).where(CAPTURE_CHECKPOINTS.c.run_id == run_id)
        with self._tx(write=False) as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return {
            "position": row.position,
            "segments": row.segments,
            "rows": row.row_count,
            "owners": row.owners if row.owners is not None else [["", 1]],
        }

    def save_capture_checkpoint(
        self,
        run_id: str,
        position: dict[str, Any],
        segments: int,
        rows: int,
        owners: list[list[Any]] | None = None,
    ) -> None:
        """Record (replacing any earlier one) how far the run's capture has written, and by whom."""
        values = {
            "position": position,
            "segments": segments,
            "row_count": rows,
            "owners": owners or [],
            "updated_at": _now(),
        }
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

    def published_versions(self, pipeline: str) -> dict[str, int]:
        """Each published table of the pipeline and its version: `table_checkpoints` without
        their positions and times decoded, for the questions only names or versions answer (a
        pipeline may have thousands of tables)."""
        query = select(TABLE_CHECKPOINTS.c.table_name, TABLE_CHECKPOINTS.c.version).where(
            TABLE_CHECKPOINTS.c.pipeline == pipeline
        )
        with self._tx(write=False) as conn:
            return {table: int(version) for table, version in conn.execute(query).tuples()}

    def _table_checkpoints(self, pipeline: str, table: str | None) -> list[TableCheckpoint]:
        query = select(TABLE_CHECKPOINTS).where(TABLE_CHECKPOINTS.c.pipeline == pipeline)
        if table is not None:
            query = query.where(TABLE_CHECKPOINTS.c.table_name == table)
        with self._tx(write=False) as conn:
            rows = conn.execute(query.order_by(TABLE_CHECKPOINTS.c.table_name))
            return [_table_checkpoint(r) for r in rows]

    def save_table_checkpoint(self, checkpoint: TableCheckpoint) -> None:
        """Record (replacing the table's earlier one) a published version."""
        with self._tx() as conn:
            _insert_ignore(conn, PIPELINES, {"name": checkpoint.pipeline, "created_at": _now()})
            save_checkpoint(conn, checkpoint)

    # --- status ------------------------------------------------------------------
    def status_rows(self, pipeline: str, run_id: str | None = None) -> list[TableProgress]:
        """Per table of a run (default: the pipeline's latest), its progress; [] if no run."""
        run = self.get_run(run_id) if run_id else next(iter(self.runs(pipeline, limit=1)), None)
        if run is None:
            return []
        done = CHUNKS.c.status == "done"
        counts = (
            select(
                CHUNKS.c.table_name,
                func.count().label("total"),
                func.sum(case((done, 1), else_=0)).label("done"),
                func.sum(case((done, CHUNKS.c.row_count), else_=0)).label("rows_read"),
            )
            .where(CHUNKS.c.run_id == run.run_id)
            .group_by(CHUNKS.c.table_name)
        )
        with self._tx(write=False) as conn:
            by_table = {r.table_name: r for r in conn.execute(counts)}
        result = []
        for t in self.run_tables(run.run_id):
            c = by_table.get(t.table)
            result.append(
                TableProgress(
                    run.run_id,
                    run.status,
                    t.table,
                    t.mode,
                    t.status,
                    int(c.done or 0) if c else 0,
                    int(c.total) if c else 0,
                    int(c.rows_read or 0) if c else 0,
                    t.rows,
                    t.version,
                )
            )
        return result

    # --- reset -----------------------------------------------------------------
    def forget(
        self, pipeline: str, tables: list[str] | None = None, *, dry_run: bool = False
    ) -> dict[str, int]:
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
            targets = [
                ("chunks", CHUNKS, chunks),
                ("run_tables", RUN_TABLES, run_tables),
                (
                    "capture_checkpoints",
                    CAPTURE_CHECKPOINTS,
                    CAPTURE_CHECKPOINTS.c.run_id.in_(in_runs),
                ),
                ("runs", RUNS, RUNS.c.pipeline == pipeline),
                ("table_checkpoints", TABLE_CHECKPOINTS, checkpoints),
                ("locks", LOCKS, LOCKS.c.pipeline == pipeline),
            ]
        else:
            targets = [
                ("chunks", CHUNKS, and_(chunks, CHUNKS.c.table_name.in_(tables))),
                ("run_tables", RUN_TABLES, and_(run_tables, RUN_TABLES.c.table_name.in_(tables))),
                (
                    "table_checkpoints",
                    TABLE_CHECKPOINTS,
                    and_(checkpoints, TABLE_CHECKPOINTS.c.table_name.in_(tables)),
                ),
            ]
        counts = dict.fromkeys(FORGET_KINDS, 0)
        with self._tx() as conn:
            for kind, table, where in targets:
                if dry_run:
                    counts[kind] = (
                        conn.scalar(select(func.count()).select_from(table).where(where)) or 0
                    )
                else:
                    counts[kind] = conn.execute(delete(table).where(where)).rowcount
            if tables is None and not dry_run:
                conn.execute(delete(TABLE_SETS).where(TABLE_SETS.c.pipeline == pipeline))
                conn.execute(delete(PIPELINES).where(PIPELINES.c.name == pipeline))
        return counts

    def restart_run(self, run_id: str, tables: list[str]) -> None:
        """Forget the plan of ``tables`` in a run and its positions and capture checkpoint,
        in one transaction: the next `plan` of the run records a new start and replans them.

        Used when binlog the run needs was purged: their snapshot must be read again.
        """
        with self._tx() as conn:
            conn.execute(
                delete(CHUNKS).where(
                    and_(CHUNKS.c.run_id == run_id, CHUNKS.c.table_name.in_(tables))
                )
            )
            conn.execute(
                delete(RUN_TABLES).where(
                    and_(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name.in_(tables))
                )
            )
            conn.execute(delete(CAPTURE_CHECKPOINTS).where(CAPTURE_CHECKPOINTS.c.run_id == run_id))
            conn.execute(
                update(RUNS)
                .where(RUNS.c.run_id == run_id)
                .values(start_position=None, high_position=None)
            )

    def close(self) -> None:
        """Close the store's connections (a shared engine's go back to its pool: `engine_for`)."""
        if not self._shared:
            self._engine.dispose()
