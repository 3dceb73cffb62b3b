"""The capture's hot loop numbers the rows of events that share a position on, in binlog order:
a MySQL compressed transaction's events all stand at the payload's end, and an INSERT then a
DELETE of one key in it must keep the DELETE last (it was published as present). The k-th event
at a position numbers from ``k * SHARED_ROWS``, so no event's rows need counting first (worker
processes count them, `orchestrator.binlog.pool`)."""

from __future__ import annotations

from typing import Any

from orchestrator.binlog.reader import Boundary, RowsEvent
from orchestrator.pipeline.capture.step import SHARED_ROWS, _run
from orchestrator.positions import BinlogPosition


class Numbering:
    """A capture that records the first row number each event was given."""

    def __init__(self) -> None:
        self.given: list[tuple[str, int, int]] = []

    def add(self, event: Any, base: int = 0) -> None:
        self.given.append((event.file, event.end, base))

    def boundary(self, position: BinlogPosition, final: bool = False) -> None:
        pass


def rows(file: str, end: int) -> RowsEvent:
    return RowsEvent("d.t", "I", file, end, b"", (), None, None)  # type: ignore[arg-type]


def test_rows_of_events_at_one_position_are_numbered_on() -> None:
    capture = Numbering()
    records = [
        rows("b.1", 100),
        rows("b.1", 9000),
        rows("b.1", 9000),
        rows("b.1", 9000),
        Boundary(BinlogPosition("b.1", 9000), "commit"),
        rows("b.1", 9100),
        rows("b.2", 9000),
    ]
    _run(capture, records)  # type: ignore[arg-type]
    assert capture.given == [
        ("b.1", 100, 0),
        ("b.1", 9000, 0),
        ("b.1", 9000, SHARED_ROWS),
        ("b.1", 9000, 2 * SHARED_ROWS),
        ("b.1", 9100, 0),
        ("b.2", 9000, 0),
    ]
