"""What a QUERY event's statement does to the run's tables: the `Statement` that
`orchestrator.binlog.statement_parser.classify` makes of it (by sqlglot's MySQL parser, in
a module of its own: sqlglot takes 70 ms to import, paid only by a capture that meets a
QUERY event other than BEGIN/COMMIT).

A QUERY event carries SQL text and the session's default database. Row changes
of ``binlog_format=ROW`` sessions come as rows events; a QUERY event holds a
transaction's ``BEGIN``/``COMMIT``, DDL, ``TRUNCATE``, XA statements, and the
DML of sessions logging in STATEMENT (or MIXED) format. Its kinds:

* ``begin``/``commit``/``rollback`` - transaction framing;
* ``truncate`` - every row of the named tables is deleted at that position;
* ``ddl`` - CREATE/DROP/RENAME/ALTER (and CREATE/DROP INDEX) of the named tables,
  ``DROP DATABASE`` of every table of the named databases; an account statement (CREATE USER,
  GRANT, SET PASSWORD...) of the ``mysql`` tables it writes, whatever names it mentions;
* ``dml`` - INSERT/UPDATE/DELETE/REPLACE/LOAD DATA logged as a statement;
* ``xa`` - ``XA START/END/PREPARE/COMMIT/ROLLBACK`` with the transaction's xid;
* ``other`` - nothing a table's rows depend on (SET, OPTIMIZE, CREATE DATABASE...).

A statement whose effect cannot be told from its text has ``everything`` set and touches
every table: a function call logged as ``SELECT f()`` or ``DO f()`` (a stored function
that writes), ``CALL``, and ``ROLLBACK TO SAVEPOINT`` (logged when a transaction also wrote
a non-transactional table: the rows events it undoes are in the binlog before it). Every run
table is then re-read. ``SET STATEMENT ... FOR s`` and ``ANALYZE s`` are classified as ``s``.

A statement sqlglot cannot parse is ``ddl`` with ``parsed=False``, naming every
name it mentions: the caller re-reads any run table among them rather than
skip something it does not understand. Names are ``database.table``, qualified
with the default database where the statement leaves it out, and lower-cased
when the server's ``lower_case_table_names`` is not 0 (the binlog then names
tables in lower case whatever the statement wrote).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["begin", "commit", "rollback", "truncate", "ddl", "dml", "xa", "other"]
XaVerb = Literal["START", "END", "PREPARE", "COMMIT", "ROLLBACK", "RECOVER"]


@dataclass(frozen=True, slots=True)
class Xid:
    """An XA transaction id: ``gtrid``, ``bqual`` and ``formatID``."""

    gtrid: bytes
    bqual: bytes = b""
    format_id: int = 1


@dataclass(frozen=True, slots=True)
class Statement:
    """A classified statement.

    Attributes:
        kind: what it does (see the module docstring).
        tables: the ``database.table`` names whose rows or shape it changes.
        databases: databases it drops whole (every table in them is affected).
        parsed: False when sqlglot could not parse it: ``tables`` then holds every name
            the statement mentions, qualified with the default database where bare.
        xa: for ``xa``: the verb and the xid (None for ``XA RECOVER``).
        one_phase: ``XA COMMIT ... ONE PHASE``.
        everything: it may have changed any table (see the module docstring).
    """

    kind: Kind
    tables: frozenset[str] = frozenset()
    databases: frozenset[str] = frozenset()
    parsed: bool = True
    xa: tuple[XaVerb, Xid | None] | None = None
    one_phase: bool = False
    everything: bool = False

    def touches(self, table: str) -> bool:
        """Whether the statement changes ``database.table`` (as `classify` folded it)."""
        return self.everything or table in self.tables or table.split(".", 1)[0] in self.databases


def fold(name: str, lower_case_table_names: int) -> str:
    """A table or database name as the server compares it.

    >>> fold("Shop.Orders", 1), fold("Shop.Orders", 0)
    ('shop.orders', 'Shop.Orders')
    """
    return name.lower() if lower_case_table_names else name


#: The parts of a statement's text `redacted` tells apart: a backquoted identifier, a comment,
#: a string in single or double quotes (backslash escapes or not), each possibly cut short.
_IDENTIFIER = r"`(?:[^`]|``)*`?"
_COMMENT = r"/\*.*?(?:\*/|$)|(?:--[ \t\n]|#)[^\n]*"
_ESCAPED = r"'(?:\\.|''|[^'\\])*'?"
_ESCAPED_DOUBLE = r'"(?:\\.|""|[^"\\])*"?'
_PLAIN = r"'(?:''|[^'])*'?"
_PLAIN_DOUBLE = r'"(?:""|[^"])*"?'


def _lexemes(ansi_quotes: bool, backslash_escapes: bool) -> re.Pattern[str]:
    """What `redacted` keeps (a name) or hides (a comment, a string) in a session of that mode:
    with ANSI_QUOTES a double-quoted text is a name."""
    single, double = (_ESCAPED, _ESCAPED_DOUBLE) if backslash_escapes else (_PLAIN, _PLAIN_DOUBLE)
    names, strings = (
        (f"{_IDENTIFIER}|{double}", single) if ansi_quotes else (_IDENTIFIER, f"{single}|{double}")
    )
    return re.compile(f"(?P<keep>{names})|(?P<comment>{_COMMENT})|(?P<string>{strings})", re.DOTALL)


#: By (ANSI_QUOTES, backslash escapes).
_LEXEMES = {(a, e): _lexemes(a, e) for a in (False, True) for e in (False, True)}
#: MySQL's executable comments (``/*!50001 ... */``, MariaDB's ``/*M!100100 ... */``): SQL the
#: server runs, shown as such.
EXECUTABLE_COMMENT = re.compile(r"/\*M?!\d*(.*?)\*/", re.DOTALL)
#: What `redacted` puts in place of a string literal and of a comment.
HIDDEN_STRING, HIDDEN_COMMENT = "'***'", "/* *** */"


def redacted(sql: str, *, ansi_quotes: bool = False, backslash_escapes: bool = True) -> str:
    """``sql`` on one line with every string literal and comment hidden, as a statement read from
    the binlog is shown in logs, re-read reasons and status: a statement's literals are data, and
    an account statement's are passwords (``IDENTIFIED BY '...'``). Names stay. ``ansi_quotes``
    and ``backslash_escapes``: the session's ``sql_mode``, as `classify` takes them.

    >>> redacted("CREATE USER 'bob'@'%' IDENTIFIED BY 'it''s secret'")
    "CREATE USER '***'@'***' IDENTIFIED BY '***'"
    >>> redacted("UPDATE `it's` SET v = 'x' /* don't */ WHERE id = 1 -- 'y")
    "UPDATE `it's` SET v = '***' /* *** */ WHERE id = 1 /* *** */"
    >>> redacted("/*!40000 ALTER TABLE `t` DISABLE KEYS */")
    'ALTER TABLE `t` DISABLE KEYS'
    """

    def hide(found: re.Match[str]) -> str:
        if found.group("keep") is not None:
            return found.group(0)
        return HIDDEN_COMMENT if found.group("comment") is not None else HIDDEN_STRING

    shown = _LEXEMES[ansi_quotes, backslash_escapes].sub(hide, EXECUTABLE_COMMENT.sub(r" \1 ", sql))
    return " ".join(shown.split())
