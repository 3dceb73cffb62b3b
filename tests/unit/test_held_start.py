"""`orchestrator.pipeline.plan.tables._held_before` and `capture.buffer.planned_starts`: a table
whose start the run before held back for an XA transaction is captured from that start but keeps
only what lies after its published version, and only where both positions are the same server's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from orchestrator.pipeline.capture.buffer import planned_starts
from orchestrator.pipeline.plan.tables import _held_before
from orchestrator.positions import BinlogPosition
from orchestrator.state.records import TableCheckpoint

HELD = BinlogPosition("binlog.000002", 400, server_id=1, gtid_set="0-1-10")
VERSION = BinlogPosition("binlog.000002", 900, server_id=1, gtid_set="0-1-12")


def _checkpoint(position: BinlogPosition) -> TableCheckpoint:
    return TableCheckpoint(
        "p", "db.t", 3, position.to_json(), 10, "m", "r", dt.datetime.now(dt.UTC)
    )


def _manifest(position: BinlogPosition) -> Any:
    return {"position": position.to_json()}


def test_a_start_held_before_its_version_names_the_version() -> None:
    assert _held_before(HELD, _checkpoint(HELD), _manifest(VERSION)) == VERSION.to_json()


@pytest.mark.parametrize(
    ("since", "recorded", "version"),
    [
        (VERSION, VERSION, VERSION),  # not held: the start is the version's
        (  # a later start (runs without a change moved it on)
            BinlogPosition("binlog.000003", 4, server_id=1),
            BinlogPosition("binlog.000003", 4, server_id=1),
            VERSION,
        ),
        (  # carried over from another server: its offsets are not the version's
            BinlogPosition("binlog.000007", 120, server_id=2),
            HELD,
            VERSION,
        ),
        (  # positions recorded before they named their server
            BinlogPosition("binlog.000002", 400),
            BinlogPosition("binlog.000002", 400),
            BinlogPosition("binlog.000002", 900),
        ),
        (HELD, HELD, BinlogPosition("binlog.000002", 900, server_id=2)),  # another server's
    ],
)
def test_otherwise_everything_from_the_start_is_kept(
    since: BinlogPosition, recorded: BinlogPosition, version: BinlogPosition
) -> None:
    assert _held_before(since, _checkpoint(recorded), _manifest(version)) is None


def test_the_capture_reads_from_the_held_start_and_keeps_from_the_version() -> None:
    info = {"from_position": HELD.to_json(), "version_position": VERSION.to_json()}
    nothing = {"held": False, "known": frozenset()}
    assert planned_starts(info, "incremental") == {"start": VERSION, "read_from": HELD, **nothing}
    # a table re-read inside the run is a snapshot from its new start: the version is not its
    # base, and it was not held back; the XA transactions known to hold nothing of it still do
    marks = {"held_back": True, "xa_known": ["1:61:"]}
    snapshot = planned_starts({**info, **marks}, "snapshot")
    assert snapshot == {"start": HELD, "read_from": None, "held": False, "known": {"1:61:"}}
    assert planned_starts({"from_position": HELD.to_json(), **marks}, "incremental") == {
        "start": HELD,
        "read_from": None,
        "held": True,
        "known": frozenset({"1:61:"}),
    }
