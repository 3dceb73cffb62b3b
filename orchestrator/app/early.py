"""The Spark session of a run, started early: a JVM takes seconds to start, and the run has
other work to do first (imports, preflight, planning), none of which needs Spark.

`tidemark run` calls `start_spark_early` before it imports the rest of the engine; the session
starts in a daemon thread (a run that fails before it reads does not wait for it) and the read
step takes it from the future. A run that reads no chunks (an incremental run) starts none, and
neither does a run whose tables the source estimates small enough for the driver to read
(`orchestrator.pipeline.read.local`), or that have no key (the driver reads those whole:
`orchestrator.pipeline.read.keyless`): its future holds None, and a read that needs Spark after
all (an estimate was stale) starts the session then.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config import PipelineConfig
from orchestrator.config.patterns import resolve
from orchestrator.errors import TidemarkError
from orchestrator.pipeline.context import open_source, open_store, spark_session
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.source.listing import table_rows, tables_info

if TYPE_CHECKING:
    from orchestrator.source.connection import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outlook:
    """What the state store says a run of some tables will read."""

    reads: bool  # it reads chunks
    published: frozenset[str]  # the pipeline's published tables
    resuming: bool  # an unfinished run has chunks to read (of tables of any size)


def will_read(config: PipelineConfig, tables: list[str], snapshot: bool) -> Outlook:
    """Whether a run of ``tables`` reads chunks: a snapshot is asked for, a table has never been
    published, or an unfinished run has chunks to read (a table re-read because of DDL found
    in the binlog starts its session when it needs it)."""
    store = open_store(config)
    try:
        run = store.unfinished_run(config.pipeline)
        published = frozenset(store.published_versions(config.pipeline))  # one query for 2,000
        resuming = run is not None and bool(store.chunks(run.run_id, status="pending"))
        reads = snapshot or any(t not in published for t in tables) or resuming
        return Outlook(reads, published, resuming)
    finally:
        store.close()


def needs_spark(config: PipelineConfig, snapshot: bool, outlook: Outlook) -> bool:
    """Whether a table the run will snapshot is too big for the driver by the source's estimate
    (``information_schema.TABLES``; one query); an unfinished run's chunks always may be."""
    if outlook.resuming:
        return True
    with open_source(config) as source:
        estimates = table_rows(source, config.tables)
        read = [
            name
            for name in estimates
            if resolve(config.tables, name) is not None
            and (snapshot or name not in outlook.published)
        ]
        big = [name for name in read if estimates[name] > LOCAL_ROWS]
        big = [name for name in big if name not in _keyless(config, source, big)]
    log.debug(
        "%d table(s) to snapshot, %d estimated above %d rows", len(read), len(big), LOCAL_ROWS
    )
    named = {t.name for t in config.tables if not t.pattern}
    return bool(big) or not named <= estimates.keys()  # a table the listing missed: assume big


def _keyless(config: PipelineConfig, source: Source, names: list[str]) -> set[str]:
    """The tables of ``names`` without a key: the driver reads them (`pipeline.keyless`)."""
    out = set()
    for name, info in tables_info(source, names).items():
        table = resolve(config.tables, name)
        with contextlib.suppress(TidemarkError):  # planning says what is wrong with its key
            if table is not None and not choose_chunk_key(table, info, config.source.time_zone):
                out.add(name)
    return out


def start_spark_early(
    config: PipelineConfig, tables: list[str], snapshot: bool
) -> Future[Any] | None:
    """The pipeline's Spark session starting in the background when the run will read chunks in
    Spark (the future then holds the session, else None); None when it reads none, or when the
    state store cannot tell (preflight reports that store)."""
    try:
        outlook = will_read(config, tables, snapshot)
    except Exception:  # preflight and planning report a state store they cannot use
        return None
    if not outlook.reads:
        return None
    future: Future[Any] = Future()

    def start() -> None:
        try:
            wanted = needs_spark(config, snapshot, outlook)
        except Exception:  # preflight reports a source it cannot reach; start as before
            wanted = True
        try:
            future.set_result(spark_session(config) if wanted else None)
        except BaseException as exc:  # handed to whoever needs the session
            future.set_exception(exc)

    threading.Thread(target=start, name="tidemark-spark-start", daemon=True).start()
    return future
