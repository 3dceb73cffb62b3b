"""The consistency scenario on a real Spark standalone cluster: a master and two workers on
localhost.

`tidemark run` runs as its own process (as a user runs it) with ``spark.master``
pointing at the cluster, so reads, reconcile and publish run in executors on
the workers, not in the driver: the JDBC driver jar reaches them through
``spark.jars``, staging and output are a local directory every worker reaches
(one machine), or an S3 endpoint (moto's server) the executors write to through s3a. Writers
change the tables during the first run; a second run applies what came after; then every table
equals its source.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import SHOP_TABLES, connect, load_shop
from orchestrator.config import load_config
from orchestrator.state.store import StateStore
from tests.conftest import pipeline_config, s3_output, write_config
from tests.iceberg_readers import assert_readers_equal_source
from tests.integration.test_consistency import _verify_all, load_tables, run_under_writers
from tests.services import MotoS3
from tests.spark_cluster import StandaloneCluster, cluster_env
from tests.spark_iceberg import read_with_spark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "on_cluster"

#: Modest memory: a 1 GB driver, one 768 MB executor per 1 GB worker, one core each.
CLUSTER_CONF = {
    "spark.driver.memory": "1g",
    "spark.executor.memory": "768m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    started = StandaloneCluster.start(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g"
    )
    try:
        yield started
    finally:
        started.stop()


def _tidemark(
    config_path: Path, cluster: StandaloneCluster, *args: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = cluster_env(cluster.root / "driver-logs")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("TIDEMARK_FAILPOINT", None)
    if failpoint:
        env["TIDEMARK_FAILPOINT"] = failpoint
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(config_path),
            "--no-progress",
            *args,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _tidemark_run(config_path: Path, cluster: StandaloneCluster) -> None:
    result = _tidemark(config_path, cluster)
    assert result.returncode == 0, f"tidemark run failed:\n{result.stderr[-4000:]}"


def test_snapshot_on_standalone_cluster_equals_source(
    mariadb: LocalMariaDB, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    db = "clu_shop"
    tables = load_tables(mariadb, db, orders=3000, typed_rows=600, seed=3)
    lake = tmp_path / "lake"  # staging is <lake>/_staging: one directory both workers reach
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name=PIPELINE,
            spark={"master": cluster.master_url, "conf": dict(CLUSTER_CONF)},
            output={"path": lake.as_uri()},
            defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.05},
        ),
    )

    run_under_writers(
        mariadb, db, typed_rows=600, pause=0.002, run=lambda: _tidemark_run(config_path, cluster)
    )
    _tidemark_run(config_path, cluster)  # applies what was written after H
    _verify_all(config_path, tables)

    apps = [a for a in cluster.state()["completedapps"] if a["name"] == f"tidemark-{PIPELINE}"]
    # The second run's rewrites are small enough for the driver (no Spark session): one app.
    assert len(apps) == 1, "the snapshot must have been an application of the cluster"
    ran = cluster.executor_dirs()
    assert len(ran) == 2 and all(ran.values()), f"every worker must have run executors: {ran}"


@pytest.mark.parametrize("failpoint", ["read.batch_done:2", "publish.files_written:1"])
def test_killed_run_on_cluster_resumes(
    mariadb: LocalMariaDB, cluster: StandaloneCluster, tmp_path: Path, failpoint: str
) -> None:
    """A driver killed mid-run leaves the cluster's executors orphaned; the rerun resumes."""
    db = "clu_resume_" + failpoint.split(".")[0]
    root = connect("127.0.0.1", mariadb.port, "root", "")
    load_shop(root, 4000, db=db)
    root.close()
    tables = [f"{db}.{t}" for t in SHOP_TABLES]
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name=f"{PIPELINE}_resume",
            spark={"master": cluster.master_url, "conf": dict(CLUSTER_CONF)},
            output={"path": (tmp_path / "lake").as_uri()},
            defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )
    killed = _tidemark(config_path, cluster, failpoint=failpoint)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    store = StateStore(load_config(config_path).state.url)
    run = store.unfinished_run(f"{PIPELINE}_resume")
    assert run is not None, "the killed run must be left unfinished"
    done_before = {(c.table, c.index) for c in store.chunks(run.run_id, status="done")}
    assert done_before, "the crash comes after some chunks were read"
    mariadb.execute(
        f"UPDATE {db}.orders SET note = 'after crash' WHERE id % 7 = 0",
        f"DELETE FROM {db}.orders WHERE id % 11 = 0",
    )
    resumed = _tidemark(config_path, cluster)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"resuming unfinished run {run.run_id}" in resumed.stdout
    assert all(
        c.attempts == 1 for c in store.chunks(run.run_id) if (c.table, c.index) in done_before
    ), "chunks done before the crash must not be read again"
    assert store.get_run(run.run_id).status == "succeeded"
    store.close()
    _tidemark_run(config_path, cluster)  # catches up with the changes made after the crash
    _verify_all(config_path, tables)


def test_cluster_with_staging_and_lake_on_s3_equals_source(
    mariadb: LocalMariaDB,
    cluster: StandaloneCluster,
    s3_server: MotoS3,
    s3_bucket: str,
    pg_state: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Executors on both workers write the chunk files through s3a into S3 staging (no
    directory the workers share); the driver publishes to the lake on S3; lake == source through
    pyiceberg, DuckDB and Iceberg's Java library in Spark."""
    db = "clu_s3"
    tables = load_tables(mariadb, db, orders=2000, typed_rows=300, seed=9)
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name="on_cluster_s3",
            spark={"master": cluster.master_url, "conf": dict(CLUSTER_CONF)},
            output=s3_output(s3_server, s3_bucket),
            state={"url": pg_state[0]},
            defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.05},
        ),
    )
    before = {w: len(d) for w, d in cluster.executor_dirs().items()}
    run_under_writers(
        mariadb, db, typed_rows=300, pause=0.002, run=lambda: _tidemark_run(config_path, cluster)
    )
    _tidemark_run(config_path, cluster)
    with StateStore(pg_state[0]) as store:
        first = store.runs("on_cluster_s3", limit=2)[-1]
        paths = {c.path for c in store.chunks(first.run_id) if c.path}
    assert paths and all(p.startswith(f"s3a://{s3_bucket}/staging/") for p in paths), paths
    ran = {w: len(d) - before.get(w, 0) for w, d in cluster.executor_dirs().items()}
    assert len(ran) == 2 and all(ran.values()), f"every worker must have run executors: {ran}"
    assert not (tmp_path / "lake").exists()
    config = load_config(config_path)
    spark = read_with_spark(config_path, tmp_path / "spark", pg_state[1], tables)
    assert_readers_equal_source(config, tables, spark)
