"""Publish's worker processes: the tables of a run published on every core.

A table's publish is mostly pyiceberg's Python (metadata built and written, Avro manifests), a
few milliseconds of one core each, so a run of many tables publishes them in worker processes
forked from the run (`orchestrator.pipeline.workers`: what stays the run's, and how the workers
stop), a group of tables in one worker from start to end (its new tables are created in one
catalog transaction, `versions.publish_tables`). The run records each table's checkpoint, or
its own failure, from the `Outcome` a worker returns (`publish.publish`). A publish whose SQLite
file stayed locked is tried again (`LOCKED_ATTEMPTS`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import tenacity

from orchestrator.config import PipelineConfig
from orchestrator.lake.manifest import IcebergEntry
from orchestrator.pipeline import workers as forked
from orchestrator.pipeline.context import open_catalog
from orchestrator.pipeline.failed import table_failure
from orchestrator.positions import BinlogPosition
from orchestrator.services.failures import SQLITE_BUSY, messages
from orchestrator.state.store import RunTableRecord, TableCheckpoint

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

#: Tries of a table's publish whose SQLite file (state store, catalog) stayed locked past the
#: busy timeout: the publish of a table resumes where it stopped (docs/design.md), and a writer
#: that waits can lose the file to others again and again on a busy machine. Then the run fails
#: (`orchestrator.services.failures`: not the table's own failure) and a rerun resumes.
LOCKED_ATTEMPTS = 3


class Switched(NamedTuple):
    """A table published: its checkpoint (recorded by the caller), whether this run published a
    new version, and the version's Iceberg snapshot (None: published before Iceberg)."""

    checkpoint: TableCheckpoint
    changed: bool
    iceberg: IcebergEntry | None = None


#: Publishes a group of tables: (config, guard, run id, [(record, position)], catalog) -> for each
#: table, what it published (`Switched`) or the exception its publish raised.
PublishGroup = Callable[
    [
        PipelineConfig,
        Callable[[], None],
        str,
        Sequence[tuple[RunTableRecord, BinlogPosition]],
        "Catalog | None",
    ],
    list[Switched | Exception],
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A table's publish: its checkpoint, whether this run changed it and its Iceberg snapshot
    (`Switched`), or its own failure."""

    table: str
    checkpoint: TableCheckpoint | None = None
    changed: bool = False
    iceberg: IcebergEntry | None = None
    reason: str | None = None  # the table failed on its own (`table_failure`): the run goes on
    #: What fails the run (not the table's own failure): raised once the tables in hand are handed
    #: over.
    error: Exception | None = None


Todo = Sequence[tuple[RunTableRecord, BinlogPosition]]


def publish_each(
    config: PipelineConfig,
    run_id: str,
    todo: Todo,
    many: PublishGroup,
    guard: Callable[[], None],
    *,
    workers: bool = True,
) -> Iterator[Outcome]:
    """Publish every table of ``todo`` at its position with ``many``, a group of tables at a time
    (`orchestrator.pipeline.workers.groups`); each `Outcome` as its group ends.

    ``guard`` is the run's fence check (`StateStore.check_fence`); ``workers``: False publishes
    in this process (tables without a change: nothing to spread). An exception that is not a
    table's own failure is raised once the tables in hand are handed over (`LockLost` from
    ``guard``, or a worker gone: at once, every worker killed)."""
    count = (
        forked.worker_count(len(todo), forked.per_core(config, forked.PER_CORE)) if workers else 1
    )
    if count > 1 and not forked.may_fork_workers():
        log.info(
            "publishing %d tables in this process: it is a daemonic process (a Celery worker's "
            "task), which may start no worker processes",
            len(todo),
        )
        count = 1
    if count == 1:
        yield from _in_process(config, run_id, todo, many, guard, workers)
        return
    log.info("publishing %d tables in %d worker processes", len(todo), count)
    yield from forked.each_group(
        config,
        forked.groups(todo, count),
        functools.partial(_in_worker, many, run_id),
        guard,
        count=count,
        failed=lambda outcome: outcome.error,
        died="a publish worker process died (killed from outside: out of memory?); the tables "
        "it had published are kept, and `tidemark run` resumes with the others",
    )


def _in_process(
    config: PipelineConfig,
    run_id: str,
    todo: Todo,
    many: PublishGroup,
    guard: Callable[[], None],
    workers: bool,
) -> Iterator[Outcome]:
    """`publish_each` in this process: a group's error is raised once its tables are handed over."""
    # tables without a change need none; `versions.publish_tables` opens one if a table does
    catalog = open_catalog(config) if todo and workers else None
    for group in forked.groups(todo, 1):
        error = None
        for outcome in _publish(many, config, guard, run_id, group, lambda: catalog):
            if outcome.error is None:
                yield outcome
            elif error is None:
                error = outcome.error
        if error is not None:
            raise error


def _in_worker(many: PublishGroup, run_id: str, group: Todo) -> list[Outcome]:
    """A group's publish in a worker (`orchestrator.pipeline.workers.each_group`)."""
    outcomes = _publish(many, forked.run_config(), forked.fence, run_id, group, forked.lake_catalog)
    return [
        replace(o, error=forked.portable(o.error)) if o.error is not None else o for o in outcomes
    ]


def _publish(
    many: PublishGroup,
    config: PipelineConfig,
    guard: Callable[[], None],
    run_id: str,
    group: Todo,
    catalog: Callable[[], Catalog | None],
) -> list[Outcome]:
    """The tables of ``group``; a table's own failure as its `Outcome`'s reason, anything else
    as its error. A table whose SQLite file stayed locked has the group published again (its
    tables published already are found so); then the error is raised."""
    results: list[Switched | Exception] = []
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(_locked),
        reraise=True,
        stop=tenacity.stop_after_attempt(LOCKED_ATTEMPTS),
        wait=tenacity.wait_random(0.2, 2.0),
        before_sleep=lambda state: _again(group, state),
    ):
        with attempt:
            results = many(config, guard, run_id, group, catalog())
            locked = next((r for r in results if isinstance(r, Exception) and _locked(r)), None)
            if locked is not None:
                raise locked
    outcomes = []
    for (record, _), result in zip(group, results, strict=True):
        if not isinstance(result, Exception):
            outcomes.append(Outcome(record.table, *result))
        elif (
            reason := table_failure(result)
        ) is not None:  # one table's own trouble fails that table alone
            outcomes.append(Outcome(record.table, reason=reason))
        else:
            outcomes.append(Outcome(record.table, error=result))
    return outcomes


def _locked(exc: BaseException) -> bool:
    """Whether SQLite's busy timeout ran out on the state store's or the catalog's file."""
    return any(SQLITE_BUSY.search(m) for m in messages(exc))


def _again(group: Todo, state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    first = (
        str(error).strip().splitlines()[0] if error is not None and str(error).strip() else "locked"
    )
    names = [record.table for record, _ in group]
    tables = (
        f"table {names[0]}"
        if len(names) == 1
        else f"tables {', '.join(names[:3])}"
        + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    )
    log.warning(
        "%s: the SQLite file of the state store or catalog stayed locked (%s); publishing "
        "%s again (try %d of %d)",
        tables,
        first,
        "it" if len(names) == 1 else "them",
        state.attempt_number + 1,
        LOCKED_ATTEMPTS,
    )
