"""MariaDB's INET4, INET6 and UUID: values the server keeps in 4 or 16 bytes and prints as text.

Tidemark publishes them as the text a read of the column gives (docs/types.md): a snapshot
reads it from the server, and a change from the binlog is printed here the same way, from the
bytes the binlog holds. Those are the address's bytes (INET4, INET6) and the UUID's bytes in
the order of its text: the server stores some UUIDs with their groups swapped so that they
sort by time, but logs every UUID unswapped (MariaDB's ``sql_type_uuid.h``, ``pack``), and
prints it from that form. Like a BINARY column's, the logged bytes lose their trailing zero
bytes; `text_of` puts them back.

No key of these types is ordered in Python: the server orders UUIDs by their stored form, so
chunk boundaries are compared in the database, as text keys are (``chunking.keys``).
"""

from __future__ import annotations

from collections.abc import Callable

#: DATA_TYPE -> the bytes of a value.
SIZES = {"inet4": 4, "inet6": 16, "uuid": 16}


def inet4_text(raw: bytes) -> str:
    """An IPv4 address in dotted decimal.

    >>> inet4_text(bytes([10, 0, 0, 255]))
    '10.0.0.255'
    """
    return ".".join(str(byte) for byte in raw)


def _longest_zero_run(words: list[int]) -> tuple[int, int]:
    """(start, length) of the first longest run of zero words; (-1, 0) when none is zero."""
    best, start = (-1, 0), -1
    for i, word in enumerate([*words, 1]):  # a sentinel closes a run at the end
        if word == 0 and start < 0:
            start = i
        elif word != 0 and start >= 0:
            if i - start > best[1]:
                best = (start, i - start)
            start = -1
    return best


def inet6_text(raw: bytes) -> str:
    """An IPv6 address as MariaDB prints it: lower-case hex words without leading zeros, the
    first longest run of zero words (even a single one) as ``::``, and an IPv4-compatible or
    IPv4-mapped address with its last 32 bits in dotted decimal. (Python's ``ipaddress``
    leaves a single zero word, and prints a mapped address in hex.)

    >>> [inet6_text(bytes.fromhex(h)) for h in (
    ...     "00000000000000000000000000000000", "00000000000000000000000000000001",
    ...     "00000000000000000000ffff01020304", "00000000000000000000000001020304",
    ...     "00010000000200030004000500060007", "00010000000000010000000000000000")]
    ['::', '::1', '::ffff:1.2.3.4', '::1.2.3.4', '1::2:3:4:5:6:7', '1:0:0:1::']
    """
    words = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, 16, 2)]
    gap, length = _longest_zero_run(words)
    if gap == 0 and (length == 6 or (length == 5 and words[5] == 0xFFFF)):
        return ("::" if length == 6 else "::ffff:") + inet4_text(raw[12:])
    if gap < 0:
        return ":".join(f"{w:x}" for w in words)
    head = ":".join(f"{w:x}" for w in words[:gap])
    tail = ":".join(f"{w:x}" for w in words[gap + length :])
    return f"{head}::{tail}"


def uuid_text(raw: bytes) -> str:
    """A UUID in its 8-4-4-4-12 lower-case hex form.

    >>> uuid_text(bytes.fromhex("0123456789ABCDEF0123456789ABCDEF"))
    '01234567-89ab-cdef-0123-456789abcdef'
    """
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_PRINTERS = {"inet4": inet4_text, "inet6": inet6_text, "uuid": uuid_text}


def text_of(data_type: str) -> Callable[[bytes], str]:
    """The function printing a value of ``data_type`` (``inet4``, ``inet6``, ``uuid``) from
    its bytes in the binlog.

    >>> text_of("uuid")(bytes.fromhex("00000000000000000000000000000001"))
    '00000000-0000-0000-0000-000000000001'
    >>> text_of("inet4")(bytes([10]))  # the binlog's 10.0.0.0, its zero bytes dropped
    '10.0.0.0'
    """
    size, printer = SIZES[data_type], _PRINTERS[data_type]

    def text(raw: bytes) -> str:
        if len(raw) > size:
            raise ValueError(f"a {data_type.upper()} value of {len(raw)} bytes: {size} expected")
        return printer(raw.ljust(size, b"\0"))

    return text
