"""A source user allowed fewer connections at once than a run holds (``CREATE USER ... WITH
MAX_USER_CONNECTIONS 4``, as shared and managed servers give): `doctor` and the run's preflight
fail before any read, naming the limit, what a run holds (its Spark read tasks and 3 of its
own) and the fixes; the fix they name (``spark.master: local[1]``) reads within it. Before, the
reads were refused over the limit and every run failed, reported as a lost connection ("check
that the source is up"), each reading a little further."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.doctor import run_checks
from orchestrator.config import load_config
from orchestrator.errors import SourceNotReady
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.source.connection import Source
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DB = "tm_connection_limit"


def test_a_user_limited_to_fewer_connections_than_a_run_holds_is_named_with_the_fix(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    fresh_database(
        mariadb,
        DB,
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {DB}.t SELECT seq, seq FROM seq_1_to_{4 * LOCAL_ROWS}",
        f"CREATE TABLE {DB}.nokey (a INT)",
        f"INSERT INTO {DB}.nokey VALUES (1), (1), (2)",
        f"ANALYZE TABLE {DB}.t",
    )
    mariadb.execute(
        "CREATE USER IF NOT EXISTS tm_limited@'%' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 4",
        "GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO tm_limited@'%'",
    )
    tables = [f"{DB}.t", f"{DB}.nokey"]
    source = mariadb.source_config(user="tm_limited", password="pw")
    defaults = {"chunk_size": LOCAL_ROWS // 2, "batch_chunks": 4, "read_margin_seconds": 0.0}

    def config(master: str) -> Path:
        data = pipeline_config(
            tmp_path, mariadb, [{"name": t} for t in tables], DB, source=source, defaults=defaults
        )
        data["spark"]["master"] = master
        return write_config(tmp_path / "p.yaml", data)

    (limit,) = [
        c for c in run_checks(load_config(config("local[2]"))) if c.name == "connection limit"
    ]
    assert not limit.ok
    assert "user `tm_limited` may hold 4 connections at once (MAX_USER_CONNECTIONS)" in limit.detail
    assert "a run holds up to 5: 2 Spark read task(s) (local[2]) and 3 of its own" in limit.detail
    assert "MAX_USER_CONNECTIONS 5" in limit.fix and "spark.master: local[1]" in limit.fix
    refused = tidemark(config("local[2]"))
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "connection limit" in refused.stdout + refused.stderr

    fixed = config("local[1]")
    assert all(c.ok for c in run_checks(load_config(fixed)) if c.name == "connection limit")
    snapshot = tidemark(fixed)
    assert snapshot.returncode == 0, snapshot.stderr[-3000:]
    assert f"table {DB}.t: snapshot, 8 chunks" in snapshot.stdout + snapshot.stderr
    mariadb.execute(f"UPDATE {DB}.t SET v = -v WHERE id % 100 = 0", f"DELETE FROM {DB}.nokey")
    assert tidemark(fixed).returncode == 0
    assert_lake_equals_source(fixed, mariadb, tables)

    held = [mariadb.connect(user="tm_limited", password="pw") for _ in range(4)]
    try:  # every connection the user may hold is taken: a run's first one is refused, saying so
        with (
            pytest.raises(SourceNotReady, match="holds as many connections as it may at once"),
            Source(load_config(fixed).source, "pw") as source,
        ):
            source.query("SELECT 1")
    finally:
        for conn in held:
            conn.close()
