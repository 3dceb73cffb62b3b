"""Text in the server's non-Unicode character sets, decoded from the binlog as the server
decodes it for a client.

A snapshot reads text through the server, which converts each value to utf8mb4 with its own
character set tables; the binlog holds the stored bytes, which a run decodes itself. Python's
codecs do not agree with those tables. On MariaDB 10.11, of the strings of one and two bytes a
column can hold: euckr's 8,822 Unified Hangul characters beyond KS X 1001 (``0x8141`` is 갂
to the server, two characters to Python's ``euc_kr``), sjis' and ujis' fullwidth backslash
(``0x815F`` is ``\\``), big5, gbk, gb2312, eucjpms and cp932 by hundreds; greek's ``0xA1``
(U+02BD against U+2018), hebrew's ``0xAF``, koi8u's ``0x95``, cp866's ``0xFC`` and ``0xFD``; bytes
cp1256 and tis620 leave unassigned. A row changed through the binlog would have been published
with other text than the snapshot's rows, and than the source's.

So no Python codec decodes them. A run whose tables hold text in such a set asks the server,
once a process, how it converts every string of one and two bytes of it (three, after a lead
byte of a three-byte character: ujis, eucjpms) to utf8mb4 (`load`), and decodes the binlog's
bytes with that (`decoder`): byte by byte where a set has one byte a character, else by the
characters the answers delimit. Each decoder is checked against every answer it was built from
before it is used; a set it cannot reproduce fails the tables using it, naming the set.
Unicode sets (utf8mb4, utf8mb3, utf16, utf16le, utf32, ucs2) are decoded by Python's codecs:
the server refuses to store ill-formed Unicode, and well-formed Unicode has one reading.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.schema.families import TEXT_TYPES
from orchestrator.schema.tables import TableInfo

#: Unicode character sets: Python's codec, as `orchestrator.schema.values.text_decoder` names it.
UNICODE = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
}

Decode = Callable[[bytes], str]
#: The server's utf8mb4 text of strings of bytes.
Answers = dict[bytes, str]


class Server(Protocol):
    """What `load` asks: `orchestrator.source.connection.Source` has it."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[Any]: ...


class CharsetError(ValueError):
    """A character set Tidemark cannot decode from the binlog as the server does."""


def from_server(charset: str | None) -> bool:
    """Whether text in ``charset`` is decoded with the server's answers (`load`): every set but
    the Unicode ones, ``binary``, and the two built in (`BUILT_IN`).

    >>> [from_server(c) for c in ("utf8mb4", "latin1", "sjis", None, "binary", "greek")]
    [False, False, True, False, False, True]
    """
    name = (charset or "utf8mb4").lower()
    return name not in UNICODE and name != "binary" and name not in BUILT_IN


def _by_byte(text_of: Callable[[int], str]) -> Decode:
    table = str.maketrans({chr(b): text_of(b) for b in range(256) if text_of(b) != chr(b)})
    return lambda raw: raw.decode("latin-1").translate(table)


def _cp1252(byte: int) -> str:
    try:
        return bytes([byte]).decode("cp1252")
    except UnicodeDecodeError:  # the five bytes cp1252 leaves undefined
        return chr(byte)


#: Sets whose reading every MySQL and MariaDB server shares, built in (no question asked):
#: latin1 is cp1252 with its five undefined bytes the C1 controls; ascii is ASCII, any other byte
#: ``?``. Both gave the server's answer for every string of one and two bytes (MariaDB 10.11;
#: tests/integration/test_charsets.py asks again).
BUILT_IN: dict[str, Decode] = {
    "latin1": _by_byte(_cp1252),
    "ascii": _by_byte(lambda b: chr(b) if b < 0x80 else "?"),
}


def used_by(tables: Iterable[TableInfo]) -> set[str]:
    """The character sets of the tables' text columns that `load` must read from the server."""
    return {
        (c.charset or "").lower()
        for t in tables
        for c in t.columns
        if c.charset
        and (c.data_type in TEXT_TYPES or c.data_type == "json")
        and from_server(c.charset)
    }


_loaded: dict[str, Decode] = {}
_failed: dict[str, str] = {}  # why `load` could not build a set's decoder
_lock = threading.Lock()


def decoder(charset: str) -> Decode:
    """The decoder `load` built for ``charset``.

    Raises:
        CharsetError: it was not loaded in this process.
    """
    found = BUILT_IN.get(charset.lower()) or _loaded.get(charset.lower())
    if found is None and charset.lower() in _failed:
        raise CharsetError(_failed[charset.lower()])
    if found is None:
        raise CharsetError(
            f"internal: character set {charset} was not read from the server in this process "
            "(orchestrator.schema.charsets.load)"
        )
    return found


_ascii: set[str] = set()


def ascii_compatible(charset: str) -> bool:
    """Whether the server reads every byte below 0x80 of ``charset`` as that ASCII character,
    alone and before any byte below 0x80 (a set built in or loaded): a string of such bytes is
    its ASCII text."""
    name = charset.lower()
    return name in BUILT_IN or name in _ascii


def missing(charsets: Iterable[str]) -> set[str]:
    """Those of ``charsets`` that `load` has not asked the server about in this process."""
    return {c.lower() for c in charsets if from_server(c)} - _loaded.keys() - _failed.keys()


def load(server: Server, charsets: Iterable[str]) -> dict[str, str]:
    """Build the decoders of ``charsets`` not built yet from the server's answers. Returns the
    sets it could not decode, each with why: `decoder` raises it, so a table with text in such a
    set fails at its first rows event, alone."""
    wanted = {c.lower() for c in charsets}
    for charset in sorted(missing(wanted)):
        try:
            built = _build(server, charset)
        except CharsetError as exc:
            with _lock:
                _failed[charset] = str(exc)
            continue
        with _lock:
            _loaded[charset] = built.decode
            if built.ascii:
                _ascii.add(charset)
    return {c: _failed[c] for c in wanted if c in _failed}


# --------------------------------------------------------------------------- asking the server

_NAME = re.compile(r"[a-z0-9_]+")
#: The numbers 0-15, as a derived table: strings of bytes made without a table of the source.
_NIBBLE = "(" + " UNION ALL ".join(f"SELECT {n} AS n" for n in range(16)) + ")"


def _answers(server: Server, charset: str, prefix: bytes, width: int) -> dict[bytes, str]:
    """The server's utf8mb4 text of every string of ``prefix`` and ``width`` more bytes read in
    ``charset``."""
    names = [f"n{i}" for i in range(2 * width)]
    hexes = ", ".join(f"HEX({n}.n)" for n in names)
    raw = f"UNHEX(CONCAT('{prefix.hex()}', {hexes}))"
    sql = (
        f"SELECT HEX({raw}), HEX(CONVERT(CONVERT({raw} USING {charset}) USING utf8mb4)) FROM "
        + ", ".join(f"{_NIBBLE} AS {n}" for n in names)
    )
    return {
        bytes.fromhex(str(given)): bytes.fromhex(str(text or "")).decode("utf-8")
        for given, text in server.query(sql)
    }


@dataclass(frozen=True, slots=True)
class _Tables:
    """What the server answered: every byte alone, every pair, and every three bytes after a
    lead byte whose characters are three bytes long."""

    one: dict[bytes, str]
    two: dict[bytes, str]
    three: dict[bytes, str]


@dataclass(frozen=True, slots=True)
class _Built:
    decode: Decode
    ascii: bool  # `ascii_compatible`


def _build(server: Server, charset: str) -> _Built:
    if not _NAME.fullmatch(charset):
        raise CharsetError(f"character set {charset!r} is not a character set name")
    rows = server.query(
        "SELECT MAXLEN FROM information_schema.CHARACTER_SETS WHERE CHARACTER_SET_NAME = %s",
        (charset,),
    )
    if not rows:
        raise CharsetError(f"the server has no character set {charset}")
    longest = int(rows[0][0])
    if longest > 3:
        raise CharsetError(
            f"character set {charset} has characters of {longest} bytes, which Tidemark does not "
            "decode from the binlog; convert the column to utf8mb4"
        )
    one = _answers(server, charset, b"", 1)
    ascii_ = all(one[bytes([b])] == chr(b) for b in range(128))
    if longest == 1:
        return _Built(
            _checked(charset, _by_byte(lambda b: one[bytes([b])]), _Tables(one, {}, {})), ascii_
        )
    two = _answers(server, charset, b"", 2)
    three: dict[bytes, str] = {}
    if longest == 3:
        for lead in _three_byte_leads(server, charset, one, two):
            three.update(_answers(server, charset, bytes([lead]), 2))
    tables = _Tables(one, two, three)
    ascii_ = ascii_ and all(
        two[bytes([a, b])] == chr(a) + chr(b) for a in range(128) for b in range(128)
    )
    return _Built(_checked(charset, _multibyte(tables, ascii_), tables), ascii_)


def _three_byte_leads(server: Server, charset: str, one: Answers, two: Answers) -> list[int]:
    """The bytes that begin characters of three bytes: those the server reads, with two bytes
    after them, as one character that neither the lead's pair nor the pair after it is. Asked
    of every lead byte from 0x80, with every second byte from 0xA1 and a spread of third ones
    (ujis' and eucjpms' only such lead, 0x8F, takes 0xA1-0xFE after it)."""
    leads = "(" + " UNION ALL ".join(f"SELECT {n} AS n" for n in range(0x80, 0x100)) + ")"
    seconds = "(" + " UNION ALL ".join(f"SELECT {n} AS n" for n in range(0xA1, 0xFF)) + ")"
    thirds = "(" + " UNION ALL ".join(f"SELECT {n} AS n" for n in _THIRDS) + ")"
    raw = "UNHEX(CONCAT(HEX(l.n), HEX(s.n), HEX(t.n)))"
    sql = (
        f"SELECT HEX({raw}), HEX(CONVERT(CONVERT({raw} USING {charset}) USING utf8mb4)) "
        f"FROM {leads} AS l, {seconds} AS s, {thirds} AS t"
    )
    found = set()
    for given, text in server.query(sql):
        b = bytes.fromhex(str(given))
        read = bytes.fromhex(str(text or "")).decode("utf-8")
        if (
            _one_character(read)
            and read != two[b[:2]] + one[b[2:]]
            and read != one[b[:1]] + two[b[1:]]
        ):
            found.add(b[0])
    return sorted(found)


#: Third bytes `_three_byte_leads` tries.
_THIRDS = (0xA1, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0, 0xFE)


def _one_character(text: str) -> bool:
    return len(text) == 1 and text != "?"


def _multibyte(tables: _Tables, ascii_: bool) -> Decode:
    """A decoder of characters of one to three bytes, from the server's answers: at each byte,
    the answer for it and the bytes after it says what it reads and how far."""

    def pair_only(raw: bytes) -> str:  # at most two bytes, as the server answered them
        return tables.two[raw] if len(raw) == 2 else tables.one[raw] if raw else ""

    steps: dict[bytes, tuple[str, int]] = {}
    for raw, text in tables.two.items():
        steps[raw] = (text, 2)
        if text == tables.one[raw[:1]] + tables.one[raw[1:]]:
            steps[raw] = (tables.one[raw[:1]], 1)
    leads3 = {raw[0] for raw in tables.three}
    for raw, text in tables.three.items():
        first = tables.one[raw[:1]]
        if text == first + pair_only(raw[1:]):
            steps[raw] = (first, 1)
        elif text == tables.two[raw[:2]] + tables.one[raw[2:]] and steps[raw[:2]][1] == 2:
            steps[raw] = (steps[raw[:2]][0], 2)
        else:
            steps[raw] = (text, 3)

    def decode(raw: bytes) -> str:
        if ascii_ and raw.isascii():
            return raw.decode("ascii")
        out: list[str] = []
        i, n = 0, len(raw)
        while i < n:
            lead = raw[i]
            width = 3 if lead in leads3 else 2
            piece = raw[i : i + width]
            if len(piece) < width:  # the string ends inside a character: as the server answered
                out.append(pair_only(piece))
                break
            text, used = steps[piece]
            out.append(text)
            i += used
        return "".join(out)

    return decode


def _checked(charset: str, decode: Decode, tables: _Tables) -> Decode:
    """``decode``, once it gives the server's answer for every string the server was asked."""
    for answers in (tables.one, tables.two, tables.three):
        for raw, text in answers.items():
            if decode(raw) != text:
                raise CharsetError(
                    f"character set {charset}: Tidemark cannot decode it from the binlog as the "
                    f"server does (0x{raw.hex()}: {text!r}); convert the column to utf8mb4"
                )
    return decode
