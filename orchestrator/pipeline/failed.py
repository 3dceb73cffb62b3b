"""A table that fails on its own never blocks the others.

A deterministic failure of one table - it is gone or unreadable at the source, it has a unique
key to choose as ``chunk_key``, no quiet binlog window came for the read of a table without a
key, its chunk read fails with an SQL error that is not a lost connection, its re-reads never
settle, a value of it cannot be converted, a change removes a row its lake does not hold - is
recorded on that table of the
run (``failed``, with the step and the reason) and the run goes on with the others: they are
captured, reconciled and published as always. The run then ends ``partial``: exit 1, one line
naming each failed table, its reason and the fix. ``partial`` runs are not resumed: the next
run is a new one that plans every table again, so a failed table is retried (snapshotted, or
caught up from its own published position, which the failure never moved) while the good
ones go on from theirs. A failed table holds back nobody: it takes no part in the run's
capture, and the others publish at the run's ``H``.

What is *not* one table's failure fails the run as before (state kept, a rerun resumes): a
lost source, a full disk, an unwritable state store, Spark out of memory, purged binlogs, a
source that is another server than the run's positions were recorded on.

A table whose trouble the source can undo is not failed but re-read inside the run
(`mark_reread`; `orchestrator.pipeline.capture.reread`).
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.errors import (
    BinlogPurged,
    RunFailed,
    SourceChanged,
    StateError,
    TransientReadError,
    resnapshot_hint,
)
from orchestrator.positions import BinlogPosition
from orchestrator.services.failures import describe, root_cause
from orchestrator.state.store import StateStore

log = logging.getLogger("orchestrator.pipeline")

#: The fix a failed table's line gives, by the step it failed at.
FIXES = {
    "plan": "fix the cause at the source or in the config (the table's name, grants, "
    "chunk_key), then `tidemark run` retries it",
    "read": "fix the cause (grants, the table's where), then `tidemark run` retries it",
    "capture": "the next `tidemark run` retries it; if it fails again the same way, {hint}",
    "reconcile": "the next `tidemark run` retries it; if it fails again the same way, {hint}",
    "publish": "fix the cause, then `tidemark run` retries it",
}


def table_failure(exc: BaseException) -> str | None:
    """The reason when ``exc`` is one table's own failure; None when the whole run must fail
    (an environment cause: lost connection, disk full, permissions on the lake, memory,
    purged binlog, the state store).

    >>> table_failure(RunFailed("read of shop.orders chunk 3 failed: Unknown column 'x'"))
    "read of shop.orders chunk 3 failed: Unknown column 'x'"
    >>> table_failure(TransientReadError("read of shop.orders: connection refused")) is None
    True
    >>> table_failure(OSError(28, "No space left on device")) is None
    True
    """
    if isinstance(
        exc, TransientReadError | BinlogPurged | SourceChanged | StateError
    ) or not isinstance(exc, Exception):
        return None
    if root_cause(exc) is not None:
        return None
    return describe(exc)


def fail_table(store: StateStore, run_id: str, table: str, step: str, reason: str) -> None:
    """Record ``table`` failed at ``step`` in the run, with a log line; the run goes on."""
    log.error(
        "table %s: failed at %s: %s; the run goes on with the other tables", table, step, reason
    )
    store.fail_table(run_id, table, {"step": step, "reason": reason})


#: The run table's info key of a re-read waiting for the capture's next round: ``{"what",
#: "position"}`` (`mark_reread`; `orchestrator.pipeline.capture.reread.pending_rereads`).
REREAD_PENDING = "reread_pending"


def mark_reread(
    store: StateStore, run_id: str, table: str, what: str, position: BinlogPosition
) -> None:
    """Record that ``table`` is to be read again inside the run, for ``what`` at ``position``:
    the capture's next round plans it again and reads it (`orchestrator.pipeline.capture.reread`).
    Recorded before anything moves past ``position``, so a resumed run re-reads it too."""
    store.set_table_status(
        run_id,
        table,
        "planned",
        info={REREAD_PENDING: {"what": what, "position": position.to_json()}},
    )


def failures(store: StateStore, run_id: str) -> dict[str, dict[str, Any]]:
    """``{table: {"step", "reason"}}`` of the run's failed tables."""
    return {
        r.table: r.info.get("failure", {}) for r in store.run_tables_where(run_id, status="failed")
    }


def is_failed(store: StateStore, run_id: str, table: str) -> bool:
    """Whether ``table`` has failed in the run (its remaining work is skipped)."""
    return table in failures(store, run_id)


class TablesFailed(RunFailed):
    """The run published what it could; these tables failed (exit 1, the next run retries them).

    One table's failure is one line. Several are a line each, under a first line that names
    them (what `orchestrator.services.failures.describe` keeps: the Airflow task's record), and
    the run's record keeps that first line (`summary`; `status` shows each table's reason
    beside it).

    >>> print(TablesFailed("r1", {"shop.orders": {"step": "capture", "reason": "bad JSON"}},
    ...                    "p.yaml", ["x"]))
    run r1 published the other tables, but 1 table(s) failed: shop.orders failed at capture: \
bad JSON; the next `tidemark run` retries it; if it fails again the same way, re-snapshot it: \
tidemark run --config p.yaml --table shop.orders --snapshot
    >>> print(TablesFailed("r2", {"b.t": {"step": "read", "reason": "denied"},
    ...                           "a.t": {"step": "plan", "reason": "gone"}}))
    run r2 published nothing: 2 table(s) failed (a.t, b.t):
      a.t failed at plan: gone; fix the cause at the source or in the config (the table's name, \
grants, chunk_key), then `tidemark run` retries it
      b.t failed at read: denied; fix the cause (grants, the table's where), then `tidemark run` \
retries it
    """

    def __init__(
        self,
        run_id: str,
        failed: dict[str, dict[str, Any]],
        config_path: object = None,
        published: list[Any] | None = None,
    ) -> None:
        self.run_id, self.failed, self.config_path = run_id, failed, config_path
        self.published = (
            published or []
        )  # the run's tables that were published (`publish.Published`)
        super().__init__(str(self))

    @property
    def summary(self) -> str:
        """One line: the whole message for one table; the first line, naming them, for several.

        >>> TablesFailed("r3", {"a.t": {"step": "plan"}, "b.t": {"step": "plan"}}).summary
        'run r3 published nothing: 2 table(s) failed (a.t, b.t)'
        """
        return str(self).splitlines()[0].removesuffix(":")

    def __str__(self) -> str:
        parts = []
        for table, failure in sorted(self.failed.items()):
            step = failure.get("step", "plan")
            fix = FIXES.get(step, FIXES["publish"]).format(
                hint=resnapshot_hint(table, self.config_path)
            )
            parts.append(
                f"{table} failed at {step}: {failure.get('reason', 'unknown reason')}; {fix}"
            )
        done = "published the other tables, but" if self.published else "published nothing:"
        head = f"run {self.run_id} {done} {len(parts)} table(s) failed"
        if len(parts) == 1:
            return f"{head}: {parts[0]}"
        return "\n".join(
            [f"{head} ({', '.join(sorted(self.failed))}):", *(f"  {p}" for p in parts)]
        )
