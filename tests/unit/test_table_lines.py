"""`orchestrator.pipeline.lines`: lines many tables share are logged once, each table's own line
at DEBUG; a line only one table has is logged as it is."""

from __future__ import annotations

import logging

import pytest

from orchestrator.pipeline.lines import TableLines

log = logging.getLogger("tidemark.test.lines")


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == log.name]


def test_shared_lines_logged_once_per_group(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=log.name)
    lines = TableLines(log)
    for i in range(10):
        lines.add(f"db.t{i}", f"kept version {i}", "no change at P")
    lines.add("db.other", "kept version 3", "no change at Q")
    assert _lines(caplog) == []  # nothing before the step ends
    lines.flush()
    got = _lines(caplog)
    assert got[0] == (
        logging.INFO,
        "10 tables: no change at P (db.t0, db.t1, db.t2, db.t3, db.t4, db.t5, db.t6, db.t7 "
        "and 2 more)",
    )
    assert got[1:11] == [(logging.DEBUG, f"table db.t{i}: kept version {i}") for i in range(10)]
    assert got[11:] == [(logging.INFO, "table db.other: kept version 3")]
    caplog.clear()
    lines.flush()  # flushed lines are not logged again
    assert _lines(caplog) == []


def test_own_lines_not_formatted_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    lines = TableLines(log)
    lines.add("db.a", "own a", "shared")
    lines.add("db.b", "own b", "shared")
    lines.flush()
    assert _lines(caplog) == [(logging.INFO, "2 tables: shared (db.a, db.b)")]
