"""The lake and staging on an S3 endpoint (moto's server, tests/services.py), run for real.

Real MariaDB, real Spark (``local[2]``, writing chunk files through s3a), the state store and the
Iceberg SQL catalog on a real PostgreSQL. Every test ends with lake == source read three ways:
pyiceberg from S3, DuckDB with httpfs and iceberg, and Spark with ``iceberg-spark-runtime``
(``load(<metadata_location>)`` and by name through Iceberg's ``JdbcCatalog`` over the state
store's catalog tables, tests/spark_iceberg.py). Runs are ``tidemark run`` processes, whose Spark
session carries the S3 connector (the test session's shared one does not).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig, load_config
from orchestrator.lake import storage
from orchestrator.lake.iceberg import ATTEMPT, RUN_ID, VERSION, open_catalog
from orchestrator.lake.manifest import load_pending, read_manifest, read_published, version_uri
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.publish.staging import pending_file
from orchestrator.state.store import StateStore
from tests.conftest import pipeline_config, s3_output, write_config
from tests.iceberg_readers import assert_readers_equal_source, duckdb_table
from tests.integration.test_consistency import load_tables, run_under_writers
from tests.integration.test_resume import _change_source, tidemark
from tests.services import MotoS3
from tests.spark_iceberg import read_with_spark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def s3_pipeline(
    tmp_path: Path,
    mariadb: LocalMariaDB,
    s3: MotoS3,
    bucket: str,
    state_url: str,
    tables: list[str],
    **defaults: Any,
) -> Path:
    """A config with staging and lake in ``bucket``, state and catalog at ``state_url``."""
    return write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name="s3lake",
            output=s3_output(s3, bucket),
            state={"url": state_url},
            defaults={"chunk_size": 700, "batch_chunks": 3, "read_margin_seconds": 0.05} | defaults,
        ),
    )


def run_ok(config_path: Path, *args: str) -> None:
    done = tidemark(config_path, *args)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


def assert_lake_equals_source_three_ways(
    config_path: Path, tables: list[str], jdbc_url: str, out: Path
) -> None:
    """pyiceberg, DuckDB (httpfs) and Spark (both ways) each equal the source."""
    config = load_config(config_path)
    spark = read_with_spark(config_path, out, jdbc_url, tables)
    assert_readers_equal_source(config, tables, spark)


def assert_nothing_local(tmp_path: Path) -> None:
    """No lake or staging directory was made on the local disk."""
    assert not (tmp_path / "lake").exists()
    assert not any(p.name in ("_staging", "staging") for p in tmp_path.rglob("*"))


def test_snapshot_under_writers_then_incremental_on_s3(
    mariadb: LocalMariaDB,
    s3_server: MotoS3,
    s3_bucket: str,
    pg_state: tuple[str, str],
    tmp_path: Path,
) -> None:
    db = "s3_cons"
    tables = load_tables(mariadb, db, orders=3_000, typed_rows=400, seed=11)
    config_path = s3_pipeline(tmp_path, mariadb, s3_server, s3_bucket, pg_state[0], tables)

    run_under_writers(mariadb, db, typed_rows=400, pause=0.002, run=lambda: run_ok(config_path))
    with StateStore(pg_state[0]) as store:
        paths = {c.path for c in store.chunks(store.runs("s3lake", limit=1)[0].run_id)}
    assert paths and all(str(p).startswith(f"s3a://{s3_bucket}/staging/") for p in paths), paths
    run_ok(config_path)  # applies what was written after H
    assert_lake_equals_source_three_ways(config_path, tables, pg_state[1], tmp_path / "spark1")

    run_under_writers(mariadb, db, typed_rows=400 + 10_000, pause=0.002, run=lambda: time.sleep(2))
    log = s3_server.root / "moto.log"
    mark = log.stat().st_size
    run_ok(config_path)  # incremental
    sent = log.read_bytes()[mark:].decode(errors="replace")
    assert_requests_spared(sent)
    config = load_config(config_path)
    assert all(read_manifest(table_dir(config, t))["version"] >= 2 for t in tables)
    assert_new_files_not_read(config, tables, sent)
    assert_previous_version_not_read(config, tables, sent)
    assert_lake_equals_source_three_ways(config_path, tables, pg_state[1], tmp_path / "spark2")
    assert_nothing_local(tmp_path)
    assert not [k for k in s3_server.keys(s3_bucket, "lake/") if k.startswith("lake/_staging")]


def assert_new_files_not_read(config: PipelineConfig, tables: list[str], log: str) -> None:
    """No data file of the versions a run published was read: each was copied from its staging
    file, whose footer publish had read, and the Iceberg commit listed it from that footer."""
    new = []
    for table in tables:
        manifest = read_manifest(table_dir(config, table))
        for name in manifest["files"]:
            if name.startswith(f"data/v{manifest['version']:06d}-"):
                uri = storage.join(table_dir(config, table), name)
                new.append("/" + uri.split("://", 1)[1])  # as moto logs it (path style)
    sent = re.findall(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (\S+) ', log)
    assert new
    read = [path for _, path in sent if path.split("?")[0] in new]
    assert not read, read


def assert_previous_version_not_read(config: PipelineConfig, tables: list[str], log: str) -> None:
    """Retention took the version current before a run's publish from what publish had read of
    it (`current.json`), not from its `versions/<n>.json`."""
    previous = []
    for table in tables:
        version = read_manifest(table_dir(config, table))["version"]
        uri = version_uri(table_dir(config, table), version - 1)
        previous.append("/" + uri.split("://", 1)[1])  # as moto logs it (path style)
    sent = re.findall(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (\S+) ', log)
    assert not [path for _, path in sent if path in previous]


def assert_requests_spared(log: str) -> None:
    """A run's requests (moto's log): each Iceberg metadata file read once (pyiceberg alone reads
    a version's parent manifest list and manifests three times), each base data file the
    rewrite reads (all small here) fetched whole once (`storage.open_parquet`: it was opened three
    times, 8 requests), and no staging file deleted alone (a moved file's source goes with the
    run's staging directory, in one bulk delete)."""
    sent = re.findall(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) ', log)  # ANSI
    reads = Counter(path for method, path in sent if method == "GET" and "/metadata/" in path)
    assert reads and max(reads.values()) == 1, reads
    base = Counter((m, p) for m, p in sent if m in ("GET", "HEAD") and "/data/" in p)
    assert base and max(base.values()) == 1, base
    deleted = [path for method, path in sent if method == "DELETE" and path.endswith(".parquet")]
    assert not deleted, deleted


def _version_rows(config: PipelineConfig, table: str, summary: Any) -> list[tuple[Any, ...]]:
    """The rows of the version an Iceberg snapshot (its ``summary``) holds, from that version's
    manifest's files (the pending manifest its publish attempt wrote to staging before the
    commit, until the version is switched)."""
    tdir = table_dir(config, table)
    version = int(summary[VERSION])
    if storage.exists(version_uri(tdir, version)):
        files = json.loads(storage.read_bytes(version_uri(tdir, version)))["files"]
    else:
        pending = load_pending(pending_file(config, summary[RUN_ID], summary[ATTEMPT]), table)
        assert pending is not None, f"{table}: version {version} committed without its manifest"
        files = pending["files"]
    rows = []
    for name in files:
        fs, path = storage.filesystem(storage.join(tdir, name))
        rows += [tuple(r.values()) for r in pq.read_table(path, filesystem=fs).to_pylist()]
    return sorted(rows, key=repr)


def assert_readable_and_exact(config_path: Path, tables: list[str]) -> None:
    """After a crash: each table's catalog snapshot (pyiceberg) holds exactly the rows of the
    version its summary names, and DuckDB on ``current.json``'s metadata file exactly those of
    the current manifest's version (the two differ only between the commit and the switch)."""
    config = load_config(config_path)
    catalog = open_catalog(config)
    for table in tables:
        tdir = table_dir(config, table)
        snapshot = catalog.load_table(table).current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        committed = int(snapshot.summary[VERSION])
        scanned = catalog.load_table(table).scan().to_arrow().to_pylist()
        assert sorted((tuple(r.values()) for r in scanned), key=repr) == _version_rows(
            config, table, snapshot.summary
        ), f"{table}: the catalog's snapshot is not version {committed}"
        current = read_manifest(tdir)["version"]
        assert committed in (current, current + 1)
        duck = duckdb_table(tdir, config.output.s3).to_pylist()
        assert sorted((tuple(r.values()) for r in duck), key=repr) == sorted(
            (tuple(r.values()) for r in read_published(tdir).to_pylist()), key=repr
        )


#: Killed one after another: each run resumes the unfinished run and is killed at the next.
#: In the order a run passes them (orchestrator/services/faults.py).
FAILPOINTS = (
    "read.batch_done:1",
    "capture.checkpoint:1",
    "reconcile.table_done:1",
    "publish.file_moved:1",
    "publish.iceberg_committed:1",
    "publish.files_written:1",
    "publish.table_done:1",
)


def test_kill_at_each_failpoint_on_s3_then_rerun(
    mariadb: LocalMariaDB,
    s3_server: MotoS3,
    s3_bucket: str,
    pg_state: tuple[str, str],
    tmp_path: Path,
) -> None:
    """``kill -9`` mid-read and at each publish failpoint, one run after another, with the
    source changed in between: after each crash every table is readable and exact; a plain rerun
    then publishes the source."""
    db = "s3_kill"
    tables = load_tables(mariadb, db, orders=2_000, typed_rows=200, seed=3)
    tables = [t for t in tables if not t.endswith("all_types")]
    config_path = s3_pipeline(
        tmp_path, mariadb, s3_server, s3_bucket, pg_state[0], tables, chunk_size=500
    )
    run_ok(config_path)
    store = StateStore(pg_state[0])
    try:
        for salt, failpoint in enumerate(FAILPOINTS, start=1):
            _change_source(mariadb, db, salt)
            killed = tidemark(
                config_path, "--snapshot", "--table", f"{db}.orders", failpoint=failpoint
            )
            assert killed.returncode == -signal.SIGKILL, (failpoint, killed.stderr[-3000:])
            assert store.unfinished_run("s3lake") is not None, failpoint
            assert_readable_and_exact(config_path, tables)
    finally:
        store.close()
    run_ok(config_path, "--snapshot", "--table", f"{db}.orders")
    run_ok(config_path)
    assert_lake_equals_source_three_ways(config_path, tables, pg_state[1], tmp_path / "spark")
    assert_nothing_local(tmp_path)
