"""One Airflow DAG per Tidemark pipeline config: the TaskFlow wiring, nothing else.

Each task calls exactly one `orchestrator.steps` function, the same the CLI
calls; everything else comes from `orchestrator.runtime.airflow_support`. This module
defines no DAG itself; the two thin DAG files in ``dags/`` import it from the
installed package, so a plain ``DagBag(dag_folder="dags")`` loads them.

    preflight >> plan >> read (mapped over batches) >> capture >> reconcile >> publish
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    AssetAlias,
    Context,
    ExceptionRetryPolicy,
    Metadata,
    Param,
    RetryAction,
    RetryRule,
    XComArg,
    get_current_context,
    task,
)

from orchestrator import steps
from orchestrator.config import PipelineConfig
from orchestrator.errors import ConfigError, LockLost, RunLocked, SourceNotReady
from orchestrator.pipeline.context import hold_lock
from orchestrator.pipeline.failed import TablesFailed
from orchestrator.runtime import airflow_support as support
from orchestrator.runtime.failures import describe

log = logging.getLogger("tidemark.dag")

START_DATE = datetime(2024, 1, 1, tzinfo=UTC)
RETRIES = 2
RETRY_DELAY = timedelta(minutes=1)
#: Retrying cannot fix a bad config, a source that is not set up, or a run held by another.
NO_RETRY_ON = ExceptionRetryPolicy(rules=[RetryRule(
    exception=[ConfigError, SourceNotReady, RunLocked, LockLost, TablesFailed], action=RetryAction.FAIL,
    reason="not transient: fix the config or the source, then clear the task (or trigger the DAG: "
           "a new run retries the tables that failed)")])
MAP_INDEX_TEMPLATE = "{{ task.op_kwargs['batch']['label'] }}"


def _holder() -> str:
    context = get_current_context()
    return support.run_holder(context["dag"].dag_id, context["run_id"])


def _release_on_failure(config: PipelineConfig) -> Callable[[Context], None]:
    """A task's final-failure callback: mark the run failed and free the pipeline lock.

    The same as the CLI does when a run fails: state is kept, so clearing the run
    (``plan`` takes the lock again) or triggering the DAG again resumes it.
    """
    def callback(context: Context) -> None:
        run = context["ti"].xcom_pull(task_ids="plan", key="run_id")
        if not run:  # failed before plan took the lock and started a run
            return
        exc = context.get("exception")
        error = f"task {context['ti'].task_id}: {describe(exc) if isinstance(exc, BaseException) else 'failed'}"
        log.error("%s", error)  # the same one line as `status` shows, in the task log
        holder = support.run_holder(context["dag"].dag_id, context["run_id"])
        steps.fail_run(config, str(run), error, holder=holder)
    return callback


def _request(config: PipelineConfig) -> support.RunRequest:
    context = get_current_context()
    return support.run_request(config, context["params"], context["dag_run"].conf)


def _mask_password(config: PipelineConfig) -> None:
    """Register the source password with Airflow's log masker before any step runs."""
    from airflow.sdk.log import mask_secret

    password = config.resolve_password()
    if password:
        mask_secret(password)


def build_dag(config: PipelineConfig) -> DAG:
    """The DAG ``tidemark_<pipeline>`` of one pipeline config (not auto-registered)."""
    # A table of an explicit entry is an Asset; a pattern entry's tables are known only when a run
    # is planned, so the pattern is an AssetAlias its published tables' Assets are added to.
    assets = {t.name: Asset(support.asset_uri(config, t.name)) for t in config.tables if not t.pattern}
    aliases = {t.name: AssetAlias(support.alias_name(config, t.name)) for t in config.tables if t.pattern}
    pool = support.pool_name(config)
    # Airflow fails (and retries) a task running longer than this; the run resumes.
    limit = support.execution_timeouts(config)
    with DAG(
        dag_id=support.dag_id(config),
        description=f"Tidemark snapshots of {len(config.tables)} table entr(ies) from {config.path}",
        doc_md=support.doc_md(config),
        schedule=config.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["tidemark", config.pipeline],
        params={name: Param(**spec) for name, spec in support.params_schema(config).items()},
        default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY, "retry_policy": NO_RETRY_ON,
                      "on_failure_callback": _release_on_failure(config)},
        auto_register=False,
    ) as dag:

        @task(pool=pool, execution_timeout=limit["preflight"])
        def preflight() -> None:
            _mask_password(config)
            steps.preflight(config, _request(config).tables)

        # XCom: the batches to read (the return value, mapped over) and key "run_id".
        @task(pool=pool, execution_timeout=limit["plan"])
        def plan() -> list[dict[str, Any]]:
            _mask_password(config)
            request = _request(config)
            with hold_lock(config, _holder()):  # renewed while the task runs; fences its writes
                handle = steps.plan(config, tables=request.tables, snapshot=request.snapshot,
                                    chunk_size=request.chunk_size, holder=_holder())
            log.info("%s; tables %s", handle, ", ".join(handle.tables))
            get_current_context()["ti"].xcom_push(key="run_id", value=handle.run_id)
            return [support.batch_xcom(b) for b in handle.batches]

        @task(pool=pool, map_index_template=MAP_INDEX_TEMPLATE, execution_timeout=limit["read"])
        def read(run: str, batch: dict[str, Any]) -> None:
            _mask_password(config)
            with hold_lock(config, _holder()):
                log.info("%s", steps.read_batch(config, run, int(batch["batch"]), holder=_holder()))

        # Zero batches (only incremental tables) skip `read`; capture still runs.
        @task(pool=pool, trigger_rule="none_failed", execution_timeout=limit["capture"])
        def capture(run: str) -> None:
            _mask_password(config)
            with hold_lock(config, _holder()):
                result = steps.capture(config, run)
            log.info("capture: %s", result or "every table already captured")

        @task(execution_timeout=limit["reconcile"])
        def reconcile(run: str) -> None:
            with hold_lock(config, _holder()):
                log.info("%s", steps.reconcile(config, run))

        @task(outlets=[*assets.values(), *aliases.values()], execution_timeout=limit["publish"])
        def publish(run: str) -> Iterator[Metadata]:
            with hold_lock(config, _holder()):
                published = {p.table: p for p in steps.publish(config, run, holder=_holder())}
            for p in published.values():
                log.info("published %s", p)
                pattern = support.pattern_of(config, p.table)
                if p.table not in assets and pattern is not None:  # its Asset joins the pattern's alias
                    yield Metadata(Asset(support.asset_uri(config, p.table)), support.asset_extra(p, run),
                                   alias=aliases[pattern])
            for table, asset in assets.items():
                if table in published:
                    yield Metadata(asset, support.asset_extra(published[table], run))
                else:
                    yield Metadata(asset, support.not_published_extra(table, run))

        batches = plan()
        run_id: Any = XComArg(dag.get_task("plan"), key="run_id")  # a str when the tasks run
        reads = read.partial(run=run_id).expand(batch=batches)
        preflight() >> batches
        reads >> capture(run_id) >> reconcile(run_id) >> publish(run_id)
    return dag


@dataclass
class Pipelines:
    """The DAGs built from a configs folder, and every problem that kept one out."""

    dags: dict[str, DAG] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def collect(folder: Path, *, only: str | None = None) -> Pipelines:
    """Build and validate the DAG of every good config in ``folder``.

    Args:
        folder: the configs folder.
        only: build just this DAG id (Airflow's parsing context when it runs a task).
    """
    scan = support.scan_configs(folder)
    out = Pipelines(problems=list(scan.problems))
    for config in scan.configs:
        if only is not None and support.dag_id(config) != only:
            continue
        try:
            dag = build_dag(config)
        except Exception as exc:
            out.problems.append(f"{config.path}: cannot build DAG {support.dag_id(config)}: {exc}")
            continue
        try:
            dag.timetable.validate()
        except Exception as exc:
            out.problems.append(f"{config.path}: schedule: {config.schedule!r} is not a cron "
                                f"expression or preset Airflow accepts: {exc}")
            continue
        try:
            dag.validate()
        except Exception as exc:
            out.problems.append(f"{config.path}: DAG {dag.dag_id} is invalid: {exc}")
            continue
        out.dags[dag.dag_id] = dag
    return out
