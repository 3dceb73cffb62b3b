"""Where tables' next starts stay for XA transactions prepared at a capture's end
(`XaTransactions.holds`): a transaction with rows of a table holds that table where it began; one
holding nothing the capture decodes is known by every table, which goes on from the end; one with
rows decoded but not kept holds the others there once, and is let go by a table the run before
held for it (docs/design.md, "Changes that are not row images")."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

from orchestrator.app.airflow_support import asset_extra
from orchestrator.binlog.reader import RowsEvent, TableChange, XaEvent
from orchestrator.binlog.statements import Xid
from orchestrator.config import parse_config
from orchestrator.pipeline.capture.xa import (
    MAX_KNOWN,
    XA_ENDED,
    XA_FOREIGN,
    XA_KNOWN,
    XaTransactions,
    xid_text,
)
from orchestrator.pipeline.publish.step import _published
from orchestrator.positions import BinlogPosition
from orchestrator.state.records import TableCheckpoint

FILE = "binlog.000003"
H = BinlogPosition(FILE, 9000)


def at(pos: int) -> BinlogPosition:
    return BinlogPosition(FILE, pos)


def rows(table: str, end: int) -> RowsEvent:
    nothing = cast(Any, None)  # the undecoded parts: holds never looks at them
    return RowsEvent(table, "I", FILE, end, b"", nothing, nothing, nothing)


def prepared(xa: XaTransactions, name: bytes, start: int, *tables: str) -> None:
    """An XA transaction begun at ``start`` with rows of ``tables``, prepared."""
    xa.step(XaEvent("start", None, FILE, start + 10, at(start)))
    for n, table in enumerate(tables):
        assert xa.take(rows(table, start + 20 + n))
    xa.step(XaEvent("end", Xid(name), FILE, start + 90, at(start)))


def test_nothing_prepared_holds_nothing() -> None:
    xa = XaTransactions()
    prepared(xa, b"done", 100, "db.a")
    assert xa.step(XaEvent("commit", Xid(b"done"), FILE, 500, at(400))) is not None
    holds = xa.holds({"db.a": (at(50), False), "db.b": (at(50), False)}, H)
    assert (holds.own, holds.foreign) == ({}, {})


def test_a_transaction_of_a_table_holds_it_and_the_others_stay() -> None:
    xa = XaTransactions()
    prepared(xa, b"mine", 300, "db.a")
    holds = xa.holds({"db.a": (at(50), False), "db.b": (at(50), False)}, H)
    assert holds.own == {"db.a": at(300)}
    assert holds.foreign == {}


def test_a_transaction_of_other_tables_holds_every_table_once() -> None:
    xa = XaTransactions()
    prepared(xa, b"elsewhere", 300, "db.outside")
    prepared(xa, b"later", 700)  # no rows of any table the capture reads
    live = {"db.a": (at(50), False), "db.b": (at(300), False)}
    holds = xa.holds(live, H)
    assert holds.own == {}
    assert holds.foreign == {"db.a": at(300), "db.b": at(300)}  # where the first began


def test_a_table_held_for_one_that_began_there_or_before_lets_it_go() -> None:
    xa = XaTransactions()
    prepared(xa, b"stuck", 300, "db.outside")
    live = {
        "db.a": (at(300), True),  # held there by the run before: let go
        "db.b": (at(350), True),  # held for a later one: this one began before, let go
        "db.c": (at(300), False),  # not held before (it began at c's start): held once
        "db.d": (at(250), True),  # held for an earlier one: held here, further on
    }
    holds = xa.holds(live, H)
    assert holds.foreign == {"db.c": at(300), "db.d": at(300)}


def test_a_table_held_before_is_held_for_one_begun_after_its_start() -> None:
    xa = XaTransactions()
    prepared(xa, b"new", 400, "db.outside")
    holds = xa.holds({"db.a": (at(300), True)}, H)
    assert holds.foreign == {"db.a": at(400)}


def test_both_kinds_at_once() -> None:
    xa = XaTransactions()
    prepared(xa, b"elsewhere", 200, "db.outside")
    prepared(xa, b"mine", 300, "db.a")
    live = {"db.a": (at(50), False), "db.b": (at(50), False)}
    holds = xa.holds(live, H)
    assert holds.own == {"db.a": at(200)}  # every held transaction seen again from there
    assert holds.foreign == {"db.b": at(200)}


def text(name: bytes) -> str:
    return xid_text(Xid(name))


def test_one_holding_nothing_decoded_is_known_and_holds_nothing() -> None:
    """Its commit is known to every table: no table waits for it, whatever held it before."""
    xa = XaTransactions()
    prepared(xa, b"outside", 300)
    live = {"db.a": (at(50), False), "db.b": (at(300), True)}
    holds = xa.holds(live, H)
    assert (holds.own, holds.foreign) == ({}, {})
    assert holds.known == {"db.a": [text(b"outside")], "db.b": [text(b"outside")]}
    known = {**H.to_json(), XA_KNOWN: [text(b"outside")]}
    assert holds.next_starts(H) == {"db.a": known, "db.b": known}


def test_what_a_start_knew_is_known_on_until_its_outcome() -> None:
    knew = {"db.a": [text(b"old"), text(b"stays")], "db.b": [text(b"other")]}
    xa = XaTransactions({x for xids in knew.values() for x in xids})
    xa.step(XaEvent("commit", Xid(b"old"), FILE, 200, at(150)))  # its group before the capture
    xa.step(XaEvent("commit", Xid(b"unknown"), FILE, 220, at(210)))  # nobody's: not recorded
    prepared(xa, b"mine", 300, "db.a")
    prepared(xa, b"new", 400)
    live = {"db.a": (at(50), False), "db.b": (at(50), False)}
    holds = xa.holds(live, H, knew)
    assert holds.known == {
        "db.a": sorted([text(b"new"), text(b"stays")]),
        "db.b": sorted([text(b"new"), text(b"other")]),
    }
    assert holds.own == {"db.a": at(300)}
    assert holds.next_starts(H)["db.a"] == {**at(300).to_json(), XA_KNOWN: holds.known["db.a"]}
    # the capture checkpoint records the outcome: a capture resumed from it, which may not see
    # the commit again, knows it all the same
    assert xa.outcomes() == {XA_ENDED: [text(b"old")]}
    resumed = XaTransactions(xa.known, {**at(250).to_json(), **xa.outcomes()})
    assert resumed.holds(live, H, knew).known == {
        "db.a": [text(b"stays")],
        "db.b": [text(b"other")],
    }


def test_a_table_knows_at_most_so_many() -> None:
    xa = XaTransactions()
    for n in range(MAX_KNOWN + 5):
        prepared(xa, f"x{n}".encode(), 100 + n * 100)
    assert [len(k) for k in xa.holds({"db.a": (at(50), False)}, H).known.values()] == [MAX_KNOWN]


def statement(table: str, end: int, *, rows: bool = True) -> TableChange:
    return TableChange(frozenset((table,)), "a statement-format change", FILE, end, rows=rows)


def test_a_change_of_rows_without_images_counts_at_the_commit() -> None:
    """Held with the transaction's rows and moved to its commit, where the capture re-reads the
    table; dropped by a rollback. A change of shape is not the transaction's: not held."""
    xa = XaTransactions()
    xa.step(XaEvent("start", None, FILE, 110, at(100)))
    assert xa.take(statement("db.a", 120))
    assert not xa.take(statement("db.b", 130, rows=False))
    xa.step(XaEvent("end", Xid(b"s"), FILE, 190, at(100)))
    assert not xa.take(statement("db.a", 200))  # outside any XA group: the caller applies it
    assert xa.tables() == {"db.a"}
    assert xa.holds({"db.a": (at(50), False)}, H).own == {"db.a": at(100)}
    assert xa.step(XaEvent("commit", Xid(b"s"), FILE, 500, at(400))) == [statement("db.a", 500)]
    xa.step(XaEvent("start", None, FILE, 710, at(700)))
    assert xa.take(statement("db.a", 720))
    xa.step(XaEvent("end", Xid(b"r"), FILE, 790, at(700)))
    assert xa.step(XaEvent("rollback", Xid(b"r"), FILE, 900, at(800))) == []


def test_a_run_reports_where_the_table_is_not_its_held_back_start(tmp_path: Path) -> None:
    """A checkpoint held back for another table's transaction lies before ``H`` and carries
    `XA_FOREIGN` (and `XA_KNOWN`), for the next run's planning; the position a run reports (its
    summary, the Airflow asset's extra) is ``H``, and holds only what docs/output.md lists."""
    config = parse_config(
        {
            "pipeline": "marks",
            "source": {"host": "127.0.0.1", "port": 1, "user": "u", "server_id": 1},
            "output": {"path": str(tmp_path / "lake")},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": [{"name": "db.a"}],
        }
    )
    held = {**at(300).to_json(), XA_FOREIGN: True, XA_KNOWN: [text(b"x")]}
    checkpoint = TableCheckpoint("marks", "db.a", 2, held, 10, "m", "run", dt.datetime.now(dt.UTC))
    published = _published(config, checkpoint, None, True)  # read back: the checkpoint's
    assert published.position == at(300).to_json()
    assert asset_extra(published, "run")["position"] == at(300).to_json()
    # by the publish that made it: where the table is the source, H, not the next run's start
    published = _published(config, checkpoint, None, True, at=H.to_json())
    assert asset_extra(published, "run")["position"] == H.to_json()
