"""A table's published version written by another writer (another pipeline given the same table
and lake): `orchestrator.pipeline.plan.tables._version_holds` goes on from it only when it is the
source at the pipeline's own start or later; `orchestrator.pipeline.publish.unchanged.
check_not_newer` refuses to publish a version older than the lake's. A real SQLite state store."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import RunFailed
from orchestrator.pipeline.plan.tables import _version_holds
from orchestrator.pipeline.publish.unchanged import check_not_newer
from orchestrator.positions import BinlogPosition
from orchestrator.state.records import TableCheckpoint
from orchestrator.state.store import StateStore

START = BinlogPosition("binlog.000002", 900, server_id=1, gtid_set="0-1-12")
EARLIER = BinlogPosition("binlog.000002", 400, server_id=1, gtid_set="0-1-10")
LATER = BinlogPosition("binlog.000003", 4, server_id=1, gtid_set="0-1-15")
ELSEWHERE = BinlogPosition("binlog.000009", 4000, server_id=2, gtid_set="0-2-20")


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def _checkpoint(run_id: str) -> TableCheckpoint:
    return TableCheckpoint(
        "pa", "db.t", 3, START.to_json(), 10, "m", run_id, dt.datetime.now(dt.UTC)
    )


def _manifest(position: BinlogPosition, run_id: str, version: int = 4) -> Any:
    return {"version": version, "position": position.to_json(), "run_id": run_id}


def test_the_pipelines_own_versions_hold_wherever_they_are(store: StateStore) -> None:
    ours = store.create_run("pa", {}).run_id
    # the checkpoint's own version (a run without a change moved the start past it), or a later
    # one of the pipeline's runs whose record a crash took back
    assert _version_holds("pa", store, "db.t", START, _checkpoint(ours), _manifest(EARLIER, ours))
    later = store.create_run("pa", {}).run_id
    assert _version_holds("pa", store, "db.t", START, _checkpoint(ours), _manifest(LATER, later))


@pytest.mark.parametrize(
    ("position", "holds"),
    [(LATER, True), (START, True), (EARLIER, False), (ELSEWHERE, False)],
)
def test_another_writers_version_holds_only_from_the_start_on(
    store: StateStore, caplog: pytest.LogCaptureFixture, position: BinlogPosition, holds: bool
) -> None:
    ours = store.create_run("pa", {}).run_id
    theirs = store.create_run("pb", {}).run_id  # another pipeline's run in the same store
    for run_id in (theirs, "20261202T000000Z-0123abcd"):  # and one this store never saw
        caplog.clear()
        checkpoint, manifest = _checkpoint(ours), _manifest(position, run_id)
        assert _version_holds("pa", store, "db.t", START, checkpoint, manifest) is holds
        assert "is another pipeline writing this table?" in caplog.text
        assert ("re-read" in caplog.text) is not holds


def test_a_version_older_than_the_lakes_is_not_published() -> None:
    with pytest.raises(RunFailed, match=r"later than this run's binlog\.000002:400"):
        check_not_newer("db.t", _manifest(START, "r2"), EARLIER)
    for current, ours in ((EARLIER, START), (START, START), (ELSEWHERE, START)):
        check_not_newer("db.t", _manifest(current, "r2"), ours)  # no exception
    check_not_newer("db.t", None, START)
