"""A step's worker processes: a run's tables handled on every core.

Reconciling or publishing a small table is mostly Python (pyarrow calls, pyiceberg's metadata,
Avro manifests), a few milliseconds of one core each, so a step with many tables hands groups of
them to worker processes forked from the run (`each_group`; `worker_count`: two per core, at
most `MAX_WORKERS`; four where staging or the lake is on an object store, whose requests the
workers mostly wait for: `per_core`). The steps using it: publish
(`orchestrator.pipeline.publish.workers`) and reconcile (`orchestrator.pipeline.reconcile.step`).
What stays the run's:

- the state store's records: a worker only returns what each table's work gave (its outcome or
  its own failure), which the run records;
- the pipeline lock: a worker checks the run's lease before every write, as the run does,
  through a store of its own (`orchestrator.state.lease.forked`; `guard`); the run checks it
  while it waits. A lost lock or a worker gone kills every worker where it is (no table boundary
  is waited for: files a stopped writer leaves are never trusted, docs/design.md "One writer").
  An error that fails the run (not one table's own: a full disk, a path in the way) lets the
  groups other workers have in hand finish and be handed over, starts no more, and is raised as
  the worker raised it;
- the log: a worker's log records are handed to the run with its group's results and logged
  there;
- life: a worker dies with the run (``PR_SET_PDEATHSIG``), and a failpoint in a worker acts on
  the run (`orchestrator.services.faults.forked`).

A daemonic process may start no child (`multiprocessing` refuses: a Celery worker's tasks run in
such processes, docs/airflow.md): there a step handles its tables in the process itself
(`may_fork_workers`).

Workers are forked, not spawned: a spawned interpreter would import pyiceberg and pyarrow again
(over a second), more than a run of a few hundred small tables spends on them.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, TidemarkError
from orchestrator.lake import readahead, storage
from orchestrator.pipeline.context import open_catalog
from orchestrator.services import faults, lean
from orchestrator.services.failures import root_cause
from orchestrator.state import lease

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

#: Workers per core, by default: a publish worker waits for a part of each table (fsyncs, the
#: catalog's write lock), which another uses (measured on 2 cores, 2,000 new tables: 4 workers
#: publish in 14-16 s, 2 in 18-19 s, 6 or 8 in 17 s). Reconcile's, which wait less, take one.
PER_CORE = 2
#: Workers at most, whatever the cores: past a few, the catalog's commits (one database) queue.
MAX_WORKERS = 8
#: Workers per core at least where staging or the lake is on an object store: there a table's
#: reconcile or publish mostly waits for requests (each file read two round trips), which other
#: workers use (200 small tables changed, S3 at 10 ms a request, 2 cores: 8 workers published
#: and reconciled them in 68 s, 4 and 2 in 96 s, docs/performance.md).
REMOTE_PER_CORE = 4
#: Seconds between the run's checks of its lease while it waits for its workers.
CHECK_SECONDS = 1.0
#: Tables a worker handles together at most (`groups`).
GROUP_TABLES = 32
#: Groups per worker at least, when there are enough tables: the last groups keep every worker busy.
GROUPS_PER_WORKER = 4

T = TypeVar("T")
R = TypeVar("R")


def worker_count(tables: int, per_core: int = PER_CORE) -> int:
    """How many processes handle ``tables`` tables: ``per_core`` per core this process may use, at
    most `MAX_WORKERS` and one per table; 1 means the run handles them itself."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(per_core * cores, MAX_WORKERS, tables))


def per_core(config: PipelineConfig, local: int) -> int:
    """Workers per core of a step that takes ``local`` on a local lake: at least
    `REMOTE_PER_CORE` where staging or the lake is on an object store."""
    if storage.is_local(config.output.path) and storage.is_local(config.staging_path):
        return local
    return max(local, REMOTE_PER_CORE)


def groups(todo: Sequence[T], workers: int) -> list[Sequence[T]]:
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


def each_group(
    config: PipelineConfig,
    todo: Sequence[Sequence[T]],
    work: Callable[[Sequence[T]], list[R]],
    guard: Callable[[], None],
    *,
    count: int,
    failed: Callable[[R], Exception | None],
    died: str,
) -> Iterator[R]:
    """Each result of ``work`` over the groups of ``todo``, in ``count`` worker processes, as its
        group ends; its log records are logged here first.

        ``work`` runs in a worker and must pickle (a module's function, a `functools.partial` of
        one); it may call `run_config`, `fence` and `lake_catalog`, and makes the exceptions in its
        results portable (`portable`). ``guard`` is the run's fence check
        (`StateStore.check_fence`), called here between waits. A result for which ``failed`` gives
        an exception is not yielded: that exception is raised once the groups in hand are handed
        over (so is an exception ``work`` raised); ``died``: the message of the `RunFailed`
    raised when a worker dies."""
    import multiprocessing  # a run without workers does not import them
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    lean.preloaded()  # no import under way in another thread while the workers fork
    readahead.stop()  # nor a read
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
    ended: queue.SimpleQueue[Future[tuple[list[R], tuple[logging.LogRecord, ...]]]] = (
        queue.SimpleQueue()
    )
    try:
        pending: set[Future[tuple[list[R], tuple[logging.LogRecord, ...]]]] = set()
        # The workers are forked at the first submit: never while the lease's heartbeat is inside
        # its state-store transaction (it holds QUIET there). A fork copies SQLite's per-process
        # record of the locks this process's connections hold, so a worker forked in that instant
        # finds the file write-locked by a connection it does not have, for good: each of its
        # writes waits out the busy timeout and fails ("locked by another process").
        with faults.QUIET:
            for group in todo:
                future = pool.submit(_in_worker, work, group)
                pending.add(future)
                future.add_done_callback(ended.put)
        while pending:
            done = _ended(ended, CHECK_SECONDS)
            guard()  # a lost lock kills the workers where they are (the except below)
            for future in done:
                pending.discard(future)
                if future.cancelled():  # not started: the run fails (below)
                    continue
                try:
                    results, logs = future.result()
                except BrokenProcessPool as exc:
                    raise RunFailed(died) from exc
                except Exception as exc:  # the run fails: the groups in hand are finished first
                    if error is None:
                        error = _as_raised_here(exc)
                        _cancel(pending)
                    continue
                for line in logs:
                    logging.getLogger(line.name).handle(line)
                for result in results:
                    if (fails := failed(result)) is None:
                        yield result
                    elif error is None:
                        error = fails
                        _cancel(pending)
    except BaseException:
        _kill(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if error is not None:
        raise error


def _cancel(pending: set[Future[Any]]) -> None:
    for waiting in pending:
        waiting.cancel()


def _ended(ended: queue.SimpleQueue[Future[Any]], timeout: float) -> list[Future[Any]]:
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
    log.debug("a worker process failed:%s", exc.__cause__ or "")
    exc.__cause__ = None
    return exc


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers where they are (a stopped one too: SIGKILL needs no SIGCONT)."""
    processes = getattr(pool, "_processes", None) or {}  # Python 3.14 has pool.kill_workers()
    for process in list(processes.values()):
        if process.is_alive():
            process.kill()


# --------------------------------------------------------------------------- in a worker

#: A worker's own: the config, its catalog (opened when first asked), its fence check and the log
#: records of the group in hand.
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
    """The guard of a step called without the pipeline lock (a test calling the step)."""


def run_config() -> PipelineConfig:
    """In a worker: the run's config."""
    config: PipelineConfig = _worker["config"]
    return config


def fence() -> None:
    """In a worker: the run's fence check (raises `LockLost` when the run lost its lock)."""
    _worker["guard"]()


def lake_catalog() -> Catalog:
    """In a worker: the Iceberg catalog, opened at its first call (pyiceberg is imported then)."""
    if _worker["catalog"] is None:
        _worker["catalog"] = open_catalog(_worker["config"])
    opened: Catalog = _worker["catalog"]
    return opened


def _in_worker(
    work: Callable[[Sequence[T]], list[R]], group: Sequence[T]
) -> tuple[list[R], tuple[logging.LogRecord, ...]]:
    kept: _Kept = _worker["kept"]
    kept.records = []
    try:
        results = work(group)
    except Exception as exc:
        raise portable(exc) from None
    return results, tuple(kept.records)


def portable(exc: Exception) -> Exception:
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
