"""A run's chunks: what each read batch covers, and what it read.

``ChunksMixin`` holds these ``StateStore`` methods; it needs the store's ``_tx``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, select, update

from orchestrator.errors import StateError
from orchestrator.state.records import ChunkRecord, ChunkStatus, _chunk_record
from orchestrator.state.schema import CHUNKS

if TYPE_CHECKING:
    from sqlalchemy import Connection


class ChunksMixin:
    """The chunk methods of ``StateStore``."""

    if TYPE_CHECKING:

        def _tx(
            self, *, write: bool = True, fenced: bool = True
        ) -> AbstractContextManager[Connection]: ...

    def chunks(
        self,
        run_id: str,
        *,
        table: str | None = None,
        batch: int | None = None,
        status: ChunkStatus | None = None,
    ) -> list[ChunkRecord]:
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
        query = (
            select(CHUNKS.c.batch_no)
            .where(CHUNKS.c.run_id == run_id)
            .distinct()
            .order_by(CHUNKS.c.batch_no)
        )
        with self._tx(write=False) as conn:
            return list(conn.scalars(query))

    def mark_batch_started(self, run_id: str, batch: int, low: dict[str, Any]) -> None:
        """Record L for every pending chunk of the batch and count an attempt."""
        with self._tx() as conn:
            conn.execute(
                update(CHUNKS)
                .where(
                    CHUNKS.c.run_id == run_id,
                    CHUNKS.c.batch_no == batch,
                    CHUNKS.c.status == "pending",
                )
                .values(low_position=low, attempts=CHUNKS.c.attempts + 1)
            )

    def mark_chunk_done(
        self,
        run_id: str,
        table: str,
        index: int,
        *,
        high: dict[str, Any],
        rows: int,
        bytes: int,
        path: str,
    ) -> None:
        """Record a read chunk: status done, Hb, rows, bytes and its staging path."""
        with self._tx() as conn:
            done = conn.execute(
                update(CHUNKS)
                .where(*self._chunk_key(run_id, table, [index]))
                .values(
                    status="done", high_position=high, row_count=rows, byte_count=bytes, path=path
                )
            )
        if done.rowcount != 1:
            raise StateError(f"run {run_id} has no chunk {index} of table {table}")

    @staticmethod
    def _chunk_key(run_id: str, table: str, indexes: list[int]) -> list[ColumnElement[bool]]:
        return [
            CHUNKS.c.run_id == run_id,
            CHUNKS.c.table_name == table,
            CHUNKS.c.chunk_index.in_(indexes),
        ]
