"""Compressed binlog events (`orchestrator.binlog.compressed`) without a server: a real
MariaDB compressed rows event, MariaDB's format and MySQL's TRANSACTION_PAYLOAD built by
hand from the format descriptions, and a fuzz of truncated and corrupt payloads (always a
`CorruptEvent` naming the position, never a hang, another exception or a silent skip)."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
import zstandard

from orchestrator.binlog import events as ev
from orchestrator.binlog.compressed import COMPRESSED, CorruptEvent, expand
from tests.unit.test_rowdecode import packet

# Captured from MariaDB 10.11 with log_bin_compress=ON, log_bin_compress_min_len=10, after
# INSERT INTO d.t (id INT PRIMARY KEY, v VARCHAR(200)) VALUES (1, REPEAT('a', 100)),
# (2, REPEAT('b', 31)): the file's format description and the WRITE_ROWS_COMPRESSED_V1.
MARIADB_FDE = bytes.fromhex(
    "00365d046b0f01000000fc000000000100000000040031302e31312e31392d4d6172696144422d302b6465"
    "62313275312d6c6f670000000000000000000000000000000000000000365d046b13380d00080012000404"
    "0404120000e400041a08000000080808020000000a0a0a0000000000000a0a0a00"
    + "00" * 118
    + "041304000d0808080a0a0a01e244ef1a"
)
MARIADB_WRITE = bytes.fromhex(
    "00365d046ba6010000003c0000007e030000000012000000000001000203818f789cfbc3c8c0c090924807f0"
    "870968937c127e00009e7d3441eeabff49"
)
ROWS = (
    b"\xfc"
    + struct.pack("<I", 1)
    + bytes([100])
    + b"a" * 100
    + b"\xfc"
    + struct.pack("<I", 2)
    + bytes([31])
    + b"b" * 31
)
FMT = ev.Format(checksum=4)


def test_a_real_mariadb_compressed_rows_event() -> None:
    fmt = ev.Format.parse(MARIADB_FDE)
    assert fmt.checksum == 4 and fmt.server_version.startswith("10.11.19-MariaDB")
    kind, end = ev.header(MARIADB_WRITE)
    (plain,) = expand(MARIADB_WRITE, fmt, kind, f"binlog.000001:{end}")
    assert ev.header(plain) == (ev.WRITE_ROWS_V1, end)  # the same position
    assert ev.has_checksum(plain) and int.from_bytes(plain[10:14], "little") == len(plain) - 1
    layout = ev.rows_layout(plain, fmt, ev.WRITE_ROWS_V1)
    assert layout.columns == 2 and layout.full
    assert plain[layout.start : layout.end] == ROWS
    assert plain[6:10] == MARIADB_WRITE[6:10] and plain[14:30] == MARIADB_WRITE[14:30]  # as it was


def mariadb_block(data: bytes, width: int = 0) -> bytes:
    """MariaDB's compressed block: header byte, big-endian length, zlib stream."""
    width = width or max(1, (len(data).bit_length() + 7) // 8)
    return bytes([0x80 | width]) + len(data).to_bytes(width, "big") + zlib.compress(data)


def rows_head(kind: int, columns: int = 2) -> bytes:
    """A rows event's table id, flags, (v2: extra data length), column count, bitmaps."""
    v2 = kind in (169, 170, 171)
    images = 2 if kind in (167, 170) else 1
    return (
        struct.pack("<IHH", 18, 0, 1)
        + (struct.pack("<H", 2) if v2 else b"")
        + bytes([columns])
        + b"\x03" * images
    )


PLAIN = {165: ev.QUERY, 166: 23, 167: 24, 168: 25, 169: 30, 170: 31, 171: 32}


@pytest.mark.parametrize("kind", sorted(PLAIN))
@pytest.mark.parametrize("checksum", [4, 0])
@pytest.mark.parametrize("size", [40, 300, 70_000])  # length in 1, 2 and 3 bytes
def test_mariadb_events_inflate_to_the_plain_event(kind: int, checksum: int, size: int) -> None:
    fmt = ev.Format(checksum=checksum)
    data = bytes(random.Random(size).randrange(8) for _ in range(size))
    if kind == ev.MARIADB_COMPRESSED_QUERY:
        head = struct.pack("<IIBHH", 7, 0, 4, 0, 3) + b"\x01\x02\x03" + b"shop\x00"
        data = b"INSERT INTO t VALUES ('" + data.hex().encode()[:size] + b"')"
    else:
        head = rows_head(kind)
    compressed = packet(kind, head + mariadb_block(data), 777, bool(checksum))
    (plain,) = expand(compressed, fmt, kind, "binlog.000003:777")
    assert plain == packet(PLAIN[kind], head + data, 777, bool(checksum))
    if kind == ev.MARIADB_COMPRESSED_QUERY:
        assert ev.query_event(plain, fmt) == ("shop", data.decode())


def test_mariadb_length_width_is_what_the_header_byte_says() -> None:
    head = rows_head(166)
    (plain,) = expand(packet(166, head + mariadb_block(b"xyz" * 5, width=4)), FMT, 166, "f:1")
    assert plain == packet(ev.WRITE_ROWS_V1, head + b"xyz" * 5)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"", "the compressed part is empty"),
        (b"\x01\x03" + zlib.compress(b"abc"), "bad compression header byte 0x01"),
        (b"\x80\x03" + zlib.compress(b"abc"), "bad compression header byte 0x80"),
        (b"\x91\x03" + zlib.compress(b"abc"), "unknown compression algorithm 1"),
        (b"\x82\x00", "the event ends inside the uncompressed length"),
        (b"\x81\x04" + zlib.compress(b"abc"), "3 bytes inflated where 4 were stated"),
        (b"\x81\x02" + zlib.compress(b"abc"), "3 bytes inflated where 2 were stated"),
        (b"\x81\x03" + zlib.compress(b"abc")[:-3], "the zlib stream is truncated"),
        (b"\x81\x03" + zlib.compress(b"abc") + b"!", "bytes after the end of the zlib stream"),
        (b"\x84\xff\xff\xff\xff" + zlib.compress(b"abc"), "an uncompressed length of 4294967295"),
    ],
)
def test_mariadb_bad_blocks_name_the_position(block: bytes, message: str) -> None:
    with pytest.raises(CorruptEvent) as failure:
        expand(packet(166, rows_head(166) + block, 4321), FMT, 166, "binlog.000007:4321")
    assert str(failure.value).startswith(
        "binlog.000007:4321 holds a compressed event (type 166) that does not decode: "
    )
    assert message in str(failure.value) and "re-snapshot" in str(failure.value)


# --------------------------------------------------------------------------- MySQL


def inner(kind: int, body: bytes, end: int = 0) -> bytes:
    """An event as a payload holds it: header and body, no checksum (no 0x00 byte)."""
    return struct.pack("<IBIIIH", 5, kind, 1, 19 + len(body), end, 0) + body


def lenenc(value: int) -> bytes:
    if value < 251:
        return bytes([value])
    if value < 1 << 16:
        return b"\xfc" + value.to_bytes(2, "little")
    if value < 1 << 24:
        return b"\xfd" + value.to_bytes(3, "little")
    return b"\xfe" + value.to_bytes(8, "little")


def field(kind: int, value: int) -> bytes:
    encoded = lenenc(value)
    return lenenc(kind) + lenenc(len(encoded)) + encoded


def payload_event(
    raw: bytes,
    *,
    compression: int = 0,
    end: int = 9000,
    extra: bytes = b"",
    stated: int | None = None,
    size: int | None = None,
    checksum: bool = True,
) -> bytes:
    """A TRANSACTION_PAYLOAD as MySQL writes it: compression type, uncompressed size,
    payload size, end mark (0), then the payload."""
    data = zstandard.ZstdCompressor().compress(raw) if compression == 0 else raw
    header = field(2, compression) + extra
    if compression != 255:
        header += field(3, len(raw) if stated is None else stated)
    header += field(1, len(data) if size is None else size) + b"\x00"
    return packet(ev.TRANSACTION_PAYLOAD, header + data, end, checksum)


TABLE_MAP_BODY = bytes.fromhex("120000000000010001640001740002030f02c80002")
TRANSACTION = [
    (ev.QUERY, struct.pack("<IIBHH", 7, 0, 1, 0, 0) + b"d\x00BEGIN"),
    (ev.TABLE_MAP, TABLE_MAP_BODY),
    (ev.WRITE_ROWS, struct.pack("<IHHH", 18, 0, 1, 2) + b"\x02\x03" + ROWS),
    (ev.UPDATE_ROWS, struct.pack("<IHHH", 18, 0, 1, 2) + b"\x02\x03\x03" + ROWS),
    (ev.XID, struct.pack("<Q", 99)),
]


@pytest.mark.parametrize("compression", [0, 255])
@pytest.mark.parametrize("checksum", [True, False])
def test_mysql_payload_is_its_events_at_the_payloads_position(
    compression: int, checksum: bool
) -> None:
    raw = b"".join(inner(kind, body, end=100 + i) for i, (kind, body) in enumerate(TRANSACTION))
    event = payload_event(raw, compression=compression, end=9000, checksum=checksum)
    fmt = ev.Format(checksum=4 * checksum)
    got = expand(event, fmt, ev.TRANSACTION_PAYLOAD, "binlog.000002:9000")
    # Each inner event becomes an ordinary stream packet: the payload's end as its next
    # position (a checkpoint at the XID is the payload's end), the file's checksum.
    expected = [
        b"\x00" + struct.pack("<IBIIIH", 5, kind, 1, 19 + len(body) + 4 * checksum, 9000, 0) + body
        for kind, body in TRANSACTION
    ]
    if checksum:
        expected = [p + zlib.crc32(p[1:]).to_bytes(4, "little") for p in expected]
    assert got == expected
    assert [ev.header(p) for p in got] == [(kind, 9000) for kind, _ in TRANSACTION]
    assert ev.query_event(got[0], fmt) == ("d", "BEGIN")
    assert ev.parse_table_map(got[1], fmt).name == "d.t"
    assert got[2][ev.rows_layout(got[2], fmt, ev.WRITE_ROWS).start :][: len(ROWS)] == ROWS


def test_mysql_payload_header_fields_in_any_order_unknown_skipped_sizes_lenencoded() -> None:
    body = b"x" * 300  # sizes above 250: two-byte length-encoded values
    raw = inner(ev.QUERY, struct.pack("<IIBHH", 7, 0, 1, 0, 0) + b"d\x00" + body)
    data = zstandard.ZstdCompressor().compress(raw)
    header = field(1, len(data)) + field(9, 123456) + field(3, len(raw)) + field(2, 0) + b"\x00"
    event = packet(ev.TRANSACTION_PAYLOAD, header + data, 500)
    (got,) = expand(event, FMT, ev.TRANSACTION_PAYLOAD, "f:500")
    assert ev.query_event(got, FMT) == ("d", "x" * 300)


def test_mysql_payload_of_several_zstd_frames() -> None:
    raw = b"".join(inner(kind, body) for kind, body in TRANSACTION)
    frames = b"".join(
        zstandard.ZstdCompressor().compress(raw[i : i + 50]) for i in range(0, len(raw), 50)
    )
    header = field(2, 0) + field(3, len(raw)) + field(1, len(frames)) + b"\x00"
    got = expand(
        packet(ev.TRANSACTION_PAYLOAD, header + frames, 77), FMT, ev.TRANSACTION_PAYLOAD, "f:77"
    )
    assert [ev.header(p)[0] for p in got] == [kind for kind, _ in TRANSACTION]


RAW = b"".join(inner(kind, body) for kind, body in TRANSACTION)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (payload_event(RAW, compression=1), "unknown compression type 1"),
        (
            payload_event(RAW, stated=len(RAW) - 1),
            f"more than {len(RAW)} bytes decompressed where {len(RAW) - 1} were stated",
        ),
        (payload_event(RAW, stated=len(RAW) + 1), f"{len(RAW)} bytes decompressed where"),
        (payload_event(RAW, size=10_000), "a payload of 10000 bytes but"),
        (packet(ev.TRANSACTION_PAYLOAD, field(2, 0) + field(3, 5)), "no end mark"),
        (packet(ev.TRANSACTION_PAYLOAD, field(2, 0) + b"\x00" + b"abc"), "lacks the payload size"),
        (payload_event(RAW[:-3], compression=255), "claims"),
        (payload_event(RAW + b"\x00" * 7, compression=255), "ends inside an event header"),
        (payload_event(b"", compression=255), "holds no event"),
        (
            payload_event(inner(ev.TRANSACTION_PAYLOAD, b"\x00"), compression=255),
            "an event of type 40 inside the payload",
        ),
        (payload_event(inner(166, b"\x00" * 12), compression=255), "an event of type 166 inside"),
    ],
)
def test_mysql_bad_payloads_name_the_position(event: bytes, message: str) -> None:
    with pytest.raises(CorruptEvent) as failure:
        expand(event, FMT, ev.TRANSACTION_PAYLOAD, "binlog.000009:9000")
    text = str(failure.value)
    assert text.startswith(
        "binlog.000009:9000 holds a compressed transaction payload (type 40) that does not decode: "
    )
    assert message in text


# --------------------------------------------------------------------------- fuzz


def fuzz_cases() -> list[tuple[int, bytes]]:
    """Valid compressed events of every kind, to truncate and corrupt."""
    cases = [
        (ev.TRANSACTION_PAYLOAD, payload_event(RAW)),
        (ev.TRANSACTION_PAYLOAD, payload_event(RAW, compression=255)),
        (166, MARIADB_WRITE),
    ]
    for kind in sorted(PLAIN):
        head = struct.pack("<IIBHH", 7, 0, 1, 0, 0) + b"d\x00" if kind == 165 else rows_head(kind)
        cases.append((kind, packet(kind, head + mariadb_block(ROWS))))
    return cases


def outcome(event: bytes, kind: int) -> list[bytes] | None:
    """The decoded events, or None for a `CorruptEvent` naming the position; anything else
    (another exception, a hang) fails the test."""
    try:
        return expand(event, FMT, kind, "binlog.000005:31337")
    except CorruptEvent as exc:
        assert str(exc).startswith("binlog.000005:31337 holds a compressed ")
        return None


@pytest.mark.parametrize(("kind", "event"), fuzz_cases())
def test_fuzz_truncated_payloads_never_hang_or_pass_silently(kind: int, event: bytes) -> None:
    """Every truncation of the event (its checksum cut off too) is a clear error."""
    assert outcome(event, kind) is not None
    body = event[:-4]
    for cut in range(ev.BODY, len(body)):
        truncated = body[:cut] + zlib.crc32(body[1:cut]).to_bytes(4, "little")
        assert outcome(truncated, kind) is None, cut


@pytest.mark.parametrize(("kind", "event"), fuzz_cases())
def test_fuzz_corrupt_payloads_error_or_decode_never_crash(kind: int, event: bytes) -> None:
    """Random byte flips and garbage: a `CorruptEvent`, or (a flip outside the checked
    parts, e.g. in a table id) events that still frame; never another exception."""
    rng = random.Random(kind)
    for _ in range(1500):
        damaged = bytearray(event)
        for _ in range(rng.choice((1, 1, 2, 5))):
            damaged[rng.randrange(ev.BODY, len(event) - 4)] = rng.randrange(256)
        result = outcome(bytes(damaged), kind)
        if result is not None:
            assert all(ev.header(p)[1] == ev.header(event)[1] for p in result)
    for size in (0, 1, 7, 64, 1000):  # garbage after the header
        outcome(event[: ev.BODY] + rng.randbytes(size) + b"\x00" * 4, kind)


def test_every_compressed_type_is_expanded() -> None:
    assert frozenset(PLAIN) | {ev.TRANSACTION_PAYLOAD} == COMPRESSED
