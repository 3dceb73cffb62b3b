"""orchestrator.pipeline.capture.derive on hand-made states (no server): what is derived from a
parent's row, and when the tables below are re-read instead (docs/design.md, "Foreign-key
cascades")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.binlog.events import NO_FOREIGN_KEY_CHECKS
from orchestrator.config import parse_config
from orchestrator.pipeline.capture.buffer import NEVER, CaptureTable, Drained
from orchestrator.pipeline.capture.cascade_setup import run_cascades
from orchestrator.pipeline.capture.cascade_state import BaseSpec
from orchestrator.pipeline.capture.derive import Cascades, Reread
from orchestrator.pipeline.capture.reread import stopped
from orchestrator.pipeline.changes import META_COLUMNS, OLD_PREFIX
from orchestrator.pipeline.plan.cascades import CascadeInfo
from orchestrator.positions import BinlogPosition
from orchestrator.schema.cascades import ForeignKey
from orchestrator.schema.tables import ColumnInfo, TableInfo, table_info_to_json
from orchestrator.schema.values import staging_schema
from orchestrator.source.dialect import Dialect
from orchestrator.source.foreign_keys import cascade_mode
from orchestrator.state.records import PlannedTable
from orchestrator.state.store import StateStore


def table(name: str, *columns: str, key: tuple[str, ...] = ("id",)) -> TableInfo:
    cols = tuple(ColumnInfo(c, "int", "int(11)", c not in key) for c in columns)
    return TableInfo(*name.split("."), cols, key, (), 0)


P = table("s.p", "id", "name")
C = table("s.c", "id", "pid", "note")
G = table("s.g", "id", "cid")
C_P = ForeignKey("c_p", "s.c", ("pid",), "s.p", ("id",), "CASCADE", "CASCADE")
G_C = ForeignKey("g_c", "s.g", ("cid",), "s.c", ("id",), "CASCADE", "RESTRICT")


def captured(info: TableInfo, start: int = 1, published: bool = True) -> CaptureTable:
    return CaptureTable(
        info, info.primary_key, BinlogPosition("b.000001", start), None, (), published
    )


def segment(info: TableInfo, rows: list[tuple[Any, ...]]) -> pa.Table:
    """A segment of ``info``: rows of (pos, op, values..., old key)."""
    schema = staging_schema(info.columns)
    names = [*META_COLUMNS, *schema.names, *(OLD_PREFIX + k for k in info.primary_key)]
    data: dict[str, list[Any]] = {n: [] for n in names}
    for number, (pos, op, *values) in enumerate(rows):
        row = [1, pos, number, op, *values]
        for n, v in zip(names, row, strict=True):
            data[n].append(v)
    types = [pa.int64()] * 3 + [pa.string()] + [f.type for f in schema] + [pa.int32()]
    return pa.table({n: pa.array(data[n], t) for n, t in zip(names, types, strict=True)})


def drained(info: TableInfo, rows: list[tuple[Any, ...]], flags: int = 0) -> Drained:
    return Drained(segment(info, rows), {}, [flags] * len(rows))


class Run:
    """The derivation of one pass over hand-made tables, bases in Parquet files."""

    def __init__(
        self,
        tmp_path: Path,
        keys: list[ForeignKey],
        tables: dict[str, CaptureTable],
        bases: dict[str, tuple[list[dict[str, Any]], tuple[int, int, int] | None]],
    ) -> None:
        self.rereads: list[Reread] = []
        specs = {}
        for name, (rows, complete) in bases.items():
            path = tmp_path / f"{name}.parquet"
            schema = staging_schema(tables[name].info.columns)
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
            specs[name] = BaseSpec([str(path)], complete)
        self.starts = {n: t.start.key for n, t in tables.items()}
        self.cascades = Cascades(
            keys, tables, self.starts, specs.get, lambda name: [], self.rereads.append
        )

    def flush(self, parts: dict[str, Drained]) -> dict[str, list[dict[str, Any]]]:
        out = self.cascades.process(parts)
        return {n: t.to_pylist() for n, t in out.items()}


CHILDREN = [
    {"id": 10, "pid": 1, "note": 100},
    {"id": 11, "pid": 1, "note": 110},
    {"id": 12, "pid": 2, "note": 120},
]


def test_a_parent_delete_deletes_its_children_at_its_position(tmp_path: Path) -> None:
    run = Run(
        tmp_path,
        [C_P],
        {"s.p": captured(P, published=False), "s.c": captured(C)},
        {"s.c": (CHILDREN, (1, 1, 0))},
    )
    derived = run.flush({"s.p": drained(P, [(100, "D", 1, None, 1)])})
    found = [(r["_tm_pos"], r["_tm_row"], r["_tm_op"], r["id"]) for r in derived["s.c"]]
    assert sorted(found) == [(100, 0, "D", 10), (100, 0, "D", 11)]
    assert not run.rereads


def test_an_update_cascade_gives_the_new_values_with_the_full_row(tmp_path: Path) -> None:
    run = Run(
        tmp_path,
        [C_P],
        {"s.p": captured(P, published=False), "s.c": captured(C)},
        {"s.c": (CHILDREN, (1, 1, 0))},
    )
    derived = run.flush({"s.p": drained(P, [(100, "U", 7, None, 2)])})  # key 2 -> 7
    assert derived["s.c"] == [
        {
            "_tm_file": 1,
            "_tm_pos": 100,
            "_tm_row": 0,
            "_tm_op": "U",
            "id": 12,
            "pid": 7,
            "note": 120,
            "_tm_old_id": 12,
        }
    ]


def test_rows_written_without_foreign_key_checks_cascade_nothing(tmp_path: Path) -> None:
    run = Run(
        tmp_path,
        [C_P],
        {"s.p": captured(P, published=False), "s.c": captured(C)},
        {"s.c": (CHILDREN, (1, 1, 0))},
    )
    parent = drained(P, [(100, "D", 1, None, 1)], flags=NO_FOREIGN_KEY_CHECKS)
    assert run.flush({"s.p": parent}) == {}


def test_the_childs_own_changes_before_the_parent_decide(tmp_path: Path) -> None:
    """A child moved to parent 2 before parent 1 goes is not deleted with it; one moved to 1 is."""
    run = Run(
        tmp_path,
        [C_P],
        {"s.p": captured(P, published=False), "s.c": captured(C)},
        {"s.c": (CHILDREN, (1, 1, 0))},
    )
    child = drained(C, [(50, "U", 10, 2, 100, 10), (60, "U", 12, 1, 120, 12)])
    derived = run.flush({"s.c": child, "s.p": drained(P, [(100, "D", 1, None, 1)])})
    assert sorted(r["id"] for r in derived["s.c"]) == [11, 12]


@pytest.mark.parametrize(
    ("complete", "reread"), [((1, 500, 0), True), ((1, 50, 0), False)], ids=["inside", "after"]
)
def test_a_cascade_into_a_table_still_being_read_re_reads_the_tables_below(
    tmp_path: Path, complete: tuple[int, int, int], reread: bool
) -> None:
    """``c`` is a snapshot whose reads ended at ``complete``: a cascade before that may have hit
    rows its reads saw gone already, whose children in ``g`` the derivation cannot find."""
    run = Run(
        tmp_path,
        [C_P, G_C],
        {"s.p": captured(P, published=False), "s.c": captured(C), "s.g": captured(G)},
        {"s.c": (CHILDREN, complete), "s.g": ([{"id": 1, "cid": 10}], (1, 1, 0))},
    )
    derived = run.flush({"s.p": drained(P, [(100, "D", 1, None, 1)])})
    assert sorted(r["id"] for r in derived["s.c"]) == [10, 11]  # c's own rows: exact either way
    assert [(sorted(r.tables), r.pos) for r in run.rereads] == ([(["s.g"], 100)] if reread else [])
    if not reread:
        assert [r["id"] for r in derived["s.g"]] == [1]


def test_a_parent_outside_the_run_between_re_reads_the_tables_below(tmp_path: Path) -> None:
    """``c`` is not published: which of its rows went is unknown, so ``g`` is read again."""
    run = Run(
        tmp_path,
        [C_P, G_C],
        {
            "s.p": captured(P, published=False),
            "s.c": captured(C, published=False),
            "s.g": captured(G),
        },
        {"s.g": ([{"id": 1, "cid": 10}], (1, 1, 0))},
    )
    assert run.flush({"s.p": drained(P, [(100, "D", 1, None, 1)])}) == {}
    assert [sorted(r.tables) for r in run.rereads] == [["s.g"]]


def test_a_cascade_before_a_tables_start_re_reads_those_below_that_start_earlier(
    tmp_path: Path,
) -> None:
    run = Run(
        tmp_path,
        [C_P, G_C],
        {"s.p": captured(P, published=False), "s.c": captured(C, 300), "s.g": captured(G, 50)},
        {"s.c": (CHILDREN, (1, 300, 0)), "s.g": ([{"id": 1, "cid": 10}], (1, 50, 0))},
    )
    assert run.flush({"s.p": drained(P, [(100, "D", 1, None, 1)])}) == {}
    assert [sorted(r.tables) for r in run.rereads] == [["s.g"]]


def test_a_key_value_given_back_while_the_child_was_read_re_reads_it(tmp_path: Path) -> None:
    """Parent 1 goes, then parent 2 becomes 1, all before the child's reads ended: a child row
    read after both holding 1 cannot be told from one that held it before."""
    run = Run(
        tmp_path,
        [C_P],
        {"s.p": captured(P, published=False), "s.c": captured(C)},
        {"s.c": (CHILDREN, (1, 500, 0))},
    )
    run.flush({"s.p": drained(P, [(100, "D", 1, None, 1), (200, "U", 1, None, 2)])})
    assert [(sorted(r.tables), r.pos) for r in run.rereads] == [(["s.c"], 200)]


# --------------------------------------------------------------------------- the server's mode


class _Server:
    """What `cascade_mode` asks of a source: its dialect and one variable. No MySQL 9.6 runs here,
    so its answers are given as such a server gives them."""

    def __init__(self, version: str, native: str | None) -> None:
        self.dialect = Dialect.from_version(version)
        self.native = native

    def variables(self, *names: str) -> dict[str, str | None]:
        return dict.fromkeys(names, self.native)


@pytest.mark.parametrize(
    ("version", "native", "mode"),
    [
        ("9.6.0", "OFF", "logged"),  # SQL-layer foreign keys: the child rows are logged
        ("9.7.1-commercial", None, "logged"),
        ("9.6.0", "ON", "derive"),  # started with InnoDB's own foreign keys
        ("9.5.0", None, "derive"),
        ("8.4.3", None, "derive"),
        ("10.11.6-MariaDB-log", None, "derive"),
    ],
)
def test_the_server_mode(version: str, native: str | None, mode: str) -> None:
    assert cascade_mode(_Server(version, native)) == mode  # type: ignore[arg-type]


def test_a_server_that_logs_its_cascades_has_none_derived(tmp_path: Path) -> None:
    """The capture derives only for tables planned in ``derive`` mode: on a server that logs its
    cascades the child rows arrive as row events, and deriving them too would apply them twice."""
    config = parse_config(
        {
            "pipeline": "modes",
            "source": {"host": "127.0.0.1", "port": 1, "user": "u", "server_id": 1},
            "spark": {"master": "local[1]"},
            "output": {"path": str(tmp_path / "lake")},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": [{"name": "s.c"}],
        },
        check_env=False,
    )
    store = StateStore(config.state.url)
    try:
        for mode, keys in (("logged", (C_P,)), ("derive", (C_P,))):
            run = store.create_run("modes", {"tables": ["s.c"]})
            info = CascadeInfo(mode, keys, {"s.p": P}).to_json()  # type: ignore[arg-type]
            store.add_run_tables(
                run.run_id,
                [
                    PlannedTable(
                        "s.c",
                        "incremental",
                        None,
                        ["id"],
                        {"table_info": table_info_to_json(C), "cascades": info},
                        [],
                    )
                ],
            )
            found = run_cascades(config, store, run.run_id, {"s.c": captured(C)})
            if mode == "logged":
                assert found is None
            else:
                assert found is not None and found.keys == (C_P,)
                assert not found.outside["s.p"].published
            store.finish_run(run.run_id, "succeeded")
    finally:
        store.close()


# --------------------------------------------------------------------------- reread.stopped


@pytest.mark.parametrize(
    ("at", "lowered", "expected"),
    [
        # p started at 100 (decoded from 20 for its children's cascades), c at 300, g at 50
        (80, True, ["s.g"]),  # before p's own start: p's base has it; g's cascade is hidden
        (150, True, ["s.c", "s.g", "s.p"]),  # p stops being known: c, after it, too
        (400, False, ["s.c", "s.g", "s.p"]),
        (10, True, []),  # before every start
    ],
)
def test_the_tables_a_parents_change_stops(
    tmp_path: Path, at: int, lowered: bool, expected: list[str]
) -> None:
    """`reread.stopped`: a change of the parent re-reads it after its own start only (not the
    lowered start its rows are decoded from); the tables below that started before the change
    for the cascades it hides; and, when the parent stops being known, every table below still
    captured, whatever its start (its later rows would cascade into them)."""
    tables = {"s.p": captured(P, 100), "s.c": captured(C, 300), "s.g": captured(G, 50)}
    run = Run(tmp_path, [C_P, G_C], tables, {})
    if lowered:
        run.starts["s.p"] = (1, 20, 0)
    found = stopped(frozenset({"s.p"}), (1, at, 0), tables, run.starts, run.cascades)
    assert found == expected


def test_a_table_no_longer_kept_is_not_stopped_again(tmp_path: Path) -> None:
    tables = {"s.p": captured(P, 100), "s.c": captured(C, 300), "s.g": captured(G, 50)}
    run = Run(tmp_path, [C_P, G_C], tables, {})
    run.starts["s.c"] = NEVER
    found = stopped(frozenset({"s.p"}), (1, 150, 0), tables, run.starts, run.cascades)
    assert found == ["s.g", "s.p"]  # c, no longer kept, is not stopped again; g below it is
    whole = stopped(frozenset(), (1, 10, 0), tables, run.starts, run.cascades, frozenset({"s.g"}))
    assert whole == ["s.g"]
