"""What the shop benchmarks share: the sample shop loaded into a private MariaDB, and a
pipeline config that snapshots its ``shop.orders`` into a lake under the work dir."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import connect, load_shop


@contextmanager
def scratch_server(
    prefix: str, settings: Mapping[str, str | None] | None = None
) -> Iterator[tuple[Path, LocalMariaDB]]:
    """A fresh work dir and a private MariaDB started in it (``settings``: as
    `LocalMariaDB.create`); both are gone when the block ends, however it ends."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        server = LocalMariaDB.create(settings, base_dir=work)
        server.start()
        try:
            yield work, server
        finally:
            server.destroy()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_sample_shop(server: LocalMariaDB, rows: int) -> Any:
    """Load ``rows`` orders (`orchestrator.app.demo.sample.load_shop`), print how long it took;
    returns the connection."""
    conn = connect("127.0.0.1", server.port, "root", "", None)
    start = time.perf_counter()
    load_shop(conn, rows)
    print(f"loaded {rows:,} rows into shop.orders in {time.perf_counter() - start:.1f}s")
    return conn


def write_pipeline(
    work: Path, server: LocalMariaDB, *, name: str, master: str, defaults: dict[str, Any]
) -> Path:
    """``work/bench.yaml``: shop.orders of ``server`` into ``work/lake``, state in
    ``work/state.db``."""
    config = {
        "pipeline": name,
        "source": server.source_config(),
        "spark": {
            "master": master,
            "conf": {
                "spark.driver.memory": "4g",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4",
            },
        },
        "output": {"path": str(work / "lake")},
        "state": {"url": f"sqlite:///{work / 'state.db'}"},
        "defaults": defaults,
        "tables": [{"name": "shop.orders"}],
    }
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
