"""A run's tables that leave it: failed on their own, or taken out to start afresh.

``RunTablesMixin`` holds these ``StateStore`` methods; it needs the store's ``_tx``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, insert, select, update

from orchestrator.state.schema import CHUNKS, RUN_TABLES, RUNS, _now

if TYPE_CHECKING:
    from sqlalchemy import Connection


class RunTablesMixin:
    """The methods of ``StateStore`` that take a table out of a run's normal course."""

    if TYPE_CHECKING:

        def _tx(
            self, *, write: bool = True, fenced: bool = True
        ) -> AbstractContextManager[Connection]: ...

    def fail_table(self, run_id: str, table: str, failure: dict[str, Any]) -> None:
        """Mark a table of the run failed with ``failure`` (step, reason); one never planned
        is added. The run's other tables go on; the next run retries it."""
        key = and_(RUN_TABLES.c.run_id == run_id, RUN_TABLES.c.table_name == table)
        with self._tx() as conn:
            stored = conn.scalar(select(RUN_TABLES.c.info).where(key))
            if stored is None:
                conn.execute(
                    insert(RUN_TABLES).values(
                        run_id=run_id,
                        table_name=table,
                        mode="snapshot",
                        status="failed",
                        chunk_key=[],
                        info={"failure": failure},
                    )
                )
            else:
                conn.execute(
                    update(RUN_TABLES)
                    .where(key)
                    .values(status="failed", info={**stored, "failure": failure})
                )

    def drop_from_run(self, run_id: str, tables: list[str]) -> None:
        """Take ``tables`` out of a run (its plan, chunks and requested tables), in one
        transaction: the run resumes without them, and they start afresh in a run of their own."""
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
            options = dict(conn.scalar(select(RUNS.c.options).where(RUNS.c.run_id == run_id)) or {})
            options["tables"] = [t for t in options.get("tables", []) if t not in tables]
            conn.execute(
                update(RUNS)
                .where(RUNS.c.run_id == run_id)
                .values(options=options, updated_at=_now())
            )
