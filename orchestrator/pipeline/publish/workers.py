"""Publish's worker processes: the tables of a run published on every core.

A table's publish is mostly pyiceberg's Python (metadata built and written, Avro manifests),
a few milliseconds of one core each, so a run of many tables publishes them in worker
processes forked from the run (`worker_count`: two per core, at most `MAX_WORKERS`),
a group of tables in one worker from start to end (`groups`; its new tables are created in one
catalog transaction, `versions.publish_tables`). What stays the run's:

- the state store's records: workers only return each table's checkpoint or its own failure
  (`Outcome`), which the run records as before (`publish.publish`);
- the pipeline lock: a worker checks the run's lease before every write, as the run does,
  through a store of its own (`orchestrator.state.lease.forked`); the run checks it while
  it waits. A lost lock or a worker gone kills every worker where it is (no table boundary
  is waited for: files a stopped writer leaves are never trusted, docs/design.md "One
  writer"). An error that fails the run (not one table's own: a full disk, a path in the
  way) lets the tables other workers have in hand finish and be recorded, starts no more,
  and is raised as the worker raised it;
- the log: a worker's log records are handed to the run with its outcome and logged there;
- life: a worker dies with the run (``PR_SET_PDEATHSIG``), and a failpoint in a worker
  acts on the run (`orchestrator.services.faults.forked`).

A daemonic process may start no child (`multiprocessing` refuses: a Celery worker's tasks run
in such processes, docs/airflow.md): there the tables are published in the process itself
(`may_fork_workers`).

Workers are forked, not spawned: a spawned interpreter would import pyiceberg and pyarrow
again (over a second), more than a run of a few hundred small tables spends publishing.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import tenacity

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, TidemarkError
from orchestrator.lake.manifest import IcebergEntry
from orchestrator.pipeline.failed import table_failure
from orchestrator.positions import BinlogPosition
from orchestrator.services import faults, lean
from orchestrator.services.failures import SQLITE_BUSY, messages, root_cause
from orchestrator.state import lease
from orchestrator.state.store import RunTableRecord, TableCheckpoint

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

#: Workers per core: a worker waits for a part of each table (fsyncs, the catalog's write lock),
#: which another uses (measured on 2 cores, 2,000 new tables: 4 workers publish in 14-16 s, 2 in
#: 18-19 s, 6 or 8 in 17 s).
PER_CORE = 2
#: Workers at most, whatever the cores: past a few, the catalog's commits (one database) queue.
MAX_WORKERS = 8
#: Seconds between the run's checks of its lease while it waits for its workers.
CHECK_SECONDS = 1.0
#: Tries of a table's publish whose SQLite file (state store, catalog) stayed locked past the
#: busy timeout: the publish of a table resumes where it stopped (docs/design.md), and a writer
#: that waits can lose the file to others again and again on a busy machine. Then the run fails
#: (`orchestrator.services.failures`: not the table's own failure) and a rerun resumes.
LOCKED_ATTEMPTS = 3

#: Tables a worker publishes together at most (`groups`): tables new to the catalog are created
#: in one catalog transaction a group (`versions.publish_tables`).
GROUP_TABLES = 32
#: Groups per worker at least, when there are enough tables: the last groups keep every worker busy.
GROUPS_PER_WORKER = 4


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
    logs: tuple[logging.LogRecord, ...] = ()


def worker_count(tables: int) -> int:
    """How many processes publish ``tables`` tables: `PER_CORE` per core this process may use, at
    most `MAX_WORKERS` and one per table; 1 means the run publishes them itself."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(PER_CORE * cores, MAX_WORKERS, tables))


Todo = Sequence[tuple[RunTableRecord, BinlogPosition]]


def groups(todo: Todo, workers: int) -> list[Todo]:
    """``todo`` cut into groups of consecutive tables: at most `GROUP_TABLES`, and at least
    `GROUPS_PER_WORKER` groups a worker when the tables allow.

    >>> [len(g) for g in groups(list(range(10)), 1)]
    [3, 3, 3, 1]
    >>> [len(g) for g in groups(list(range(200)), 4)]  # doctest: +ELLIPSIS
    [13, 13, ..., 5]
    >>> len(groups(list(range(2000)), 4)), len(groups([], 4))
    (63, 0)
    """
    size = max(1, min(GROUP_TABLES, -(-len(todo) // (workers * GROUPS_PER_WORKER))))
    return [todo[i : i + size] for i in range(0, len(todo), size)]


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
    (`groups`); each `Outcome` as its group ends.

    ``guard`` is the run's fence check (`StateStore.check_fence`); ``workers``: False publishes
    in this process (tables without a change: nothing to spread). An exception that is not a
    table's own failure is raised once the tables in hand are handed over (`LockLost` from
    ``guard``, or a worker gone: at once, every worker killed)."""
    count = worker_count(len(todo)) if workers else 1
    if count > 1 and not may_fork_workers():
        log.info(
            "publishing %d tables in this process: it is a daemonic process (a Celery worker's "
            "task), which may start no worker processes",
            len(todo),
        )
        count = 1
    if count == 1:
        yield from _in_process(config, run_id, todo, many, guard, workers)
        return
    import multiprocessing  # a run without workers does not import them
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    log.info("publishing %d tables in %d worker processes", len(todo), count)
    lean.preloaded()  # no import under way in another thread while the workers fork
    pool = ProcessPoolExecutor(
        count,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_start_worker,
        initargs=(config, os.getpid()),
    )
    error: BaseException | None = None
    # Each future puts itself here when it ends: the wait costs the same whatever is pending
    # (`concurrent.futures.wait` hangs a waiter on every pending future at each call: with
    # thousands of tables the run spent a fifth of a core on it, taken from the workers).
    ended: queue.SimpleQueue[Future[list[Outcome]]] = queue.SimpleQueue()
    try:
        pending: set[Future[list[Outcome]]] = set()
        # The workers are forked at the first submit: never while the lease's heartbeat is inside
        # its state-store transaction (it holds QUIET there). A fork copies SQLite's per-process
        # record of the locks this process's connections hold, so a worker forked in that instant
        # finds the file write-locked by a connection it does not have, for good: each of its
        # writes waits out the busy timeout and fails ("locked by another process").
        with faults.QUIET:
            for group in groups(todo, count):
                future = pool.submit(_in_worker, many, run_id, group)
                pending.add(future)
                future.add_done_callback(ended.put)
        while pending:
            done = _ended(ended, CHECK_SECONDS)
            guard()  # a lost lock kills the workers where they are (the finally below)
            for future in done:
                pending.discard(future)
                if future.cancelled():  # not started: the run fails (below)
                    continue
                try:
                    outcomes = future.result()
                except BrokenProcessPool as exc:
                    raise RunFailed(
                        "a publish worker process died (killed from outside: out of memory?); "
                        "the tables it had published are kept, and `tidemark run` resumes "
                        "with the others"
                    ) from exc
                except Exception as exc:  # the run fails: the tables in hand are finished first
                    if error is None:
                        error = _as_raised_here(exc)
                        for waiting in pending:
                            waiting.cancel()
                    continue
                for outcome in outcomes:
                    for line in outcome.logs:
                        logging.getLogger(line.name).handle(line)
                    if outcome.error is None:
                        yield outcome
                    elif error is None:
                        error = outcome.error
                        for waiting in pending:
                            waiting.cancel()
    except BaseException:
        _kill(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if error is not None:
        raise error


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
    catalog = _open_catalog(config) if todo and workers else None
    for group in groups(todo, 1):
        error = None
        for outcome in _publish(many, config, guard, run_id, group, lambda: catalog):
            if outcome.error is None:
                yield outcome
            elif error is None:
                error = outcome.error
        if error is not None:
            raise error


def _ended(
    ended: queue.SimpleQueue[Future[list[Outcome]]], timeout: float
) -> list[Future[list[Outcome]]]:
    """The futures that ended: at least one if one ends within ``timeout`` seconds, and every
    other already there."""
    try:
        done = [ended.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            done.append(ended.get_nowait())
        except queue.Empty:
            return done


def _as_raised_here(exc: Exception) -> Exception:
    """A worker's exception as the run raises it: without the worker's traceback as its cause (its
    text would be read for the failure's cause and path:
    `orchestrator.services.failures.root_cause`); the traceback is logged at debug level."""
    log.debug("a publish worker failed:%s", exc.__cause__ or "")
    exc.__cause__ = None
    return exc


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


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers where they are (a stopped one too: SIGKILL needs no SIGCONT)."""
    processes = getattr(pool, "_processes", None) or {}  # Python 3.14 has pool.kill_workers()
    for process in list(processes.values()):
        if process.is_alive():
            process.kill()


# --------------------------------------------------------------------------- in a worker

#: A worker's own: the config, its catalog (opened at its first table), its fence check and
#: the log records of the table in hand.
_worker: dict[str, Any] = {}


class _Kept(logging.Handler):
    """Keeps a worker's log records for the run to log (their messages formatted: picklable)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def may_fork_workers() -> bool:
    """Whether this process may start worker processes: not when it is a daemonic
    `multiprocessing` process (a Celery worker's task), which `multiprocessing` forbids to have
    children. Asked without importing `multiprocessing` (a process that never imported it is
    no daemon of it).

    >>> may_fork_workers()
    True
    """
    mp = sys.modules.get("multiprocessing")
    return mp is None or not mp.current_process().daemon


def _start_worker(config: PipelineConfig, run_pid: int) -> None:
    signal.signal(
        signal.SIGTERM, signal.SIG_DFL
    )  # not the run's handler (`run --every`): the run stops its workers
    _die_with(run_pid)
    faults.forked(run_pid)
    lease.forked(config.pipeline, config.state.url)
    kept = _Kept()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(kept)
    held = lease.held(config.pipeline)  # the fence check of the run's stores (`open_store`)
    _worker.update(
        config=config, kept=kept, guard=held.check if held is not None else _unfenced, catalog=None
    )


def _unfenced() -> None:
    """The guard of a publish called without the pipeline lock (a test calling the step)."""


def _open_catalog(config: PipelineConfig) -> Catalog:
    """The Iceberg catalog; pyiceberg is imported here, by a run that commits a table."""
    from orchestrator.lake import iceberg

    return iceberg.open_catalog(config)


def _catalog() -> Catalog:
    if _worker["catalog"] is None:
        _worker["catalog"] = _open_catalog(_worker["config"])
    catalog: Catalog = _worker["catalog"]
    return catalog


def _in_worker(many: PublishGroup, run_id: str, group: Todo) -> list[Outcome]:
    kept: _Kept = _worker["kept"]
    kept.records = []
    try:
        outcomes = _publish(many, _worker["config"], _worker["guard"], run_id, group, _catalog)
    except Exception as exc:
        raise _portable(exc) from None
    outcomes = [
        replace(o, error=_portable(o.error)) if o.error is not None else o for o in outcomes
    ]
    if outcomes:  # the group's log records, handed over with its first table
        outcomes[0] = replace(outcomes[0], logs=tuple(kept.records))
    return outcomes


def _portable(exc: Exception) -> Exception:
    """``exc`` as it can cross to the run: an exception crosses with its class and message but
    not its causes, so one whose cause says more than its own message (`root_cause`: a full disk
    under a library's error) crosses as a `RunFailed` saying that cause."""
    if isinstance(exc, TidemarkError) or (exc.__cause__ is None and exc.__context__ is None):
        return exc
    cause = root_cause(exc)
    return RunFailed(str(cause)) if cause is not None else exc


def _die_with(run_pid: int) -> None:
    """Be killed when the run dies (Linux ``prctl(PR_SET_PDEATHSIG)``): a worker never outlives
    it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's own checks end orphans
        return
    if os.getppid() != run_pid:  # the run died before the call
        os._exit(1)
