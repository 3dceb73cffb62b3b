"""The Spark session of a run, started early: a JVM takes seconds to start, and the run has
other work to do first (imports, preflight, planning), none of which needs Spark.

`tidemark run` calls `start_spark_early` before it imports the rest of the engine; the session
starts in a daemon thread (a run that fails before it reads does not wait for it) and the read
step takes it from the future. A run that reads no chunks (an incremental run) starts none.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from orchestrator.config import PipelineConfig
from orchestrator.pipeline.context import open_store, spark_session


def will_read(config: PipelineConfig, tables: list[str], snapshot: bool) -> bool:
    """Whether a run of ``tables`` reads chunks: a snapshot is asked for, a table has never been
    published, or an unfinished run has chunks to read (a table re-read because of DDL found
    in the binlog starts its session when it needs it)."""
    store = open_store(config)
    try:
        run = store.unfinished_run(config.pipeline)
        published = {c.table for c in store.table_checkpoints(config.pipeline)}  # one query for 2,000 tables
        return (snapshot or any(t not in published for t in tables)
                or (run is not None and bool(store.chunks(run.run_id, status="pending"))))
    finally:
        store.close()


def start_spark_early(config: PipelineConfig, tables: list[str], snapshot: bool) -> Future[Any] | None:
    """The pipeline's Spark session starting in the background when the run will read chunks;
    None otherwise, or when the state store cannot tell (preflight reports that store)."""
    try:
        if not will_read(config, tables, snapshot):
            return None
    except Exception:  # preflight and planning report a state store they cannot use
        return None
    future: Future[Any] = Future()

    def start() -> None:
        try:
            future.set_result(spark_session(config))
        except BaseException as exc:  # handed to whoever needs the session
            future.set_exception(exc)

    threading.Thread(target=start, name="tidemark-spark-start", daemon=True).start()
    return future
