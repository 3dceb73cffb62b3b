"""Read batches: the chunks one read call (one Airflow mapped task) reads between its ``L`` and
``Hb``.

A table of several chunks gets batches of its own, ``batch_chunks`` chunks each, in key order.
A small table (one chunk) shares a batch with other small tables: up to `PACK_TABLES` tables
whose estimated rows add up to at most a full batch of the defaults (``batch_chunks`` x
``chunk_size``). So 2,000 tables of 100 rows are 8 batches, not 2,000: 8 mapped tasks under
Airflow, and 8 rounds of recording ``L`` and ``Hb``. Packing changes nothing in what is read:
each chunk keeps its predicate and its own table's files, and every chunk of a batch is read
after the batch's ``L`` and before its ``Hb``, exactly as in a batch of one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.config import Defaults
from orchestrator.state.store import ChunkRecord, PlannedTable, StateStore

#: Small tables one batch holds at most (their jobs run `TABLE_JOBS` at a time).
PACK_TABLES = 256
#: Spark jobs (one per table) a batch of many small tables runs at once from the driver
#: (`orchestrator.pipeline.read.step`): a tiny table's job is mostly fixed cost (scheduling, a JDBC
#: connection, committing its files), which overlaps well. 200 tables of 100 rows on 2 cores:
#: 137 s reading 2 at a time, 69 s 8 at a time.
TABLE_JOBS = 8


@dataclass(frozen=True, slots=True)
class BatchRef:
    """One unit of parallel reading: chunks of one table, or of many small tables."""

    batch: int
    table: str  # its table (the first one of a batch of small tables)
    chunks: int
    label: str  # e.g. "shop.orders chunks 0-15 [1 .. 400001)": the Airflow map index label
    tables: int = 1

    def __str__(self) -> str:
        return f"batch {self.batch}: {self.label}"


@dataclass(frozen=True, slots=True)
class Draft:
    """A table planned as a snapshot, its chunks not in a batch yet."""

    plan: PlannedTable
    rows: int  # estimated rows (the planner's count)
    batch_chunks: int  # the table's ``batch_chunks``


def assign_batches(drafts: list[Draft], next_batch: int, defaults: Defaults) -> list[PlannedTable]:
    """The drafts with every chunk in a batch, numbered from ``next_batch`` (see the module).

    >>> d = Defaults(chunk_size=100, batch_chunks=2)
    >>> def draft(name, chunks, rows):
    ...     c = ChunkRecord("r", name, 0, -1, None, None, "", "pending",
    ...                     None, None, None, None, None, 0)
    ...     plan = PlannedTable(name, "snapshot", "even", ["id"], {},
    ...                         [replace(c, index=i) for i in range(chunks)])
    ...     return Draft(plan, rows, 2)
    >>> out = assign_batches([draft("d.big", 3, 250), draft("d.a", 1, 90), draft("d.b", 1, 90),
    ...                       draft("d.c", 1, 90)], 5, d)
    >>> [(p.table, [c.batch for c in p.chunks]) for p in out]
    [('d.big', [5, 5, 6]), ('d.a', [7]), ('d.b', [7]), ('d.c', [8])]
    """
    out: list[PlannedTable] = []
    budget = defaults.batch_chunks * defaults.chunk_size
    packed: list[Draft] = []
    packed_rows = 0

    def close_pack() -> None:
        nonlocal next_batch, packed, packed_rows
        if packed:
            out.extend(_in_batch(d.plan, lambda _: next_batch) for d in packed)
            next_batch += 1
        packed, packed_rows = [], 0

    for draft in drafts:
        if len(draft.plan.chunks) > 1:
            out.append(_in_batch(draft.plan, _strided(next_batch, draft.batch_chunks)))
            next_batch += (len(draft.plan.chunks) + draft.batch_chunks - 1) // draft.batch_chunks
            continue
        if packed and (len(packed) >= PACK_TABLES or packed_rows + draft.rows > budget):
            close_pack()
        packed.append(draft)
        packed_rows += draft.rows
    close_pack()
    order = {d.plan.table: i for i, d in enumerate(drafts)}
    return sorted(out, key=lambda p: order[p.table])


def _strided(first: int, size: int) -> Callable[[int], int]:
    """Chunk ``i`` of a table with batches of its own goes to batch ``first + i // size``."""
    return lambda i: first + i // size


def _in_batch(plan: PlannedTable, batch_of: Callable[[int], int]) -> PlannedTable:
    """``plan`` with chunk ``i`` (in the order planned) in batch ``batch_of(i)``."""
    chunks = [replace(c, batch=batch_of(i)) for i, c in enumerate(plan.chunks)]
    return replace(plan, chunks=chunks)


def pending_batches(store: StateStore, run_id: str) -> list[BatchRef]:
    """The run's batches that still have chunks to read, in batch order."""
    by_batch: dict[int, list[ChunkRecord]] = {}
    last_index: dict[str, int] = {}
    failed = {r.table for r in store.run_tables_where(run_id, status="failed")}
    for chunk in store.chunks(run_id):
        last_index[chunk.table] = max(chunk.index, last_index.get(chunk.table, -1))
        if chunk.status == "pending" and chunk.table not in failed:
            by_batch.setdefault(chunk.batch, []).append(chunk)
    refs = []
    for b, cs in sorted(by_batch.items()):
        tables = sorted({c.table for c in cs})
        if len(tables) == 1:
            label = batch_label(cs[0].table, cs, ends_table=cs[-1].index == last_index[cs[0].table])
        else:
            label = f"{len(tables)} tables {tables[0]} .. {tables[-1]}"
        refs.append(
            BatchRef(batch=b, table=tables[0], chunks=len(cs), label=label, tables=len(tables))
        )
    return refs


def batch_label(table: str, chunks: list[ChunkRecord], *, ends_table: bool) -> str:
    """A batch's key range as ``[start .. end)``; ``]`` when it holds the table's last chunk,
    which includes its end key (the table's max key).

    >>> c = ChunkRecord("r", "db.t", 0, 0, None, [5], "", "pending",
    ...                 None, None, None, None, None, 0)
    >>> batch_label("db.t", [c, replace(c, index=1, start=[5], end=[9])], ends_table=True)
    'db.t chunks 0-1 [-inf .. [9]]'
    >>> batch_label("db.t", [c], ends_table=False)
    'db.t chunks 0-0 [-inf .. [5])'
    """
    first, last = chunks[0], chunks[-1]
    start = "-inf" if first.start is None else str(first.start)
    end = "max)" if last.end is None else f"{last.end}{']' if ends_table else ')'}"
    return f"{table} chunks {first.index}-{last.index} [{start} .. {end}"
