"""A table without a key next to the same table with one: snapshot and 10,000 changes.

Loads the sample shop (`orchestrator.app.demo.sample.load_shop`, ``--rows`` orders, default
1,000,000) into a private MariaDB and copies ``shop.orders`` into ``shop.orders_nokey``: the
same rows, no primary key (a plain index on ``id`` so that the benchmark's own statements find
their rows; it is no key to Tidemark). Two pipelines, one per table, each snapshot with
`tidemark run` in a process of its own (the keyed table read by Spark, the keyless one by the
driver in one consistent snapshot), then the same ``--changes`` row changes on both tables and
another `tidemark run` each. Prints the times, the files each incremental run rewrote, and the
keyless/keyed ratios.

Change patterns (``--pattern``): ``uniform`` updates, deletes and inserts over the whole table
(the same ids on both tables); ``recent`` the same among the newest 1% of ids. A table without a
key keeps its files by row hash, so either pattern touches rows all over its files.

    .venv/bin/python bench/bench_keyless.py
    .venv/bin/python bench/bench_keyless.py --rows 4000000 --pattern uniform --verify
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server, write_pipeline  # noqa: E402

TABLES = {"keyed": "orders", "keyless": "orders_nokey"}


def tidemark_run(config: Path) -> float:
    """Seconds of one `tidemark run` of ``config`` in its own process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"tidemark run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def copy_without_key(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE shop.orders_nokey LIKE shop.orders")
        cur.execute("ALTER TABLE shop.orders_nokey DROP PRIMARY KEY, ADD INDEX (id)")
        cur.execute("INSERT INTO shop.orders_nokey SELECT * FROM shop.orders")


def apply_changes(conn: Any, rows: int, pattern: str, total: int) -> dict[str, int]:
    """``total`` row changes, the same on both tables (ids are 10, 20, ... 10 * rows): 40%
    inserts, 40% updates, 20% deletes, over every id (``uniform``) or the newest 1%."""
    rng = random.Random(1)
    inserts, updates = total * 40 // 100, total * 40 // 100
    deletes = total - inserts - updates
    low = 1 if pattern == "uniform" else max(1, rows - max(rows // 100, 2 * (updates + deletes)))
    chosen = [10 * k for k in rng.sample(range(low, rows + 1), updates + deletes)]
    done = {"insert": 0, "update": 0, "delete": 0}
    with conn.cursor() as cur:
        for table in TABLES.values():
            for kind, ids, sql in (
                ("update", chosen[:updates], "UPDATE {t} SET amount = amount + 1 WHERE id IN ({})"),
                ("delete", chosen[updates:], "DELETE FROM {t} WHERE id IN ({})"),
            ):
                for i in range(0, len(ids), 1000):
                    batch = ids[i : i + 1000]
                    marks = ", ".join(["%s"] * len(batch))
                    done[kind] += cur.execute(sql.format(marks, t=f"shop.{table}"), batch)
            done["insert"] += cur.execute(
                f"INSERT INTO shop.{table} (id, customer_id, status, amount, created_at, note)"
                f" SELECT {10 * rows} + seq * 10, seq % 1000 + 1, 'new', seq / 100,"
                f" '2024-01-01 00:00:00', 'new order' FROM seq_1_to_{inserts}"
            )
    return {kind: count // 2 for kind, count in done.items()}


def versions(lake: Path, table: str) -> tuple[dict[str, Any], dict[str, Any]]:
    folder = lake / "shop" / table / "_tidemark" / "versions"
    first, second = (json.loads((folder / f"{v:06d}.json").read_text()) for v in (1, 2))
    return first, second


def rewritten(first: dict[str, Any], second: dict[str, Any]) -> str:
    new = [r for r in second["file_ranges"] if r["file"] not in first["files"]]
    replaced = [f for f in first["files"] if f not in second["files"]]
    return (
        f"rewrote {len(replaced)} of {len(first['files'])} files "
        f"({sum(r['rows'] for r in new):,} rows written), shared "
        f"{len(second['files']) - len(new)}"
    )


def verify(config: Path, conn: Any, table: str) -> bool:
    from orchestrator.app.demo.verify import verify_table
    from orchestrator.config import load_config
    from orchestrator.pipeline.context import table_dir
    from orchestrator.source.connection import Source

    pipeline = load_config(config)
    name = f"shop.{table}"
    with Source.from_pipeline(pipeline) as source:
        info = source.table_info(name)
    result = verify_table(conn, info, info.primary_key, table_dir(pipeline, name))
    print(result.summary())
    return result.equal


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="orders (default 1,000,000)")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--pattern", choices=("uniform", "recent"), default="uniform")
    parser.add_argument("--chunk-size", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--verify", action="store_true", help="compare both lakes with the source")
    args = parser.parse_args()

    with scratch_server("tidemark-bench-keyless-") as (work, server):
        conn = load_sample_shop(server, args.rows)
        start = time.perf_counter()
        copy_without_key(conn)
        print(f"copied into shop.orders_nokey in {time.perf_counter() - start:.1f}s")
        configs = {}
        for kind, table in TABLES.items():
            folder = work / kind
            folder.mkdir()
            path = write_pipeline(
                folder,
                server,
                name=f"bench_{kind}",
                master=args.master,
                defaults={"chunk_size": args.chunk_size},
            )
            path.write_text(path.read_text().replace("shop.orders", f"shop.{table}"))
            configs[kind] = path
        snapshot = {kind: tidemark_run(path) for kind, path in configs.items()}
        conn.select_db("shop")
        done = apply_changes(conn, args.rows, args.pattern, args.changes)
        incremental = {kind: tidemark_run(path) for kind, path in configs.items()}
        print(
            f"changes on each table: {sum(done.values()):,} rows "
            f"({', '.join(f'{k} {v:,}' for k, v in done.items())}), pattern {args.pattern}"
        )
        for kind, table in TABLES.items():
            first, second = versions(configs[kind].parent / "lake", table)
            print(
                f"{kind:8} snapshot {snapshot[kind]:7.2f}s  incremental {incremental[kind]:6.2f}s"
                f"  {first['rows']:,} rows in {len(first['files'])} files; "
                f"{rewritten(first, second)}"
            )
        print(
            f"keyless / keyed: snapshot {snapshot['keyless'] / snapshot['keyed']:.2f}x, "
            f"incremental {incremental['keyless'] / incremental['keyed']:.2f}x"
        )
        print(
            f"(each run its own process; load {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores, "
            f"master {args.master}, chunk {args.chunk_size:,})"
        )
        ok = True
        if args.verify:
            ok = all(verify(configs[kind], conn, table) for kind, table in TABLES.items())
        conn.close()
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
