"""Positions carry their server and GTID set (docs/output.md, "Positions"); those stored before they
did still load; positions of two servers never order by offset."""

from __future__ import annotations

import pytest

from orchestrator.errors import SourceChanged
from orchestrator.positions import BinlogPosition, ServerIdentity

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "4f22ab58-82db-22f2-af44-d91bb0530673"


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({"file": "binlog.000003", "pos": 4567}, BinlogPosition("binlog.000003", 4567)),
        (
            {"file": "binlog.000003", "pos": 4567, "row": 2, "gtid_set": None},
            BinlogPosition("binlog.000003", 4567, 2),
        ),
        (
            {"file": "binlog.000003", "pos": "4567", "row": 0, "gtid_set": ""},
            BinlogPosition("binlog.000003", 4567),
        ),
        (
            {"file": "b.000001", "pos": 4, "gtid_set": "0-1-9"},
            BinlogPosition("b.000001", 4, gtid_set="0-1-9"),
        ),
    ],
)
def test_positions_stored_before_they_carried_their_server_load(
    stored: dict[str, object], expected: BinlogPosition
) -> None:
    loaded = BinlogPosition.from_json(stored)  # type: ignore[arg-type]
    assert (loaded, loaded.gtid_set, loaded.server_id, loaded.server_uuid, loaded.server) == (
        expected,
        expected.gtid_set,
        None,
        None,
        None,
    )


def test_a_position_round_trips_with_its_server_and_gtid_set() -> None:
    position = BinlogPosition(
        "binlog.000009", 77, 3, gtid_set=f"{UUID_A}:1-40", server_id=7, server_uuid=UUID_A
    )
    data = position.to_json()
    assert data == {
        "file": "binlog.000009",
        "pos": 77,
        "row": 3,
        "gtid_set": f"{UUID_A}:1-40",
        "server_id": 7,
        "server_uuid": UUID_A,
    }
    again = BinlogPosition.from_json(data)
    assert (again.to_json(), again.server) == (data, ServerIdentity(7, UUID_A))


def test_positions_of_two_servers_never_order_by_offset() -> None:
    one, two = ServerIdentity(1), ServerIdentity(2)
    early, late = BinlogPosition("binlog.000001", 400), BinlogPosition("binlog.000002", 4)
    assert early.on(one, None) < late.on(one, "0-1-5")  # one server: by file and offset
    assert early < late.on(two, None)  # an old position does not say: as before
    for compare in (
        lambda a, b: a < b,
        lambda a, b: a <= b,
        lambda a, b: a > b,
        lambda a, b: a >= b,
    ):
        with pytest.raises(
            SourceChanged,
            match=r"server_id 1.*server_id 2.*goes on from the published positions by GTID",
        ):
            compare(early.on(one, None), late.on(two, None))
    # MySQL: the uuid decides (a cloned server may keep its server_id)
    with pytest.raises(SourceChanged):
        _ = early.on(ServerIdentity(1, UUID_A), None) < late.on(ServerIdentity(1, UUID_B), None)
    assert early.on(ServerIdentity(1, UUID_A), None) < late.on(
        ServerIdentity(1, UUID_A.upper()), None
    )


def test_a_server_knows_its_own_positions() -> None:
    mysql = ServerIdentity(5, UUID_A)
    assert mysql.wrote(BinlogPosition("b.000001", 4, server_id=5, server_uuid=UUID_A)) is True
    assert mysql.wrote(BinlogPosition("b.000001", 4, server_id=5, server_uuid=UUID_B)) is False
    assert mysql.wrote(BinlogPosition("b.000001", 4, server_id=6)) is False
    assert mysql.wrote(BinlogPosition("b.000001", 4)) is None
