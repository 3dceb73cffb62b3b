"""`tidemark demo`: the whole product on embedded defaults, on one machine.

Starts a throwaway MariaDB (binlog on) with sample data, checks it with
`doctor`, snapshots three tables while a writer keeps changing them, applies
the binlog once more after the writer stops, and verifies that every published
table equals its source row for row and value for value.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import SHOP_TABLES, Writer, connect, load_shop
from orchestrator.config import load_config

PASSWORD_ENV = "TIDEMARK_DEMO_PASSWORD"


def _stop_previous(base: Path) -> None:
    """Kill a demo server left running (``--keep``) before its files are removed."""
    for pid_file in base.glob("tidemark-mariadb-*/mysqld.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            time.sleep(0.5)


def write_demo_config(base: Path, server: LocalMariaDB) -> Path:
    config = {
        "pipeline": "demo",
        "source": {
            "host": "127.0.0.1",
            "port": server.port,
            "user": "tidemark",
            "password_env": PASSWORD_ENV,
            "server_id": 54001,
        },
        "spark": {
            "master": "local[*]",
            "conf": {
                "spark.driver.memory": "2g",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "8",
            },
        },
        "output": {"path": str(base / "lake")},
        "state": {"url": f"sqlite:///{base / 'state.db'}"},
        "defaults": {"chunk_size": 25000, "batch_chunks": 4},
        "tables": [{"name": f"shop.{t}"} for t in SHOP_TABLES],
    }
    path = base / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def duckdb_query(metadata_location: str) -> str:
    """One shell line reading a published Iceberg table with DuckDB (its iceberg extension).

    >>> print(duckdb_query("file:///d/lake/shop/orders/metadata/00001-a.metadata.json"))
    duckdb -c "INSTALL iceberg; LOAD iceberg; SELECT count(*) AS rows FROM iceberg_scan('file:///d/lake/shop/orders/metadata/00001-a.metadata.json')"
    """
    return (
        f'duckdb -c "INSTALL iceberg; LOAD iceberg; SELECT count(*) AS rows '
        f"FROM iceberg_scan('{metadata_location}')\""
    )


def demo_command(directory: str, *, rows: int = 200_000, keep: bool = False) -> int:
    from orchestrator.app.demo.verify import verify_table
    from orchestrator.app.doctor import doctor_command
    from orchestrator.app.run import run_command
    from orchestrator.lake.manifest import read_manifest
    from orchestrator.pipeline.context import table_dir

    base = Path(directory).resolve()
    if base.exists():
        _stop_previous(base)
        shutil.rmtree(base)
    base.mkdir(parents=True)
    password = secrets.token_urlsafe(16)
    os.environ[PASSWORD_ENV] = password
    server = LocalMariaDB.create(base_dir=base)
    server.start()
    try:
        print(
            f"demo: private MariaDB on 127.0.0.1:{server.port} (binlog ROW/FULL), "
            f"loading {rows:,} orders",
            flush=True,
        )
        server.create_user("tidemark", password)
        root = connect("127.0.0.1", server.port, "root", "")
        load_shop(root, rows)
        config_path = write_demo_config(base, server)
        config = load_config(config_path)
        print(f"demo: config {config_path}", flush=True)
        if doctor_command(config) != 0:
            return 3
        writer = Writer("127.0.0.1", server.port, "root", "").start()
        print(
            "demo: snapshot while a writer inserts, updates, deletes and changes keys", flush=True
        )
        run_command(config, tables=[], snapshot=False, chunk_size=None)
        changes = writer.stop()
        print(
            f"demo: writer stopped after {changes:,} statements; "
            "applying the binlog since the snapshot",
            flush=True,
        )
        run_command(config, tables=[], snapshot=False, chunk_size=None)
        from orchestrator.source.connection import Source

        ok = True
        with Source.from_pipeline(config) as source:
            for table in config.tables:
                info = source.table_info(table.name)
                result = verify_table(root, info, info.primary_key, table_dir(config, table.name))
                print(f"verify: {result.summary()}", flush=True)
                ok = ok and result.equal
        root.close()
        print(
            f"demo: {'OK — the lake equals the source' if ok else 'FAILED'}; "
            f"output in {base / 'lake'}"
        )
        orders = read_manifest(table_dir(config, "shop.orders")).get("iceberg")
        if orders is not None:
            print(
                "demo: query the Iceberg table with DuckDB: "
                f"{duckdb_query(orders['metadata_location'])}"
            )
        return 0 if ok else 1
    finally:
        if keep:
            env_file = base / "demo.env"
            env_file.write_text(f"export {PASSWORD_ENV}={password}\n")
            env_file.chmod(0o600)
            print(
                f"demo: MariaDB left running on port {server.port}; `. {env_file}` then run "
                f"tidemark against {base / 'demo.yaml'}; stop it with "
                f"`kill $(cat {server.pid_file})` (running the demo "
                "in the same directory again also stops it)",
                file=sys.stderr,
            )
        else:
            server.destroy()
