"""What the driver's copy-on-write rewrite costs per row, and what the data files' Parquet options
change in it: no server, no run, only the rewrite of a table whose every file holds a change.

``--rows`` orders with the sample shop's columns and values (`orchestrator.app.demo.sample`,
computed here in Arrow instead of loaded into MariaDB) are written as data files of 200,000 rows,
the size of a snapshot's chunk files, in the published types with field IDs. ``--changes``
updates spread over every key (``amount`` changed) become the reconcile's last events. Then, in
one warm process, for each variant of the files' options in turn (the order alternates between
repetitions), on ``os.cpu_count()`` threads as the rewrite runs them
(`orchestrator.lake.writer.write_parts`):

- ``read``: every base file read as record batches in the published types;
- ``merge``: the same, merged with its events (`orchestrator.pipeline.reconcile.local.merged`);
- ``rewrite``: the same, written as new data files (`orchestrator.lake.writer.write_files`).

Variants: ``release``, `orchestrator.lake.writer.parquet_options`; ``plain-integers``, the same
with every column PLAIN (no `orchestrator.lake.writer.INTEGER_ENCODING`: the files before it);
``fixed-decimals``, the release with every DECIMAL stored as fixed-length bytes (the options
before ``store_decimal_as_integer``).
Each variant's base files are written with its own options. Medians of wall and CPU seconds
(the process's, all threads), and each variant's time over the release's.

``--values random`` draws the columns' values at random instead of the sample's regular
sequences (`orders`).

    .venv/bin/python bench/bench_rewrite.py --rows 4000000 --changes 10000 --repeat 6
    .venv/bin/python bench/bench_rewrite.py --rows 4000000 --changes 10000 --values random
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.services import lean  # noqa: E402

lean.system_allocator()
lean.arrow_without_pandas()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from orchestrator.lake import writer  # noqa: E402
from orchestrator.pipeline.changes import KIND, POSITION, PUT, event_key  # noqa: E402
from orchestrator.pipeline.reconcile import local  # noqa: E402

FILE_ROWS = 200_000
KEY = ["id"]
#: Each variant's `orchestrator.lake.writer.PARQUET_OPTIONS` and `~.INTEGER_ENCODING`.
VARIANTS: dict[str, tuple[dict[str, Any], str | None]] = {
    "release": (dict(writer.PARQUET_OPTIONS), writer.INTEGER_ENCODING),
    "plain-integers": (dict(writer.PARQUET_OPTIONS), None),
    "fixed-decimals": (
        {**writer.PARQUET_OPTIONS, "store_decimal_as_integer": False},
        writer.INTEGER_ENCODING,
    ),
}


def orders(rows: int, values: str = "sample") -> pa.Table:
    """``shop.orders`` in published types with field IDs: ``sample``, its values as
    `orchestrator.app.demo.sample.load_shop` fills it (each column a regular sequence);
    ``random``, the same columns with values drawn at random (seeded): keys with gaps of 1 to
    4, customers and amounts uniform, creation times sorted with random gaps, update times
    unordered, tags and notes of random words."""
    seq = np.arange(1, rows + 1, dtype=np.int64)
    if values == "random":
        rng = np.random.default_rng(7)
        ids = np.cumsum(rng.integers(1, 5, rows)) * 10
        customer = rng.integers(1, max(rows // 4, 2), rows).astype(np.int32)
        status = np.array(["new", "paid", "shipped", "cancelled"], dtype=object)[
            rng.integers(0, 4, rows)
        ]
        tags = np.array(["gift", "fragile,express", ""], dtype=object)[rng.integers(0, 3, rows)]
        words = np.array(["red", "blue", "late", "gift", "é", "'quoted'"], dtype=object)
        first, second = rng.integers(0, len(words), (2, rows)).tolist()
        notes = [
            f"{words[a]} {words[b]} {n}"
            for a, b, n in zip(first, second, seq.tolist(), strict=True)
        ]
        cents = rng.integers(0, 10_000_000, rows)
        weight = rng.integers(0, 8000, rows) / 8
        created = np.datetime64("2024-01-01", "us") + np.cumsum(rng.integers(0, 8_000_000, rows))
        updated = np.datetime64("2025-01-01", "us") + rng.integers(0, 31_536_000_000_000, rows)
        paid = rng.integers(0, 2, rows) == 1
    else:
        ids = seq * 10
        customer = (seq % max(rows // 4, 1) + 1).astype(np.int32)
        status = np.array(["new", "paid", "shipped", "cancelled"], dtype=object)[seq % 4]
        tags = np.array(["gift", "fragile,express", ""], dtype=object)[seq % 3]
        notes = [f"note {s}" + (" 'quoted' é" if s % 11 == 0 else "") for s in seq.tolist()]
        cents = seq % 100000  # (seq % 100000) / 100: read with two decimals
        weight = (seq % 1000) / 8
        created = np.datetime64("2024-01-01", "us") + seq * 1_000_000 + seq % 1_000_000
        updated = np.datetime64("2025-01-01", "us") + seq * 1_000_000
        paid = seq % 2 == 1
    columns = {
        "id": pa.array(ids).cast(pa.decimal128(20, 0)),
        "customer_id": pa.array(customer),
        "status": pa.array(status, pa.string()),
        "amount": pa.array(cents).cast(pa.decimal128(19, 0)).view(pa.decimal128(12, 2)),
        "weight": pa.array(weight, pa.float32(), mask=seq % 7 == 0),
        "created_at": pa.array(created, pa.timestamp("us")),
        "updated_at": pa.array(updated, pa.timestamp("us")).cast(pa.timestamp("us", "UTC")),
        "paid": pa.array(paid),
        "tags": pa.array(tags, pa.string(), mask=seq % 5 == 0),
        "note": pa.array(notes, pa.string(), mask=seq % 3 == 0),
    }
    required = {"id", "customer_id", "status", "amount", "paid"}
    schema = writer.with_field_ids(
        pa.schema(pa.field(n, a.type, n not in required) for n, a in columns.items()),
        {name: i for i, name in enumerate(columns, 1)},
    )
    return pa.table(list(columns.values()), schema=schema)


def spread_events(table: pa.Table, changes: int) -> pa.Table:
    """Last events updating ``changes`` rows spread over every key: ``amount`` plus 1."""
    step = max(table.num_rows // max(changes, 1), 1)
    rows = table.take(pa.array(np.arange(step // 2, table.num_rows, step)[:changes]))
    amount = rows.schema.get_field_index("amount")
    rows = rows.set_column(
        amount,
        rows.schema.field(amount),
        pc.add(rows.column(amount), pa.scalar(1, pa.decimal128(12, 2))).cast(pa.decimal128(12, 2)),
    )
    n = rows.num_rows
    zeros = pa.array(np.zeros(n, np.int64))
    head = [rows.column("id"), zeros, pa.array(np.arange(n, dtype=np.int64)), zeros]
    kinds = pa.array(np.full(n, PUT, np.int8))
    return pa.Table.from_arrays(
        [*head, kinds, *rows.columns], names=[event_key(0), *POSITION, KIND, *rows.schema.names]
    )


@contextlib.contextmanager
def written_with(variant: tuple[dict[str, Any], str | None]) -> Iterator[None]:
    """`orchestrator.lake.writer` writes its files with ``variant``'s options meanwhile."""
    options, encoding = variant
    saved = dict(writer.PARQUET_OPTIONS), writer.INTEGER_ENCODING
    writer.PARQUET_OPTIONS.clear()
    writer.PARQUET_OPTIONS.update(options)
    writer.INTEGER_ENCODING = encoding
    try:
        yield
    finally:
        writer.PARQUET_OPTIONS.clear()
        writer.PARQUET_OPTIONS.update(saved[0])
        writer.INTEGER_ENCODING = saved[1]


def write_base(
    table: pa.Table, directory: Path, variant: tuple[dict[str, Any], str | None]
) -> list[str]:
    """The table as data files of `FILE_ROWS` rows, written as ``variant`` writes them."""
    directory.mkdir(parents=True)
    with written_with(variant):
        ranges = writer.write_files(
            str(directory),
            lambda n: f"base-{n:04d}.parquet",
            table.schema,
            KEY,
            table.to_batches(65536),
            FILE_ROWS,
            0,
        )
    return [str(directory / r["file"]) for r in ranges]


def slices(table: pa.Table, events: pa.Table, files: list[str]) -> list[pa.Table]:
    """Each base file's events (``table`` in files of `FILE_ROWS` rows, in key order)."""
    keys = events.column(event_key(0)).cast(pa.int64()).to_numpy()
    ids = table.column("id").cast(pa.int64()).to_numpy()
    bounds = [int(ids[i * FILE_ROWS - 1]) for i in range(1, len(files))]  # each file's last
    edges = [0, *np.searchsorted(keys, bounds, side="right").tolist(), events.num_rows]
    return [events.slice(a, b - a) for a, b in itertools.pairwise(edges)]


def timed(job: Callable[[int], Any], count: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``job(i)`` for every file, on as many threads as cores."""
    wall, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(job, range(count)))
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=2_500)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--values", choices=("sample", "random"), default="sample")
    args = parser.parse_args()
    table = orders(args.rows, args.values)
    schema = table.schema
    events = spread_events(table, args.changes)
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        f"{args.rows:,} rows ({args.values} values), {events.num_rows:,} spread changes",
        flush=True,
    )
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-rewrite-") as work:
        bases = {name: write_base(table, Path(work) / name, o) for name, o in VARIANTS.items()}
        per_file = slices(table, events, bases["release"])
        names = list(VARIANTS)
        for repetition in range(args.repeat):
            for name in names[repetition % len(names) :] + names[: repetition % len(names)]:
                files, variant = bases[name], VARIANTS[name]
                out = Path(work) / f"out-{name}-{repetition}"

                def read(i: int, files: list[str] = files) -> int:
                    return sum(b.num_rows for b in writer.read_published(files[i], schema))

                def merge(i: int, files: list[str] = files) -> int:
                    merged = local.merged(files[i], per_file[i], schema, KEY)
                    return sum(b.num_rows for b in merged)

                def rewrite(i: int, files: list[str] = files, out: Path = out) -> Any:
                    merged = local.merged(files[i], per_file[i], schema, KEY)
                    return writer.write_files(
                        str(out), lambda n: f"g{i:06d}-{n:04d}.parquet", schema, KEY, merged, 0, 0
                    )

                results.setdefault((name, "read"), []).append(timed(read, len(files)))
                results.setdefault((name, "merge"), []).append(timed(merge, len(files)))
                with written_with(variant):
                    results.setdefault((name, "rewrite"), []).append(timed(rewrite, len(files)))
        sizes = {n: sum(os.path.getsize(f) for f in fs) for n, fs in bases.items()}
    print(f"\nmedians of {args.repeat}; wall s (CPU s), and the variant's time over the release's")
    for name in names:
        print(f"  {name}: base files {sizes[name] / 2**20:.1f} MiB")
    for name in names:
        for step in ("read", "merge", "rewrite"):
            wall = statistics.median(w for w, _ in results[(name, step)])
            cpu = statistics.median(c for _, c in results[(name, step)])
            base = statistics.median(w for w, _ in results[("release", step)])
            print(
                f"  {name:15s} {step:8s} {wall:6.3f} s ({cpu:5.2f} CPU s)  "
                f"ratio {wall / base:5.2f}x"
            )
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
