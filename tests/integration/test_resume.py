"""Kill a real `tidemark run` process at each phase; the next run resumes and the result is right.

The crash is a SIGKILL at an exact step boundary (`orchestrator.services.faults`), the
closest thing to a power cut. After each crash the source is changed a bit,
then a plain `tidemark run` must resume the same run (done chunks not re-read)
and publish tables equal to the source.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import SHOP_TABLES, connect, load_shop
from orchestrator.config import load_config
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.test_consistency import snapshots_per_version

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def tidemark(
    config: Path, *args: str, failpoint: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_FAILPOINT"}
    if failpoint:
        env["TIDEMARK_FAILPOINT"] = failpoint
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(config),
            "--no-progress",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def _change_source(server: LocalMariaDB, db: str, salt: int) -> None:
    server.execute(
        f"UPDATE {db}.orders SET note = 'after crash {salt}' WHERE id % 97 = {salt % 97}",
        f"DELETE FROM {db}.orders WHERE id % 101 = {salt % 101}",
        f"REPLACE INTO {db}.orders (id, customer_id, status, amount, created_at) "
        f"VALUES ({10_000_000 + salt}, 1, 'new', 1, NOW(6))",
        f"UPDATE {db}.customers SET email = CONCAT('x{salt}.', email) "
        f"WHERE email LIKE 'user{salt}@%'",
    )


@pytest.fixture(scope="module")
def shop(mariadb: LocalMariaDB) -> str:
    db = "resume_shop"
    conn = connect("127.0.0.1", mariadb.port, "root", "")
    load_shop(conn, 6_000, db=db)
    conn.close()
    return db


@pytest.mark.parametrize(
    "failpoint",
    [
        "read.batch_done:2",
        "capture.checkpoint:1",
        "reconcile.table_done:1",
        "publish.file_moved:2",
        "publish.iceberg_committed:1",
        "publish.files_written:1",
        "publish.table_done:1",
    ],
)
def test_killed_run_resumes(
    mariadb: LocalMariaDB, shop: str, tmp_path: Path, failpoint: str
) -> None:
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": f"{shop}.{t}"} for t in SHOP_TABLES],
            name="resume",
            defaults={
                "chunk_size": 1500,
                "batch_chunks": 2,
                "read_margin_seconds": 0.0,
                "capture_batch_rows": 50,
            },
        ),
    )
    # A published first version, so the run under test mixes in binlog work of every kind. Its
    # tables fit one chunk each, which the driver reads: no JVM for what is not under test.
    first = tidemark(config_path, "--chunk-size", str(LOCAL_ROWS))
    assert first.returncode == 0, first.stderr
    _change_source(mariadb, shop, 1)
    killed = tidemark(config_path, "--snapshot", "--table", f"{shop}.orders", failpoint=failpoint)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    store = StateStore(load_config(config_path).state.url)
    run = store.unfinished_run("resume")
    assert run is not None, "the killed run must be left unfinished"
    read_before = {(c.table, c.index) for c in store.chunks(run.run_id, status="done")}
    _change_source(mariadb, shop, 2)
    resumed = tidemark(config_path, "--snapshot", "--table", f"{shop}.orders")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming unfinished run {run.run_id}" in resumed.stdout
    # its summary names the table, published by this process or read back (published before)
    assert any(line.startswith(f"{shop}.orders ") for line in resumed.stdout.splitlines())
    chunks = store.chunks(run.run_id)
    assert all(c.attempts == 1 for c in chunks if (c.table, c.index) in read_before), (
        "chunks done before the crash must not be read again"
    )
    assert store.get_run(run.run_id).status == "succeeded"
    store.close()
    # The resumed run published the orders snapshot at its H; one more run catches up to now.
    assert tidemark(config_path).returncode == 0
    assert_lake_equals_source(config_path, mariadb, [f"{shop}.{t}" for t in SHOP_TABLES])
    # Exactly one Iceberg snapshot per version, none twice for a run (publish.iceberg_committed).
    snapshots_per_version(config_path, [f"{shop}.{t}" for t in SHOP_TABLES])


def test_source_restart_during_read(tmp_path: Path) -> None:
    """The source goes down and comes back in the middle of the reads; the run completes."""
    server = LocalMariaDB.create(base_dir=tmp_path)
    server.start()
    try:
        db = "restart_shop"
        conn = connect("127.0.0.1", server.port, "root", "")
        load_shop(conn, 20_000, db=db)
        conn.close()
        config_path = write_config(
            tmp_path / "p.yaml",
            pipeline_config(
                tmp_path,
                server,
                [{"name": f"{db}.{t}"} for t in SHOP_TABLES],
                name="restart",
                defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
            ),
        )
        state_url = load_config(config_path).state.url
        restarted = threading.Event()

        def restart_after_first_batch() -> None:
            deadline = time.monotonic() + 900  # a loaded machine takes minutes to the first batch
            while time.monotonic() < deadline:
                try:
                    store = StateStore(state_url)
                    run = store.unfinished_run("restart")
                    done = len(store.chunks(run.run_id, status="done")) if run else 0
                    store.close()
                except Exception:
                    done = 0
                if done >= 2:
                    server.kill()
                    time.sleep(1.0)
                    server.start()
                    restarted.set()
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=restart_after_first_batch, daemon=True)
        thread.start()
        result = tidemark(config_path)
        thread.join(60)
        assert restarted.is_set(), "the server was never restarted; the test did not test anything"
        assert result.returncode == 0, result.stderr[-3000:]
        assert_lake_equals_source(config_path, server, [f"{db}.{t}" for t in SHOP_TABLES])
    finally:
        server.destroy()
