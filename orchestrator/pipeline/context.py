"""What every step opens for itself: the state store, the source, Spark, the Iceberg catalog, the
run's staging.

Steps take the pipeline config and a run id and open what they need, so each
can run in its own process (an Airflow task) as well as in one (`tidemark run`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from orchestrator.config import PipelineConfig, objectstore
from orchestrator.errors import ConfigError, RunFailed
from orchestrator.lake import storage
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo, table_info_of
from orchestrator.services import jars
from orchestrator.state import lease
from orchestrator.state.store import RunRecord, RunTableRecord, StateStore

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from orchestrator.services.spark import SessionSettings
    from orchestrator.source.connection import Source

#: Held while a session starts: two read threads that both need Spark start one JVM, not two.
_STARTING = threading.Lock()


def open_store(config: PipelineConfig) -> StateStore:
    """The state store, fenced by the pipeline lock when this process holds it (`hold_lock`):
    every write then fails with `LockLost` once another process took the lock over."""
    return StateStore(config.state.url, guard=lease.held(config.pipeline))


def current_run(store: StateStore, config: PipelineConfig, run_id: str) -> RunRecord:
    """``run_id``'s record, when a step may go on with it: no later run of the pipeline exists.

    A later run supersedes it (``run --snapshot`` or a failover left it behind; or it finished
    and the next one started): going on with it, as a cleared Airflow task of an old DAG run
    does, would publish its older state over the newer run's.

    Raises:
        RunFailed: a later run exists.
    """
    run = store.get_run(run_id)
    latest = store.runs(config.pipeline, limit=1)
    if latest and latest[0].run_id != run.run_id:
        raise RunFailed(
            f"run {run_id} ({run.status}) was superseded by run {latest[0].run_id} "
            f"({latest[0].status}), so its steps cannot go on: its data is older than the "
            "newer run's; start a new run instead (trigger the DAG, or `tidemark run`)"
        )
    return run


def open_source(config: PipelineConfig) -> Source:
    """The source, for steps that run after preflight reached it: a source that cannot be
    reached now is restarting, and is retried like a lost connection."""
    from orchestrator.source.connection import Source  # PyMySQL only when a step needs it

    return Source.from_pipeline(config, known_good=True)


def session_settings(config: PipelineConfig) -> SessionSettings:
    """What the pipeline's Spark session is started with: ``spark.*`` and the JDBC driver jar;
    with staging or output on an object store, ``output.s3`` as ``fs.s3a.*`` settings and
    Hadoop's S3 connector from the local Maven repository (`orchestrator.services.jars`), unless
    ``spark.conf`` brings it (``spark.jars.packages`` naming ``hadoop-aws``). The pipeline's own
    ``spark.conf`` wins over the derived settings.

    Raises:
        ConfigError: when the JDBC driver jar does not exist (a Spark Connect server brings its
            own: the client ships none), or the S3 connector's jars are not fetched.
    """
    jar = config.source.jdbc_driver_jar
    if not config.spark.remote and not os.path.exists(jar):
        raise ConfigError(
            f"source.jdbc_driver_jar: {jar} does not exist; install Debian's "
            "libmariadb-java or point it at a MySQL/MariaDB Connector/J jar"
        )
    from orchestrator.services.spark import SessionSettings  # pyspark only when a step needs it

    conf: dict[str, str] = dict(config.spark.conf)
    class_path: tuple[str, ...] = ()
    if any(objectstore.is_s3(u) for u in (config.output.path, config.staging_path)):
        s3 = config.output.s3
        conf = {**objectstore.spark_conf(s3, objectstore.credentials(s3)), **conf}
        brought = jars.HADOOP_AWS.name in conf.get("spark.jars.packages", "")
        if not config.spark.remote and not brought:
            class_path = jars.jar_paths(jars.S3A)
    return SessionSettings(
        app_name=f"tidemark-{config.pipeline}",
        master=config.spark.master,
        remote=config.spark.remote,
        conf=conf,
        jars=(jar,),
        class_path=class_path,
    )


def open_catalog(config: PipelineConfig) -> Catalog:
    """The Iceberg catalog, for steps that write or commit a table: pyiceberg (and the SQL
    catalog's SQLAlchemy ORM) is imported here, not by a run that changes nothing."""
    from orchestrator.lake import iceberg

    return iceberg.open_catalog(config)


def spark_session(config: PipelineConfig) -> Any:
    """The pipeline's SparkSession (started on first use: a JVM costs seconds)."""
    from orchestrator.services.spark import get_session  # pyspark only when a step needs it

    with _STARTING:
        return get_session(session_settings(config))


def _binds_pid(holder: str) -> bool:
    """A CLI run's lock is bound to its process (taken over once the pid is gone); an
    Airflow run's tasks are many processes, so only the lease expires it."""
    return holder.startswith("cli:")


@contextmanager
def hold_lock(config: PipelineConfig, holder: str) -> Iterator[lease.Lease]:
    """Hold the pipeline lock for ``holder`` while the block runs: renewed by a heartbeat,
    and the fence of every store `open_store` opens meanwhile (`orchestrator.state.lease`).

    Re-taking lets a single cleared Airflow task continue after the failed run released
    the lock; a live lock of another holder raises `RunLocked`.
    """
    with lease.hold(
        config.state.url,
        config.pipeline,
        holder,
        lease_seconds=config.state.lock_lease_seconds,
        track_pid=_binds_pid(holder),
        config_path=str(config.path or ""),
    ) as held:
        yield held


def take_lock(store: StateStore, config: PipelineConfig, holder: str) -> None:
    """Take (or re-take, renewing it) the pipeline lock for ``holder``: through the lease when
    this process holds one for it (`hold_lock`), else directly (a step called on its own)."""
    held = lease.held(config.pipeline)
    if held is not None and held.fence.holder == holder:
        held.take(str(config.path or ""), _binds_pid(holder))
        return
    store.acquire_lock(
        config.pipeline,
        holder,
        lease_seconds=config.state.lock_lease_seconds,
        config_path=str(config.path or ""),
        track_pid=_binds_pid(holder),
    )


def run_dir(config: PipelineConfig, run_id: str, *parts: str) -> str:
    """The run's staging directory (or a path inside it)."""
    return storage.join(config.staging_path, run_id, *parts)


def reconciled_dir(config: PipelineConfig, record: RunTableRecord) -> str:
    """Where a reconciled table's staging files are: the directory its status records (unique to
    the reconcile that wrote it), or the fixed one of runs from before that."""
    return str(
        record.info.get("reconciled_dir")
        or run_dir(config, record.run_id, "reconciled", record.table)
    )


def table_dir(config: PipelineConfig, table: str) -> str:
    """The table's output directory."""
    return storage.table_dir(config.output.path, table)


def table_info(record: RunTableRecord) -> TableInfo:
    """The table's shape as the run planned it."""
    return table_info_of(record.info["table_info"])


def position(data: dict[str, Any] | None) -> BinlogPosition:
    """A position the run recorded; an error if it never was."""
    if data is None:
        raise RunFailed("internal: a position the run needs was never recorded; rerun resumes")
    return BinlogPosition.from_json(data)
