"""Event types the reader does not act on: the ones known to change no row pass, an INCIDENT
(lost events) makes every table read again, and any other type stops the capture naming it
and its position; never a silent skip. Events built by hand, no server."""

from __future__ import annotations

import struct

import pytest

from orchestrator.binlog import events as ev
from orchestrator.binlog.reader import Boundary, EventReader, TableChange
from orchestrator.config.sections import SourceConfig
from orchestrator.errors import RunFailed
from orchestrator.positions import BinlogPosition
from tests.unit.test_rowdecode import packet

START = BinlogPosition("binlog.000001", 4)


def frame(*events: bytes, tables: tuple[str, ...] = ("d.t", "d.u")) -> list[object]:
    reader = EventReader(
        SourceConfig(host="h", user="u", server_id=9), "", START, dict.fromkeys(tables)
    )  # type: ignore[arg-type]
    reader._folded, reader._collations = {t: t for t in tables}, {}
    return list(reader._frame(iter(events)))  # type: ignore[arg-type]


def test_events_that_change_no_row_pass() -> None:
    for n, kind in enumerate(sorted(ev.HARMLESS)):
        assert frame(packet(kind, b"\x00" * 8, 200 + n)) == [], kind


def test_an_incident_reads_every_table_again() -> None:
    (change,) = frame(packet(ev.INCIDENT, struct.pack("<H", 1) + b"\x00", 300))
    assert isinstance(change, TableChange) and change.tables == {"d.t", "d.u"}
    assert "INCIDENT" in change.what and change.end == 300


@pytest.mark.parametrize("kind", [42, 1, 6, 200])  # a tagged GTID (MySQL 8.3), old LOAD, unknown
def test_an_unknown_event_stops_the_capture(kind: int) -> None:
    with pytest.raises(
        RunFailed, match=rf"binlog.000001:400 holds a binlog event of type {kind}, which"
    ):
        frame(
            packet(ev.QUERY, struct.pack("<IIBHH", 7, 0, 1, 0, 0) + b"d\x00BEGIN", 350),
            packet(kind, b"\x00" * 8, 400),
        )


def test_load_data_as_a_statement_reads_its_table_again() -> None:
    """EXECUTE_LOAD_QUERY: a QUERY's post-header and 13 bytes more, then the statement."""
    body = (
        struct.pack("<IIBHH", 7, 0, 1, 0, 0)
        + struct.pack("<IIIB", 1, 0, 0, 0)
        + b"d\x00"
        + b"LOAD DATA LOCAL INFILE '/tmp/x' INTO TABLE `t`"
    )
    records = frame(packet(ev.EXECUTE_LOAD_QUERY, body, 500))
    assert isinstance(records[0], TableChange) and records[0].tables == {"d.t"}
    assert isinstance(records[-1], Boundary)
