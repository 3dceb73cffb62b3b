"""`tidemark` command line: parse, dispatch, map errors to exit codes.

Each verb is a thin function over the same engine calls the Airflow DAG makes.
Errors print as one line each on stderr (no traceback unless ``--debug``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from orchestrator.config import PipelineConfig, load_config
from orchestrator.config.sections import CHUNK_SIZE_MAX
from orchestrator.errors import ConfigError, TidemarkError, first_line

log = logging.getLogger("tidemark")

#: The terminal handlers `_configure_logging` added (replaced when `main` runs again in-process).
_handlers: list[logging.Handler] = []


class _Terminal(logging.StreamHandler[TextIO]):
    """Log lines to ``sys.stdout`` or ``sys.stderr`` as it is when a line comes, as logging's
    own last-resort handler does. A handler that kept the stream of its start wrote to a
    closed one once `main`, called in-process (tests, a scheduler), had returned and the
    caller had replaced its streams: threads of the command logging then got ``--- Logging
    error ---`` (``I/O operation on closed file``) instead of their line."""

    def __init__(self, name: str) -> None:
        self._which = name
        super().__init__(getattr(sys, name))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self._which)  # under the handler's lock (`Handler.handle`)
        super().emit(record)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tidemark", description="Consistent, lock-free MySQL snapshots into a data lake."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    def verb(name: str, help: str, needs_config: bool = True) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        if needs_config:
            p.add_argument("--config", required=True, help="pipeline YAML file")
        p.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        return p

    verb("validate", "check the config; exit 0, or 2 with every problem found")
    verb("doctor", "check the live source: binlog settings, privileges, keys, retention")
    p = verb("plan", "print the chunk plan without reading data")
    p.add_argument("--table", action="append", default=[], metavar="DB.TABLE")
    p.add_argument("--json", action="store_true", help="machine-readable plan")
    p = verb("run", "snapshot new tables, apply the binlog to published ones, publish")
    p.add_argument("--table", action="append", default=[], metavar="DB.TABLE")
    p.add_argument(
        "--chunk-size",
        type=_rows,
        default=None,
        metavar="N",
        help="rows per chunk for this run, overriding every table's chunk_size",
    )
    p.add_argument("--snapshot", action="store_true", help="re-snapshot even if published")
    p.add_argument("--no-progress", action="store_true", help="plain log lines, no progress bars")
    p.add_argument(
        "--every",
        type=_every,
        default=None,
        metavar="DURATION",
        help="keep running: a run every DURATION (30, 90s, 5m, 1h) until SIGTERM",
    )
    p = verb("status", "runs, tables, chunks done/total, positions, lag")
    p.add_argument("--json", action="store_true", help="machine-readable status")
    verb(
        "airflow-pool", "create or update the pipeline's Airflow pool with airflow.pool_slots slots"
    )
    p = verb("reset", "forget state (and published output with --purge-output)")
    p.add_argument("--table", action="append", default=[], metavar="DB.TABLE")
    p.add_argument("--purge-output", action="store_true")
    p.add_argument("--unlock", action="store_true", help="only release a stale pipeline lock")
    p.add_argument("--yes", action="store_true", help="do it (without: only show what would go)")
    p = verb(
        "demo", "start a throwaway MariaDB with sample data and snapshot it", needs_config=False
    )
    p.add_argument("--dir", default=".tidemark-demo", help="where the demo keeps its files")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--keep", action="store_true", help="leave the demo MariaDB running")
    return parser


def _rows(text: str) -> int:
    """A number of rows (``--chunk-size``), 1 to `CHUNK_SIZE_MAX`: refused before anything
    starts, exit 2."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= CHUNK_SIZE_MAX:
        raise argparse.ArgumentTypeError(
            f"expected a number of rows from 1 to {CHUNK_SIZE_MAX}, found {text!r}"
        )
    return value


def _every(text: str) -> float:
    from orchestrator.app.every import parse_every

    try:
        return parse_every(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _validate(args: argparse.Namespace, config: PipelineConfig) -> int:
    names = ", ".join(t.name for t in config.tables)
    print(f"{config.path}: ok — pipeline {config.pipeline}, {len(config.tables)} table(s): {names}")
    return 0


def _doctor(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.app.doctor import doctor_command

    _imported()
    return doctor_command(config)


def _plan(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.app.plan import plan_command

    _imported()
    return plan_command(config, args.table, as_json=args.json)


def _run(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.services.lean import arrow_without_pandas, system_allocator

    system_allocator()
    arrow_without_pandas()  # before the engine's imports: one converts at import time
    try:
        names = [t.name for t in config.select_tables(args.table or None)]
    except ConfigError:
        names = []  # run_command reports it
    if not args.snapshot:  # the files a rewrite may read, while the engine's imports are made
        from orchestrator.app.ahead import read_ahead

        read_ahead(config, names)
    from orchestrator.app.early import start_spark_early
    from orchestrator.app.logs import open_log

    logfile = open_log(config)
    log.debug("full log of this run: %s", logfile)
    # the JVM starts before the rest of the engine is imported: both take seconds
    spark = start_spark_early(config, names, args.snapshot) if names else None
    from orchestrator.app.run import run_command

    _imported()
    if args.every is None:
        return run_command(
            config,
            tables=args.table,
            snapshot=args.snapshot,
            chunk_size=args.chunk_size,
            progress=not args.no_progress,
            spark=spark,
        )
    from orchestrator.app.every import ProcessBroken, run_every, stop_on_sigterm
    from orchestrator.state.schema import release_engines

    # --snapshot asks for one fresh snapshot: the run that plans it takes it, the next ones go on
    # from it
    pending = {"snapshot": args.snapshot, "spark": spark}

    def planned() -> None:
        pending["snapshot"] = False

    def run_once() -> int:  # every run of the process logs into its log file (`open_log`)
        try:
            return run_command(
                config,
                tables=args.table,
                snapshot=bool(pending["snapshot"]),
                chunk_size=args.chunk_size,
                progress=False,
                spark=pending.pop("spark", None),
                planned=planned,
                read_ahead=False,  # warm: the first run's reading ahead was started above
            )
        except Exception as exc:
            gone = _jvm_gone()
            if gone is not None:
                raise ProcessBroken(
                    f"{first_line(exc)}; this process's Spark JVM ended (exit status {gone}): "
                    "it stops, for a fresh one to resume the run"
                ) from exc
            raise
        finally:
            _release_own_lock(config)
            release_engines()

    with stop_on_sigterm() as stop:
        return run_every(args.every, run_once, lambda exc: _report(exc, args.debug), stop)


def _release_own_lock(config: PipelineConfig) -> None:
    """After a run of ``run --every``: the pipeline lock, if a failure left it with this
    process, is released, as a one-off run's process would leave it when it ends (a lock
    whose process is gone is taken over): no other process waits for the lease meanwhile."""
    from orchestrator.app.run import cli_holder
    from orchestrator.state.store import StateStore

    try:
        with StateStore(config.state.url) as store:
            store.release_lock(config.pipeline, cli_holder())
    except Exception as exc:  # the state store is out of reach: the next run reports it
        log.debug("could not release the pipeline lock after the run: %s", exc)


def _jvm_gone() -> int | None:
    """`orchestrator.services.spark.jvm_gone` when this process imported Spark (else no JVM)."""
    if "pyspark" not in sys.modules:
        return None
    from orchestrator.services.spark import jvm_gone

    return jvm_gone()


def _status(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.app.status import status_command

    _imported()
    return status_command(config, as_json=args.json)


def _airflow_pool(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.app.airflow_support import pool_command

    _imported()
    return pool_command(config)


def _reset(args: argparse.Namespace, config: PipelineConfig) -> int:
    from orchestrator.app.status import reset_command

    _imported()
    return reset_command(
        config, tables=args.table, purge_output=args.purge_output, unlock=args.unlock, yes=args.yes
    )


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.app.demo.command import demo_command

    _imported()
    return demo_command(args.dir, rows=args.rows, keep=args.keep)


VERBS: dict[str, Callable[[argparse.Namespace, PipelineConfig], int]] = {
    "validate": _validate,
    "doctor": _doctor,
    "plan": _plan,
    "run": _run,
    "status": _status,
    "reset": _reset,
    "airflow-pool": _airflow_pool,
}


def _configure_logging(debug: bool, *, quiet_stderr: bool) -> None:
    """Log lines to the terminal (the run's log file takes them all, see `open_log`).

    ``run`` keeps stderr for its failure (at most 3 lines a script can read as the cause):
    its progress, notices and warnings (retries, waits) go to stdout. Other verbs print their
    result on stdout (``plan --json`` must stay parseable), so their log lines go to stderr.
    ``--debug`` sends everything to stderr.
    """
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for old in _handlers:
        root.removeHandler(old)
    _handlers.clear()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    err = _Terminal("stderr")
    handlers: list[logging.Handler] = [err]
    if quiet_stderr and not debug:
        err.setLevel(logging.ERROR)
        out = _Terminal("stdout")
        out.addFilter(lambda record: record.levelno < logging.ERROR)
        handlers.append(out)
    for handler in handlers:
        handler.setFormatter(fmt)
        if (
            not debug
        ):  # the JVM's own output (banner, task stack traces) goes to the run's log file only
            handler.addFilter(lambda record: not record.name.startswith("tidemark.jvm"))
        root.addHandler(handler)
        _handlers.append(handler)
    for noisy in ("py4j", "pyspark", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        args = build_parser().parse_args(argv)
        _configure_logging(debug, quiet_stderr=args.verb == "run")
        if args.verb == "demo":
            return _demo(args)
        # status and reset read the state store and the lake: they need no source password
        config = load_config(
            args.config, check_env=args.verb not in ("status", "reset", "airflow-pool")
        )
        return VERBS[args.verb](args, config)
    except Exception as exc:
        return _report(exc, debug)
    except KeyboardInterrupt:
        print("tidemark: interrupted; state is kept and a rerun resumes", file=sys.stderr)
        return 1


def _report(exc: BaseException, debug: bool) -> int:
    """Print a failure on stderr, one line (a traceback too with ``--debug``); its exit code."""
    if debug:
        traceback.print_exception(exc)
    if isinstance(exc, TidemarkError):
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"tidemark: error: {line}", file=sys.stderr)
        return exc.exit_code
    from orchestrator.app.logs import record_trace  # not raised on purpose
    from orchestrator.services.failures import describe

    record_trace(exc)
    print(f"tidemark: error: {describe(exc)} (--debug shows the traceback)", file=sys.stderr)
    return 1


def _imported() -> None:
    """A command's modules are imported: if `entry` paused the cyclic garbage collector for the
    imports, what they made is frozen out of its passes (they live as long as the process) and
    it runs again. Called by each command once its imports are done; a no-op under `main` alone."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def entry() -> int:
    """The ``tidemark`` process: `main`, with the cyclic garbage collector paused while the
    command imports its modules (`_imported`), and the objects left at the end frozen out of it.

    Imports make hundreds of thousands of long-lived objects (pyiceberg's models, SQLAlchemy,
    pandas), and each full pass of the collector walks all of them: during the imports, a run's
    start took 1.85 s of CPU with the collector on and 1.55 s with it paused (importing the
    path of an incremental run, six pairs alternated, load 1-2); at interpreter exit, 0.35 s of a
    2-3 s incremental run. Frozen, they are not walked again, by this process or by the publish
    workers forked from it. Nothing is skipped: atexit handlers, log flushes and finalizers run
    as before. Tests call `main`, which leaves the collector alone."""
    gc.disable()
    code = main()
    gc.freeze()
    return code


def process() -> NoReturn:
    """The ``tidemark`` console script and ``python -m orchestrator``: `entry`, then the process
    ends without tearing the interpreter down.

    At a normal exit Python clears every module and frees every object the imports made
    (pyiceberg's models, SQLAlchemy, pyarrow) one by one, and returns their memory: work whose
    only effect is on a process that is ending: 0.1-0.2 s of CPU after a small incremental run
    (docs/performance.md, "Incremental"). So, once `entry` returned, what a normal exit does
    that has effects outside the process is done here: thread pools are stopped and other
    non-daemon threads waited for, the atexit handlers run (the publish workers joined,
    temporary files removed), logging is shut down (the run's log file flushed and closed),
    standard output and error are flushed; then ``os._exit`` ends the process with the
    command's exit code."""
    code = entry()
    # What the interpreter's exit runs first: thread pools told to stop, then every non-daemon
    # thread joined (an idle pool's workers would otherwise be waited for forever).
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing reaches it
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    process()
