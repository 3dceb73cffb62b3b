"""`tidemark run`: the whole pipeline in one process, through the same steps as the DAG."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

from orchestrator.app import ahead, steps
from orchestrator.app.early import start_spark_early
from orchestrator.app.logs import current_log, record_trace
from orchestrator.config import PipelineConfig
from orchestrator.errors import (
    ConfigError,
    LockLost,
    RunFailed,
    RunLocked,
    TidemarkError,
    first_line,
)
from orchestrator.lake import readahead
from orchestrator.pipeline.context import hold_lock, open_store
from orchestrator.pipeline.failed import TablesFailed
from orchestrator.pipeline.plan.step import takes_out
from orchestrator.services.failures import root_cause

log = logging.getLogger(__name__)

#: Batches read at once, as an Airflow run's mapped read tasks would: while one batch's Spark
#: job runs, the next records its low position and sets up its own, and a batch with fewer
#: chunks than cores (a small table, the last batch) does not leave cores idle.
READ_CONCURRENCY = 2

#: A step that waits says so at least this often (seconds), naming what it waits for.
HEARTBEAT_SECONDS = 30.0


def cli_holder() -> str:
    """The lock holder name of this process."""
    return f"cli:{socket.gethostname()}:{os.getpid()}"


@dataclass
class Progress:
    """Progress of one step: a redrawn bar on a terminal, a log line per update otherwise."""

    step: str
    total: int
    unit: str = "chunks"
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    bars: bool = True
    done: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)

    def update(self, done: int = 0, rows: int = 0) -> None:
        self.done += done
        self.rows += rows
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.rows / elapsed
        eta = (elapsed / self.done * (self.total - self.done)) if self.done and self.total else 0.0
        count = f"{self.done}/{self.total} {self.unit}  " if self.total else ""
        until = f"  ETA {_clock(eta)}" if self.total else ""
        text = f"{self.step:<9} {count}{self.rows:,} rows  {rate:,.0f} rows/s{until}"
        if self.bars:
            width = 24
            filled = int(width * self.done / self.total) if self.total else 0
            bar = f"[{'#' * filled}{'.' * (width - filled)}] " if self.total else ""
            self.stream.write(f"\r{bar}{text}\x1b[K")
            self.stream.flush()
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self.bars:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_command(
    config: PipelineConfig,
    *,
    tables: list[str],
    snapshot: bool,
    chunk_size: int | None,
    progress: bool = True,
    spark: Future[Any] | None = None,
    planned: Callable[[], None] = lambda: None,
    read_ahead: bool = True,
) -> int:
    """The CLI verb. Resumes an unfinished run first, then does what was asked if that differs.

    The pipeline lock is held for the whole run, renewed by a heartbeat, and fences every
    write (`orchestrator.state.lease`): a run whose lock was taken over stops with `LockLost`.
    ``spark``: a session already starting (`orchestrator.app.early`); by default it is
    started here, in the background, when the run will read chunks. ``planned`` is called once
    the run asked for is planned (or found unfinished: resumed). ``read_ahead``: an incremental
    run reads its tables' published files while it starts (`orchestrator.lake.readahead`; the
    CLI starts that before its imports), unless this is false.
    """
    started = time.monotonic()
    holder = cli_holder()
    with ExitStack() as held:
        held.callback(readahead.stop, False)  # files read ahead (`cli`) and not taken: dropped
        names = steps.requested_tables(config, tables or None)
        if read_ahead and not snapshot:
            ahead.read_ahead(config, names)
        # the JVM starts while preflight and planning talk to the source, when the run will read
        session: Any = spark or start_spark_early(config, names, snapshot)
        checked = steps.preflight(config, tables or None)
        for table, why in sorted(checked.failing.items()):
            log.warning("table %s is left out of this run: %s", table, why)
        if snapshot:
            _announce_fresh(config, names)
        held.callback(_close_catalogs)
        try:
            held.enter_context(hold_lock(config, holder))
        except Exception as exc:  # another run holds it, or the state store cannot be written
            raise after_start(config, exc, None) from exc
        results, partial = _runs(
            config,
            holder,
            names,
            tables=tables,
            snapshot=snapshot,
            chunk_size=chunk_size,
            bars=progress and sys.stdout.isatty(),
            checked=checked,
            spark=session,
            planned=planned,
        )
    _summary(results, time.monotonic() - started)
    if partial is not None:
        raise partial
    return 0


def _runs(
    config: PipelineConfig,
    holder: str,
    names: list[str],
    *,
    tables: list[str],
    snapshot: bool,
    chunk_size: int | None,
    bars: bool,
    checked: steps.Preflight,
    spark: Any,
    planned: Callable[[], None],
) -> tuple[list[steps.Published], TablesFailed | None]:
    """The unfinished run if there is one, then the requested run if it differs. ``spark``: a
    session, one starting (a future), or None. The first plan takes the shapes ``checked``
    read (a second one, after a resumed run was published, reads its own)."""
    results: list[steps.Published] = []
    partial: TablesFailed | None = None
    for attempt in range(2):
        try:
            handle = steps.plan(
                config,
                tables=tables or None,
                snapshot=snapshot,
                chunk_size=chunk_size,
                holder=holder,
                fresh=snapshot,
                failing=checked.failing,
                shapes=checked.shapes if attempt == 0 else None,
            )
        except Exception as exc:  # e.g. a state store that cannot be written
            raise after_start(config, exc, None) from exc
        asked = handle.asked(names, snapshot, chunk_size)  # the run asked for
        if asked:
            planned()
        if handle.resumed:
            print(
                f"resuming unfinished run {handle.run_id} "
                f"({len(handle.batches)} batch(es) to read)",
                file=sys.stdout,
                flush=True,
            )
        if handle.dropped:
            print(
                "dropped at the source, kept in the lake as last published: "
                f"{', '.join(handle.dropped)}",
                file=sys.stdout,
                flush=True,
            )
        try:
            spark, published = execute(config, handle, holder=holder, bars=bars, spark=spark)
        except KeyboardInterrupt:  # no ghost: the run is failed and unlocked, a rerun resumes it
            steps.fail_run(config, handle.run_id, "interrupted", holder=holder)
            raise
        except TablesFailed as exc:  # the others are published; the run is finished (partial)
            log.error("%s", exc)
            partial, published = exc, exc.published
        except LockLost as exc:  # the run is another process's now: nothing more is written
            raise after_start(config, exc, handle.run_id) from exc
        except Exception as exc:  # Spark/JDBC/IO errors too: one line, state kept
            failure = after_start(config, exc, handle.run_id)
            steps.fail_run(config, handle.run_id, str(failure), holder=holder)
            raise failure from exc
        results.extend(published)
        if asked:
            break
    return results, partial


def after_start(config: PipelineConfig, exc: BaseException, run_id: str | None) -> TidemarkError:
    """The error a failure after preflight exits with: its root cause in one line, the log
    file named; exit 1 (state kept, a rerun resumes), even for a source that went away after
    preflight found it ready. Bad arguments stay exit 2; a locked pipeline is left as it is."""
    record_trace(exc)
    if isinstance(exc, ConfigError | RunLocked | LockLost):
        return exc
    what = f"run {run_id} failed" if run_id else "planning failed"
    cause = root_cause(exc, f"{config.source.host}:{config.source.port}", other_servers(config))
    text = (
        str(cause)
        if cause
        else (str(exc).strip() if isinstance(exc, TidemarkError) else first_line(exc))
    )
    logfile = current_log()
    where = f" (full log: {logfile})" if logfile else " (--debug shows the traceback)"
    return RunFailed(
        f"{what}: {text}; state is kept: `tidemark run --config {config.path}` resumes{where}"
    )


#: The port a URL's scheme means when it names none.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "http": 80, "https": 443}


def other_servers(config: PipelineConfig) -> dict[str, str]:
    """The servers a run talks to besides the source, ``host:port`` -> what it is, so that a
    lost connection to one is not taken for the source's (`root_cause`); one at the source's
    own address is left to the source.
    """
    found: dict[str, str] = {}
    named = (
        (config.state.url, "the state store (state.url)"),
        (config.output.catalog.properties.get("uri"), "the Iceberg catalog (output.catalog's uri)"),
    )
    for url, what in named:
        parts = urlsplit(url or "")
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme.split("+")[0])
        except ValueError:  # not a number: not a server's URL
            continue
        if parts.hostname and port:
            found.setdefault(f"{parts.hostname}:{port}", what)
    found.pop(f"{config.source.host}:{config.source.port}", None)
    return found


def execute(
    config: PipelineConfig, handle: steps.RunHandle, *, holder: str, bars: bool, spark: Any = None
) -> tuple[Any, list[steps.Published]]:
    """Read every pending batch, capture, reconcile and publish one planned run. ``spark``: a
    session, one starting (a future), or None."""
    if handle.batches:  # a session starting is handed on: a batch of small tables needs none
        bar = Progress("read", sum(b.chunks for b in handle.batches), bars=bars)
        with ThreadPoolExecutor(READ_CONCURRENCY, thread_name_prefix="tidemark-read") as pool:
            futures = [
                pool.submit(
                    steps.read_batch, config, handle.run_id, batch.batch, spark=spark, holder=holder
                )
                for batch in handle.batches
            ]
            try:
                pending = set(futures)
                while pending:
                    done, pending = wait(
                        pending, timeout=HEARTBEAT_SECONDS, return_when=FIRST_COMPLETED
                    )
                    for future in done:
                        result = future.result()
                        bar.update(done=result.chunks, rows=result.rows)
                    if not done:  # a stalled source, a long Spark job: say what is waited for
                        log.info(
                            "still reading: %d/%d chunks done after %s, "
                            "%d batch(es) in flight or queued",
                            bar.done,
                            bar.total,
                            _clock(time.monotonic() - bar.started),
                            len(pending),
                        )
            finally:  # on a failure, batches not started yet are not started
                for future in futures:
                    future.cancel()
        bar.close()
    cap = Progress("capture", 0, unit="changes", bars=bars)
    steps.capture(config, handle.run_id, progress=lambda rows: cap.update(rows=rows))
    cap.close()
    # No session is started here: reconcile starts one only for a table that needs Spark
    # (an incremental rewrite small enough for the driver does not).
    if isinstance(spark, Future) and spark.done() and spark.exception() is None:
        spark = spark.result()
    steps.reconcile(config, handle.run_id, spark=None if isinstance(spark, Future) else spark)
    readahead.stop(wait=False)  # the rewrites are done: what they did not take is not kept
    return spark, steps.publish(config, handle.run_id, holder=holder)


def _announce_fresh(config: PipelineConfig, tables: list[str]) -> None:
    """Say that ``--snapshot`` starts afresh instead of resuming the failed run."""
    store = open_store(config)
    try:
        run = store.unfinished_run(config.pipeline)
    finally:
        store.close()
    if run is None or not takes_out(run, tables):
        return
    if set(run.options.get("tables", [])) <= set(tables):
        print(
            f"run {run.run_id} ({run.status}) is not resumed: --snapshot starts a new run that "
            f"reads {', '.join(tables)} afresh",
            file=sys.stdout,
            flush=True,
        )
    else:
        print(
            f"run {run.run_id} ({run.status}) resumes without {', '.join(tables)}: "
            "--snapshot reads them afresh in a new run of their own",
            file=sys.stdout,
            flush=True,
        )


def _close_catalogs() -> None:
    """The SQL catalogs' connections the run opened, closed at its end
    (`orchestrator.lake.iceberg.close_catalogs`); a run that published nothing imported no
    pyiceberg, and has none."""
    iceberg = sys.modules.get("orchestrator.lake.iceberg")
    if iceberg is not None:
        iceberg.close_catalogs()


def _summary(published: list[steps.Published], seconds: float) -> None:
    print(f"{'table':<32} {'version':>7} {'rows':>12}  position", file=sys.stdout)
    for p in published:
        pos = f"{p.position['file']}:{p.position['pos']}"
        print(f"{p.table:<32} {p.version:>7} {p.rows:>12,}  {pos}", file=sys.stdout)
    print(f"done in {seconds:.1f}s: {len(published)} table(s) published", file=sys.stdout)
