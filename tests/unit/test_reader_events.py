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
from orchestrator.schema.tables import TableInfo
from tests.unit.test_rowdecode import col, packet

START = BinlogPosition("binlog.000001", 4)


def frame(
    *events: bytes,
    tables: tuple[str, ...] = ("d.t", "d.u"),
    infos: dict[str, TableInfo] | None = None,
) -> list[object]:
    reader = EventReader(
        SourceConfig(host="h", user="u", server_id=9), "", START, infos or dict.fromkeys(tables)
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


#: ``d.t (id INT, v VARCHAR(50) utf8mb4)`` and a TABLE_MAP of it as table id 0x12 (MINIMAL
#: metadata: types only), for rows events of a chosen table.
T_INFO = TableInfo(
    "d", "t", (col("id", "int(11)"), col("v", "varchar(50)", "utf8mb4")), ("id",), (), 0
)
T_MAP = packet(ev.TABLE_MAP, bytes.fromhex("120000000000010001640001740002030f02c80002"), 600)


def rows_event(kind: int, table_id: int, bitmap: bytes, end: int) -> bytes:
    """A v2 rows event of two columns with one (unread) row image after its bitmaps."""
    images = 2 if kind == ev.UPDATE_ROWS else 1
    head = table_id.to_bytes(6, "little") + struct.pack("<HH", 0, 2) + b"\x02"
    return packet(kind, head + bitmap * images + b"\x00\x01\x00\x00\x00\x00", end)


@pytest.mark.parametrize("kind", [ev.WRITE_ROWS, ev.UPDATE_ROWS, ev.DELETE_ROWS])
def test_rows_without_every_column_read_their_table_again(kind: int) -> None:
    """binlog_row_image MINIMAL or NOBLOB in a session: an image without every column is not
    the row's state; the table is re-read from the event (never a failed run, never applied)."""
    full, partial = frame(
        T_MAP,
        rows_event(kind, 0x12, b"\x03", 700),
        rows_event(kind, 0x12, b"\x01", 800),
        infos={"d.t": T_INFO},
    )
    assert not isinstance(full, TableChange) and full.table == "d.t"  # type: ignore[attr-defined]
    assert isinstance(partial, TableChange) and partial.tables == {"d.t"}
    assert partial.end == 800 and "without full row images" in partial.what


def test_a_partial_json_update_reads_its_table_again_and_passes_other_tables() -> None:
    """MySQL's PARTIAL_UPDATE_ROWS (binlog_row_value_options=PARTIAL_JSON): the chosen table is
    re-read from it; one of a table the run does not keep is skipped like its other rows."""
    other_map = packet(
        ev.TABLE_MAP, bytes.fromhex("130000000000010001640001780002030f02c80002"), 650
    )
    records = frame(
        T_MAP,
        other_map,
        rows_event(ev.PARTIAL_UPDATE_ROWS, 0x13, b"\x03", 700),
        rows_event(ev.PARTIAL_UPDATE_ROWS, 0x12, b"\x03", 800),
        infos={"d.t": T_INFO},
    )
    (change,) = records
    assert isinstance(change, TableChange) and change.tables == {"d.t"} and change.end == 800
    assert "partial JSON" in change.what and "binlog_row_value_options" in change.what
