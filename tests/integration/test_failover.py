"""Positions belong to a server; a pipeline follows a failover by GTID
(orchestrator.binlog.failover).

Two private MariaDB servers in GTID replication: a primary (server_id 1) and a replica
(server_id 2, ``log_slave_updates``). A pipeline snapshots from the replica; the replica
stops while the primary takes more writes; the pipeline, pointed at the primary, goes on
from the published GTID set without reading any table again. Pointed back at the replica
after its binlog was purged past that set, it cannot: it says so and reads the tables again.
Each time the lake equals the source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.app.doctor import doctor_command, preflight, run_checks
from orchestrator.app.status import status_command
from orchestrator.binlog.failover import Follower
from orchestrator.binlog.reader import Boundary, EventReader
from orchestrator.config import PipelineConfig
from orchestrator.errors import SourceChanged, SourceNotReady
from orchestrator.pipeline.plan.step import plan
from orchestrator.positions import BinlogPosition
from orchestrator.source.connection import Source
from orchestrator.state.store import RunRecord, StateStore
from tests.conftest import assert_lake_equals_source, load_pipeline
from tests.integration.conftest import run_plain
from tests.integration.test_purge import purge_all_but_current

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLES = ["fo.t", "fo.other"]


@pytest.fixture()
def topology(tmp_path: Path) -> Iterator[tuple[LocalMariaDB, LocalMariaDB]]:
    """A primary and its GTID replica, with tables ``fo.t`` (3,000 rows) and ``fo.other`` (400);
    the replica's binlog is two files ahead of the primary's."""
    primary = LocalMariaDB.create(base_dir=tmp_path, server_id=1)
    replica = LocalMariaDB.create(
        {**GOOD_BINLOG, "log-slave-updates": None}, base_dir=tmp_path, server_id=2
    )
    try:
        primary.start()
        replica.start()
        replica.replicate_from(primary)
        primary.execute("CREATE DATABASE fo")
        for name, rows in (("t", 3000), ("other", 400)):
            primary.execute(
                f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(40))",
                f"INSERT INTO {name} SELECT seq, CONCAT('v', seq) FROM seq_1_to_{rows}",
                database="fo",
            )
        replica.catch_up(primary)
        # a replica's binlog has its own files and offsets (it rotates on its own)
        replica.execute("FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        yield primary, replica
    finally:
        replica.destroy()
        primary.destroy()


def pointed_at(tmp_path: Path, server: LocalMariaDB) -> PipelineConfig:
    """The pipeline's config, its source ``server`` (state and lake stay where they are)."""
    return load_pipeline(
        tmp_path,
        server,
        [{"name": name} for name in TABLES],
        name="failover",
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
    )


def write(primary: LocalMariaDB, round_: int) -> None:
    """Updates, deletes and inserts above the planned keys in both tables."""
    for name in ("t", "other"):
        primary.execute(
            f"UPDATE {name} SET v = CONCAT('r{round_}-', id) WHERE id % 7 = {round_}",
            f"DELETE FROM {name} WHERE id % 13 = {round_}",
            f"INSERT INTO {name} SELECT {round_} * 10000 + seq, 'new' FROM seq_1_to_40",
            database="fo",
        )


def latest_run(config: PipelineConfig) -> tuple[dict[str, str], int]:
    """The latest run's mode per table, and how many chunks it read."""
    store = StateStore(config.state.url)
    try:
        run = store.runs(config.pipeline, limit=1)[0]
        return {r.table: r.mode for r in store.run_tables(run.run_id)}, len(
            store.chunks(run.run_id)
        )
    finally:
        store.close()


def run_record(config: PipelineConfig, run_id: str) -> RunRecord:
    store = StateStore(config.state.url)
    try:
        return store.get_run(run_id)
    finally:
        store.close()


def release_lock(config: PipelineConfig) -> None:
    store = StateStore(config.state.url)
    try:
        store.release_lock(config.pipeline, "test")
    finally:
        store.close()


def published_servers(config: PipelineConfig) -> set[int | None]:
    store = StateStore(config.state.url)
    try:
        return {
            BinlogPosition.from_json(cp.position).server_id
            for cp in store.table_checkpoints(config.pipeline)
        }
    finally:
        store.close()


def test_failover_goes_on_by_gtid_and_a_purged_set_is_read_again(
    topology: tuple[LocalMariaDB, LocalMariaDB],
    tmp_path: Path,
    spark: object,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary, replica = topology
    on_replica = pointed_at(tmp_path, replica)
    run_plain(on_replica)
    assert published_servers(on_replica) == {2}
    write(primary, 1)  # replicated
    replica.catch_up(primary)
    unfinished = plan(on_replica, holder="test").run_id  # P0 on the replica, then interrupted
    release_lock(on_replica)
    replica.stop()
    write(primary, 2)  # only the primary has these

    on_primary = pointed_at(tmp_path, primary)
    assert doctor_command(on_primary) == 0
    assert status_command(on_primary) == 0
    said = capsys.readouterr().out
    assert "PASS  server identity: published fo.other, fo.t: binlog position" in said, said
    assert (
        "recorded on server_id 2, the source is server_id 1: the next run goes on from GTID set"
        in said
    )
    assert f"PASS  server identity: the unfinished run {unfinished}: its start position" in said
    caplog.set_level(logging.INFO)
    caplog.clear()
    run_plain(on_primary)
    assert latest_run(on_primary) == ({"fo.t": "incremental", "fo.other": "incremental"}, 0)
    left = run_record(on_primary, unfinished)
    assert left.status == "failed" and "left behind: the source changed" in str(left.error)
    moved = [r.getMessage() for r in caplog.records if "no table re-read" in r.getMessage()]
    assert len(moved) == 1 and "server_id 2" in moved[0] and "server_id 1" in moved[0], moved
    assert_lake_equals_source(on_primary, primary, TABLES)
    assert published_servers(on_primary) == {1}

    replica.start()  # it resumes replicating; then its binlog loses the set the lake is at
    write(primary, 3)
    replica.catch_up(primary)
    purge_all_but_current(replica)
    on_replica = pointed_at(tmp_path, replica)
    assert doctor_command(on_replica) == 3
    said = capsys.readouterr().out
    assert "FAIL  server identity fo.other, fo.t: published fo.other, fo.t:" in said, said
    caplog.clear()
    run_plain(on_replica)
    assert latest_run(on_replica)[0] == {"fo.t": "snapshot", "fo.other": "snapshot"}
    rereads = [r.getMessage() for r in caplog.records if ": re-read (version 2)" in r.getMessage()]
    assert len(rereads) == 2 and all("server_id 1" in m and "binlog" in m for m in rereads), rereads
    assert_lake_equals_source(on_replica, replica, TABLES)


def test_follower_places_positions_and_boundaries_carry_the_gtid_set(
    topology: tuple[LocalMariaDB, LocalMariaDB], tmp_path: Path
) -> None:
    primary, replica = topology
    on_primary = pointed_at(tmp_path, primary)
    on_replica = pointed_at(tmp_path, replica)
    with Source.from_pipeline(on_replica) as source:
        recorded = source.current_position()
    assert (
        recorded.server_id == 2
        and recorded.gtid_set == primary.execute("SELECT @@gtid_binlog_pos")[0][0]
    )
    write(primary, 1)
    replica.catch_up(primary)
    with Source.from_pipeline(on_primary) as source:
        follower = Follower(on_primary, source)
        here = source.current_position()
        assert follower.place(here).how == "same"
        moved = follower.place(recorded)
        assert moved.how == "moved" and moved.position is not None
        assert moved.position.server_id == 1 and moved.position.gtid_set == recorded.gtid_set
        # the primary's binlog there is at the recorded set: the same point of the history
        assert (
            primary.execute(
                f"SELECT BINLOG_GTID_POS('{moved.position.file}', {moved.position.pos})"
            )[0][0]
            == recorded.gtid_set
        )
        without = BinlogPosition(recorded.file, recorded.pos, server_id=2)
        assert (
            follower.place(without).how == "lost"
            and "no GTID set" in follower.place(without).failure
        )
        ahead = BinlogPosition(recorded.file, recorded.pos, server_id=2, gtid_set="0-1-99999")
        assert (
            follower.place(ahead).how == "lost"
            and "not in the master's binlog" in follower.place(ahead).failure
        )
        # same server_id, but its binlog at that offset is not at the recorded set (a reset)
        reset = BinlogPosition(here.file, here.pos, server_id=1, gtid_set="0-1-3")
        assert "was reset" in (follower.foreign(reset) or "")
        # every boundary a capture reads carries the exact GTID set the server gives for it
        info = source.table_info("fo.t")
    with (
        EventReader(on_primary.source, "", recorded, {"fo.t": info}) as reader,
        pytest.raises(
            SourceChanged, match=r"was recorded on server_id 2, but 127\.0\.0\.1:\d+ is server_id 1"
        ),
    ):
        next(iter(reader.events()))
    with EventReader(on_primary.source, "", moved.position, {"fo.t": info}) as reader:
        boundaries = [r.position for r in reader.events() if isinstance(r, Boundary)]
    assert len(boundaries) >= 6
    for b in boundaries:
        assert b.server_id == 1
        assert (
            b.gtid_set == primary.execute(f"SELECT BINLOG_GTID_POS('{b.file}', {b.pos})")[0][0]
        ), b


def test_a_replica_that_does_not_log_what_it_replicates_is_not_ready(tmp_path: Path) -> None:
    primary = LocalMariaDB.create(base_dir=tmp_path, server_id=1)
    replica = LocalMariaDB.create(base_dir=tmp_path, server_id=3)  # log_slave_updates OFF
    try:
        primary.start()
        replica.start()
        replica.replicate_from(primary)
        primary.execute(
            "CREATE DATABASE fo",
            "CREATE TABLE fo.t (id INT PRIMARY KEY, v VARCHAR(40))",
            "CREATE TABLE fo.other (id INT PRIMARY KEY, v VARCHAR(40))",
        )
        replica.catch_up(primary)
        checks = {c.name: c for c in run_checks(pointed_at(tmp_path, replica))}
        assert not checks["replica binlog"].ok
        assert "log_slave_updates = OFF" in checks["replica binlog"].detail
        assert checks["replica binlog"].fix.startswith("set log_slave_updates = ON")
        with pytest.raises(SourceNotReady, match="replica binlog"):
            preflight(pointed_at(tmp_path, replica))
        checks = {c.name: c for c in run_checks(pointed_at(tmp_path, primary))}
        assert (
            checks["replica binlog"].ok
            and "not a running replica" in checks["replica binlog"].detail
        )
    finally:
        replica.destroy()
        primary.destroy()
