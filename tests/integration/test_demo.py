"""`tidemark demo`, the README's first command, run as a user runs it (a small sample): a private
MariaDB, a snapshot under a live writer, a catch-up, every table verified against its source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_ends_with_the_lake_equal_to_the_source(tmp_path: Path) -> None:
    base = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "demo", "--rows", "3000", "--dir", str(base)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verified = [line for line in done.stdout.splitlines() if line.startswith("verify: ")]
    assert len(verified) == 3 and all(": equal (" in line for line in verified), verified
    assert "demo: OK" in done.stdout
    for table in ("orders", "customers", "order_items"):
        manifest = json.loads(
            (base / "lake" / "shop" / table / "_tidemark" / "current.json").read_text()
        )
        assert manifest["version"] >= 1 and manifest["iceberg"]["snapshot_id"]
    # the demo's MariaDB is gone with the demo (no --keep)
    assert not list(base.glob("tidemark-mariadb-*/mysqld.pid"))
