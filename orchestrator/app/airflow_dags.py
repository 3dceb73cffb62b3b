"""One Airflow DAG per Tidemark pipeline config: the TaskFlow wiring, nothing else.

Each task up to ``publish`` calls exactly one `orchestrator.app.steps` function, the same the
CLI calls; ``outcome`` fails the DAG run when the run ended partial (tables failed on their
own), after ``publish`` recorded the other tables' asset events (Airflow records a task's
outlet events only when it succeeds). Everything else comes from
`orchestrator.app.airflow_support`. This module defines no DAG itself; the two thin DAG
files in ``dags/`` import it from the installed package, so a plain
``DagBag(dag_folder="dags")`` loads them.

    plan >> read (mapped over batches) >> capture >> reconcile >> publish >> outcome

``plan`` checks the source first (`steps.preflight`, what ``tidemark run`` does first too). A
run with nothing to read (every table incremental, or a resumed run whose chunks are all
read) takes a shorter way: ``plan`` captures, reconciles and publishes itself, in the same
process, announces the tables through AssetAliases, and skips the tasks after it (``outcome``
too, unless tables failed on their own). Likewise ``publish`` skips ``outcome`` when no table
failed. Each task is a process of its own that imports Tidemark and Airflow again
(docs/airflow.md, "What a DAG run costs"); a run whose tasks would each do little pays that once
instead of five times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

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
    SkipMixin,
    XComArg,
    get_current_context,
    get_parsing_context,
    task,
)

from orchestrator.config import DAG_ID_PREFIX, PipelineConfig
from orchestrator.services.lean import arrow_without_pandas, system_allocator

# A task process of a Tidemark DAG parses the DAG file for its DAG only and runs nothing else:
# pyarrow there looks for no pandas and takes malloc (`orchestrator.services.lean`). Elsewhere
# (the DAG processor, a DagBag, another DAG's task importing this module) pyarrow is left as it
# is, for others' pandas objects.
if (get_parsing_context().dag_id or "").startswith(DAG_ID_PREFIX):
    system_allocator()
    arrow_without_pandas()

from orchestrator.app import airflow_support as support
from orchestrator.app import steps
from orchestrator.errors import ConfigError, LockLost, RunLocked, SourceNotReady
from orchestrator.pipeline.context import hold_lock, open_store
from orchestrator.pipeline.failed import TablesFailed
from orchestrator.services.failures import describe

log = logging.getLogger("tidemark.dag")

START_DATE = datetime(2024, 1, 1, tzinfo=UTC)
RETRIES = 2
RETRY_DELAY = timedelta(minutes=1)
#: Retrying cannot fix a bad config, a source that is not set up, or a run held by another.
NO_RETRY_ON = ExceptionRetryPolicy(
    rules=[
        RetryRule(
            exception=[ConfigError, SourceNotReady, RunLocked, LockLost, TablesFailed],
            action=RetryAction.FAIL,
            reason="not transient: fix the config or the source, then clear the task (or trigger "
            "the DAG: a new run retries the tables that failed)",
        )
    ]
)
MAP_INDEX_TEMPLATE = "{{ task.op_kwargs['batch']['label'] }}"
#: What ``plan`` skips when it published the run itself (``outcome`` too unless tables failed).
DONE_IN_PLAN = ("read", "capture", "reconcile", "publish")


def _holder() -> str:
    context = get_current_context()
    return support.run_holder(context["dag"].dag_id, context["run_id"])


def _warn_if_not_asked(
    config: PipelineConfig, handle: steps.RunHandle, request: support.RunRequest
) -> None:
    """A warning when the DAG run resumes a run its params did not ask for (never a failure:
    the run is planned by then)."""
    if not handle.resumed:
        return
    try:
        asked = handle.asked(
            steps.requested_tables(config, request.tables), request.snapshot, request.chunk_size
        )
    except Exception as exc:  # the source asked for a pattern's tables: only the warning is lost
        log.info("could not compare the resumed run with this DAG run's params: %s", exc)
        return
    if not asked:
        log.warning(
            "this DAG run resumes the unfinished run %s, not what its params ask for; "
            "trigger the DAG again with them once it is done",
            handle.run_id,
        )


def _release_on_failure(config: PipelineConfig) -> Callable[[Context], None]:
    """A task's final-failure callback: mark the run failed and free the pipeline lock.

    The same as the CLI does when a run fails: state is kept, so clearing the run
    (``plan`` takes the lock again) or triggering the DAG again resumes it. A ``plan`` that
    failed after taking the lock but before it pushed a run id frees the lock too.
    """

    def callback(context: Context) -> None:
        holder = support.run_holder(context["dag"].dag_id, context["run_id"])
        task_id = context["ti"].task_id
        run = context["ti"].xcom_pull(task_ids="plan", key="run_id")
        if not run:  # failed before plan started a run; plan may have taken the lock first
            if task_id == "plan":
                _release_held(config, holder)
            return
        exc = context.get("exception")
        what = _described(config, exc) if isinstance(exc, BaseException) else "failed"
        error = f"task {task_id}: {what}"
        log.error("%s", error)  # the same one line as `status` shows, in the task log
        steps.fail_run(config, str(run), error, holder=holder)

    return callback


def _described(config: PipelineConfig, exc: BaseException) -> str:
    """A task's failure in one line, as the CLI says it: a lost connection names its server
    (the source, the state store, the Iceberg catalog)."""
    from orchestrator.app.run import other_servers

    return describe(exc, f"{config.source.host}:{config.source.port}", other_servers(config))


def _release_held(config: PipelineConfig, holder: str) -> None:
    """Free the pipeline lock if ``holder`` (this DAG run) holds it; another's is left alone."""
    store = open_store(config)
    try:
        lock = store.lock_info(config.pipeline)
        if lock is not None and lock.holder == holder:
            log.info("releasing the lock of pipeline %s held as run %s", config.pipeline, holder)
            store.release_lock(config.pipeline, holder)  # a no-op if it changed hands meanwhile
    finally:
        store.close()


@contextmanager
def _hold_for(config: PipelineConfig, run: str) -> Iterator[None]:
    """`hold_lock` for a step of the planned run ``run``, as this DAG run's holder.

    A run the state store marks failed by the time the step ends (a sibling task failed for
    good and its callback released the lock, e.g. another mapped ``read``) gets the lock
    released again: the DAG run is failing, and a lock kept would refuse the next trigger for
    a whole lease. Its work is kept; a cleared or new run resumes from it.
    """
    holder = _holder()
    with hold_lock(config, holder):
        yield
        store = open_store(config)  # fenced by the lease held: releasing it marks it released
        try:
            if store.get_run(run).status == "failed":
                log.warning(
                    "run %s was marked failed while this task ran (another task of the DAG "
                    "run failed): releasing the pipeline lock; its work is kept",
                    run,
                )
                store.release_lock(config.pipeline, holder)
        finally:
            store.close()


def _publish_step(
    config: PipelineConfig, run: str, holder: str
) -> tuple[dict[str, steps.Published], dict[str, dict[str, Any]]]:
    """`steps.publish`, with a partial run's error turned into what it published and what failed
    (those tables' asset events are still announced; ``outcome`` fails the DAG run)."""
    try:
        done = steps.publish(config, run, holder=holder)
        failed: dict[str, dict[str, Any]] = {}
    except TablesFailed as exc:  # the others are published: announce them
        log.error("%s", exc)
        done, failed = exc.published, exc.failed
    for p in done:
        log.info("published %s", p)
    return {p.table: p for p in done}, failed


def _skip(dag: DAG, task_ids: list[str]) -> NoReturn:
    """End the running task successfully, with ``task_ids`` of its DAG run skipped (Airflow's
    `SkipMixin`: the grid shows them skipped, the scheduler starts no process for them)."""
    log.info("skipping %s", ", ".join(task_ids))
    SkipMixin().skip(get_current_context()["ti"], [dag.get_task(t) for t in task_ids])
    raise AssertionError("SkipMixin.skip ends the task")  # it raises DownstreamTasksSkipped


def _run_rest(
    config: PipelineConfig, run: str, holder: str
) -> tuple[dict[str, steps.Published], dict[str, dict[str, Any]]]:
    """Capture, reconcile and publish a run with nothing to read, in ``plan``'s process (under its
    lock): what the three tasks after ``read`` would do, each step as idempotent as there."""
    log.info("run %s: nothing to read; capture, reconcile and publish in this task", run)
    log.info("capture: %s", steps.capture(config, run) or "every table already captured")
    log.info("%s", steps.reconcile(config, run))
    return _publish_step(config, run, holder)


def _announce(events: Iterator[_Event], caught_up: AssetAlias) -> None:
    """Record asset events from a task that declares only aliases (``plan``): each through its
    pattern's alias, a table of an entry of its own through ``caught_up``."""
    outlet_events = get_current_context()["outlet_events"]
    for event in events:
        outlet_events[event.alias or caught_up].add(event.asset, extra=event.extra)


@dataclass(frozen=True, slots=True)
class _Event:
    """One asset event of a run: the table's Asset, its extra, the alias announcing it (None: a
    declared outlet of the task)."""

    asset: Asset
    extra: dict[str, Any]
    alias: AssetAlias | None


def _events(
    config: PipelineConfig,
    run: str,
    published: dict[str, steps.Published],
    failed: dict[str, dict[str, Any]],
    assets: dict[str, Asset],
    aliases: dict[str, AssetAlias],
) -> Iterator[_Event]:
    """The asset events of a published run: each table of a pattern entry it published joins
    its pattern's alias; each table of an entry of its own gets one (``published: false`` when
    the run did not publish it)."""
    for p in published.values():
        pattern = support.pattern_of(config, p.table)
        if p.table not in assets and pattern is not None:
            asset = Asset(support.asset_uri(config, p.table))
            yield _Event(asset, support.asset_extra(p, run), aliases[pattern])
    for table, asset in assets.items():
        if table in published:
            yield _Event(asset, support.asset_extra(published[table], run), None)
        else:
            extra = support.not_published_extra(table, run, failed.get(table))
            yield _Event(asset, extra, None)


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
    assets = {
        t.name: Asset(support.asset_uri(config, t.name)) for t in config.tables if not t.pattern
    }
    aliases = {
        t.name: AssetAlias(support.alias_name(config, t.name)) for t in config.tables if t.pattern
    }
    # `plan` publishes a run with nothing to read itself. Declaring the Assets on it would emit an
    # event for each whenever it succeeds, so it announces them through an alias of its own.
    caught_up = AssetAlias(support.caught_up_alias_name(config))
    pool = support.pool_name(config)
    # Airflow fails (and retries) a task running longer than this; the run resumes.
    limit = support.execution_timeouts(config)
    with DAG(
        dag_id=support.dag_id(config),
        description=f"Tidemark snapshots of {len(config.tables)} table entr(ies) "
        f"from {config.path}",
        doc_md=support.doc_md(config),
        schedule=config.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["tidemark", config.pipeline],
        params={name: Param(**spec) for name, spec in support.params_schema(config).items()},
        default_args={
            "retries": RETRIES,
            "retry_delay": RETRY_DELAY,
            "retry_policy": NO_RETRY_ON,
            "on_failure_callback": _release_on_failure(config),
        },
        auto_register=False,
    ) as dag:
        # XCom: the batches to read (the return value, mapped over) and key "run_id". With no
        # batch, the run is captured, reconciled and published here and the tasks after skipped.
        @task(
            pool=pool,
            execution_timeout=limit["plan"],
            outlets=[caught_up, *aliases.values()],
        )
        def plan() -> list[dict[str, Any]]:
            _mask_password(config)
            request = _request(config)
            # the source's checks, as `tidemark run` makes them first: the lock is not taken when
            # the source is not ready; tables failing a check of their own are left out
            checked = steps.preflight(config, request.tables)
            for table, why in sorted(checked.failing.items()):
                log.warning("table %s is left out of this run: %s", table, why)
            holder = _holder()
            with hold_lock(config, holder):  # renewed while the task runs; fences its writes
                # snapshot: the chosen tables leave an unfinished run of another DAG run, as
                # `run --snapshot` does (one none of whose tables is left is left behind), so a
                # run that keeps failing does not keep a trigger from re-snapshotting its tables
                handle = steps.plan(
                    config,
                    tables=request.tables,
                    snapshot=request.snapshot,
                    chunk_size=request.chunk_size,
                    holder=holder,
                    failing=checked.failing,
                    shapes=checked.shapes,
                    fresh=request.snapshot,
                )
                log.info("%s; tables %s", handle, ", ".join(handle.tables))
                get_current_context()["ti"].xcom_push(key="run_id", value=handle.run_id)
                _warn_if_not_asked(config, handle, request)
                if handle.batches:
                    from airflow.sdk import conf  # the worker's config, read once needed

                    limit = conf.getint("core", "max_map_length", fallback=1024)
                    return support.batches_xcom(handle.run_id, handle.batches, limit)
                published, failed = _run_rest(config, handle.run_id, holder)
            _announce(_events(config, handle.run_id, published, failed, assets, aliases), caught_up)
            skip = [*DONE_IN_PLAN]
            if support.tables_failed(config, handle.run_id) is None:
                skip.append("outcome")
            log.info("published in plan")
            _skip(dag, skip)

        @task(pool=pool, map_index_template=MAP_INDEX_TEMPLATE, execution_timeout=limit["read"])
        def read(run: str, batch: dict[str, Any]) -> None:
            _mask_password(config)
            with _hold_for(config, run):
                log.info("%s", steps.read_batch(config, run, int(batch["batch"]), holder=_holder()))

        # Zero batches (only incremental tables) skip `read`; capture still runs.
        @task(pool=pool, trigger_rule="none_failed", execution_timeout=limit["capture"])
        def capture(run: str) -> None:
            _mask_password(config)
            with _hold_for(config, run):
                result = steps.capture(config, run)
            log.info("capture: %s", result or "every table already captured")

        @task(execution_timeout=limit["reconcile"])
        def reconcile(run: str) -> None:
            with _hold_for(config, run):
                log.info("%s", steps.reconcile(config, run))

        # Airflow records outlet events only for a task that succeeds: a run some tables failed
        # in (partial) publishes the others and succeeds here with their events; `outcome` fails.
        @task(outlets=[*assets.values(), *aliases.values()], execution_timeout=limit["publish"])
        def publish(run: str) -> Iterator[Metadata]:
            with _hold_for(config, run):
                published, failed = _publish_step(config, run, _holder())
            for event in _events(config, run, published, failed, assets, aliases):
                yield Metadata(event.asset, event.extra, alias=event.alias)
            if support.tables_failed(config, run) is None:  # nothing for `outcome` to fail
                _skip(dag, ["outcome"])  # the events yielded are recorded: the task succeeds

        # Fails the DAG run when tables failed on their own (the run ended partial), as the CLI
        # exits 1; the other tables' asset events are recorded by then. Only then does it run:
        # `publish` (or `plan`, having published itself and skipped `publish`) skips it otherwise.
        @task(trigger_rule="none_failed", execution_timeout=limit["outcome"])
        def outcome(run: str) -> None:
            failure = support.tables_failed(config, run)
            if failure is not None:
                raise failure
            log.info("run %s: no table failed", run)

        batches = plan()
        run_id: Any = XComArg(dag.get_task("plan"), key="run_id")  # a str when the tasks run
        reads = read.partial(run=run_id).expand(batch=batches)
        reads >> capture(run_id) >> reconcile(run_id) >> publish(run_id) >> outcome(run_id)
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
            out.problems.append(
                f"{config.path}: schedule: {config.schedule!r} is not a cron "
                f"expression or preset Airflow accepts: {exc}"
            )
            continue
        try:
            dag.validate()
        except Exception as exc:
            out.problems.append(f"{config.path}: DAG {dag.dag_id} is invalid: {exc}")
            continue
        out.dags[dag.dag_id] = dag
    return out
