"""``P0`` gets the same visibility margin as each ``L`` (orchestrator.pipeline.plan).

A transaction can be in the binlog before ``P0`` while its rows are not yet visible to a
new read (group commit, semi-sync ``AFTER_SYNC``): if the key bounds were read at once,
an insert above the planned max key would be in no chunk and before the capture's start.
No test can hold a real commit in that window, so this one checks the order of what the
plan step does against a real MariaDB: ``P0`` recorded, then ``read_margin_seconds``
waited, and only then the table's key bounds read (today's main read them at once).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.pipeline.plan import step as plan_module
from orchestrator.pipeline.plan import tables as table_planning
from orchestrator.source.connection import Source
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline
from tests.integration.conftest import run_plain

pytestmark = pytest.mark.integration


def test_key_bounds_are_read_only_after_the_margin_past_p0(
    tmp_path: Path, mariadb: LocalMariaDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh_database(mariadb, "p0m", "CREATE TABLE p0m.t (id INT PRIMARY KEY, v INT)")
    mariadb.execute("INSERT INTO t SELECT seq, seq FROM seq_1_to_100", database="p0m")
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": "p0m.t"}],
        name="p0m",
        defaults={"chunk_size": 10, "read_margin_seconds": 0.25},
    )
    events: list[Any] = []
    position, query = Source.current_position, Source.query

    def record_position(self: Source) -> Any:
        result = position(self)
        events.append(("P0", time.monotonic()))
        return result

    def record_query(self: Source, sql: str, params: Any = None) -> Any:
        if "`p0m`.`t`" in sql or "p0m.t" in sql:
            events.append("reads the table")
        return query(self, sql, params)

    monkeypatch.setattr(Source, "current_position", record_position)
    monkeypatch.setattr(Source, "query", record_query)
    real_sleep = time.sleep

    def record_sleep(seconds: float) -> None:
        """The plan step's waits are recorded; anyone else's (another thread's) really sleep."""
        if sys._getframe(1).f_globals.get("__name__") == table_planning.__name__:
            events.append(("wait", seconds, time.monotonic()))
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", record_sleep)
    handle = plan_module.plan(config, holder="test")
    assert handle.snapshot_tables
    first_read = events.index("reads the table")
    (p0, recorded_at), *before = events[:first_read]
    assert p0 == "P0", events
    # The wait ends at least the margin after P0: what planning did since (the shapes) counts.
    waits = [event[1:] for event in before if event[0] == "wait"]
    assert len(waits) == 1 and waits[0][1] + waits[0][0] - recorded_at >= 0.25, events


def test_a_run_of_incremental_tables_waits_no_margin_and_misses_no_change(
    tmp_path: Path, mariadb: LocalMariaDB, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An incremental table reads no key bound: its changes come from the binlog from its
    published position, so planning it does not wait (a table to snapshot still does, above).
    A row committed right before ``P0`` is recorded still reaches the published table."""
    fresh_database(mariadb, "p0i", "CREATE TABLE p0i.t (id INT PRIMARY KEY, v INT)")
    mariadb.execute("INSERT INTO t SELECT seq, seq FROM seq_1_to_100", database="p0i")
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": "p0i.t"}],
        name="p0i",
        defaults={"chunk_size": 10, "read_margin_seconds": 0.25},
    )
    run_plain(config)
    waits: list[float] = []
    real_sleep, position = time.sleep, Source.current_position
    inserted: list[int] = []

    def record_sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == table_planning.__name__:
            waits.append(seconds)
        real_sleep(seconds)

    def insert_then_position(self: Source) -> Any:  # P0, the first position the run records
        if not inserted:
            mariadb.execute(
                "INSERT INTO t VALUES (1000, 1000)",
                "UPDATE t SET v = -v WHERE id <= 5",
                database="p0i",
            )
            inserted.append(1000)
        return position(self)

    monkeypatch.setattr(time, "sleep", record_sleep)
    monkeypatch.setattr(Source, "current_position", insert_then_position)
    run_plain(config)
    assert inserted and waits == [], waits
    assert_lake_equals_source(config, mariadb, ["p0i.t"])
