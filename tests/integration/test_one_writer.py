"""One writer per run (issue 12): two real `tidemark run` processes on one pipeline.

Run A snapshots the shop tables under concurrent writes with a short lease and is paused
with SIGSTOP at a failpoint (mid-capture, with change segments written but not
checkpointed; or right after its Iceberg commit, before the manifest switch). Past A's
lease, run B takes the lock over and resumes the same run; B is paused in turn, and A is
resumed: A must exit 1 with one line naming the lock loss and B, and write nothing, to
the state store or to the lake and staging. Then B finishes, one more run catches up, and
every table equals its source.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import SHOP_TABLES, Writer, connect, load_shop
from orchestrator.config import load_config
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, pipeline_config, start_run, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 6  # seconds (state.lock_lease_seconds): renewed every 1.2 s while a run lives


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 900) -> None:
    """Until ``proc`` stopped itself at its failpoint (a loaded machine takes minutes to get
    there)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            pytest.fail(
                f"run did not reach its failpoint (exit {proc.returncode}): "
                f"{out[-2000:]} {err[-2000:]}"
            )
        time.sleep(0.2)


def wait_lease_expired(state_url: str, pipeline: str) -> None:
    store = StateStore(state_url)
    try:
        while True:
            held = store.lock_info(pipeline)
            assert held is not None, "the paused run's lock is gone"
            if datetime.now(UTC) - held.refreshed_at > timedelta(seconds=LEASE + 1):
                return
            time.sleep(0.2)
    finally:
        store.close()


def lock_holders(state_db: Path) -> str:
    """Who holds locks on the state store's files (``/proc/locks``): each process's pid, state
    and command line, for a failure's message ("database is locked": which process kept it)."""
    inodes = {}
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{state_db}{suffix}")
        if path.exists():
            inodes[path.stat().st_ino] = path.name
    lines = []
    for entry in Path("/proc/locks").read_text().splitlines():
        fields = entry.split()
        if len(fields) < 6 or not fields[5].rsplit(":", 1)[-1].isdigit():
            continue
        name = inodes.get(int(fields[5].rsplit(":", 1)[-1]))
        if name is None:
            continue
        pid = fields[4]
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            stat, cmd = "?", "?"
        lines.append(f"{name}: {' '.join(fields[1:4])} {fields[6:]} pid {pid} ({stat}) {cmd}")
    return "locks on the state store: " + ("; ".join(lines) or "none")


def everything_written(state_db: Path, lake: Path) -> dict[str, Any]:
    """Every row of every table of the state store (the Iceberg catalog's too) and every file
    under the lake (staging included) with its size and modification time."""
    conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        rows = {n: sorted(map(repr, conn.execute(f'SELECT * FROM "{n}"'))) for n in names}
    finally:
        conn.close()
    files = {
        str(p.relative_to(lake)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in lake.rglob("*")
        if p.is_file()
    }
    return {"state": rows, "files": files}


@pytest.fixture(scope="module")
def shop(mariadb: LocalMariaDB) -> str:
    db = "fence_shop"
    conn = connect("127.0.0.1", mariadb.port, "root", "")
    load_shop(conn, 3_000, db=db)
    conn.close()
    return db


@pytest.mark.parametrize(
    ("paused_at", "taker_paused_at"),
    [
        (
            "capture.flushed:2:stop",
            "reconcile.table_done:1:stop",
        ),  # A's last segments not checkpointed
        (
            "publish.iceberg_committed:1:stop",
            "publish.table_done:1:stop",
        ),  # A committed, not switched
    ],
)
def test_a_run_paused_past_its_lease_is_fenced_out(
    mariadb: LocalMariaDB, shop: str, tmp_path: Path, paused_at: str, taker_paused_at: str
) -> None:
    tables = [f"{shop}.{t}" for t in SHOP_TABLES]
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name="fenced",
            state={"url": f"sqlite:///{tmp_path / 'state.db'}", "lock_lease_seconds": LEASE},
            defaults={
                "chunk_size": 1000,
                "batch_chunks": 2,
                "read_margin_seconds": 0.0,
                "capture_batch_rows": 20,
            },
        ),
    )
    state_url = load_config(config_path).state.url
    writer = Writer("127.0.0.1", mariadb.port, "root", "", db=shop, pause=0.005).start()
    a = start_run(config_path, failpoint=paused_at)
    b: subprocess.Popen[str] | None = None
    try:
        wait_stopped(a)
        wait_lease_expired(state_url, "fenced")  # A lives, paused: only its lease can run out
        b = start_run(config_path, failpoint=taker_paused_at)
        wait_stopped(b)
        before = everything_written(tmp_path / "state.db", tmp_path / "lake")

        os.kill(a.pid, signal.SIGCONT)
        _, a_err = a.communicate(timeout=300)
        assert a.returncode == 1, a_err[-3000:]
        errors = [line for line in a_err.splitlines() if line.startswith("tidemark: error:")]
        assert len(errors) == 1, a_err[-3000:]
        assert errors[0].startswith(
            "tidemark: error: lost the lock of pipeline fenced: this process held it "
            f"as run cli:{socket.gethostname()}:{a.pid}"
        ), errors[0]
        assert (
            f"run cli:{socket.gethostname()}:{b.pid} (host " in errors[0]
            and "continues the run" in errors[0]
        )
        assert (
            everything_written(tmp_path / "state.db", tmp_path / "lake") == before
        )  # A wrote nothing

        os.kill(b.pid, signal.SIGCONT)
        b_out, b_err = b.communicate(timeout=900)
        assert b.returncode == 0, b_err[-3000:] + lock_holders(tmp_path / "state.db")
        assert "resuming unfinished run" in b_out
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.communicate()
        changes = writer.stop()
    assert changes > 0
    last = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(config_path),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert last.returncode == 0, last.stderr[-3000:] + lock_holders(tmp_path / "state.db")
    assert_lake_equals_source(config_path, mariadb, tables)


def test_a_manifest_behind_its_checkpoint_is_read_again(
    mariadb: LocalMariaDB, shop: str, tmp_path: Path
) -> None:
    """What a process that lost the lock could still do in the instant after its last fence
    check: put back the version it was switching to over a newer one. The next run sees
    ``current.json`` behind the state store's checkpoint and reads the table again, instead of
    applying the changes since the checkpoint to an older version."""
    table = f"{shop}.customers"
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": table}],
            name="behind",
            defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )

    def run() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--config",
                str(config_path),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run()
    mariadb.execute(f"UPDATE {table} SET name = CONCAT('v2 ', name) WHERE email LIKE 'user1%'")
    run()
    meta = tmp_path / "lake" / shop / "customers" / "_tidemark"
    assert (meta / "versions" / "000002.json").exists()
    (meta / "current.json").write_bytes((meta / "versions" / "000001.json").read_bytes())
    mariadb.execute(f"UPDATE {table} SET name = CONCAT('v3 ', name) WHERE email LIKE 'user2%'")
    again = run()
    assert_lake_equals_source(config_path, mariadb, [table])
    assert (
        "current.json names version 1, older than version 2 the state store published: re-read"
        in again.stdout
    )
