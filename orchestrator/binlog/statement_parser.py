"""`classify`: a QUERY event's statement -> `orchestrator.binlog.statements.Statement`, by
sqlglot's MySQL tokenizer and parser (the kinds and rules are described there).

A module of its own so that sqlglot (70 ms to import) is imported only when a capture
meets a QUERY event other than BEGIN/COMMIT, not by every run that imports the reader.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import ClassVar

import sqlglot
from sqlglot import exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from orchestrator.binlog.statements import EXECUTABLE_COMMENT, Kind, Statement, Xid, fold

#: Statements logged as commands that never change a table's rows.
_HARMLESS = frozenset(
    {
        "ANALYZE",
        "OPTIMIZE",
        "FLUSH",
        "SAVEPOINT",
        "RELEASE",
        "SET",
        "CHECK",
        "CHECKSUM",
        "INSTALL",
        "UNINSTALL",
        "SHOW",
        "KILL",
    }
)
#: The ``mysql`` tables that account statements change (CREATE, ALTER, DROP or RENAME USER or
#: ROLE, GRANT, REVOKE, SET PASSWORD, SET DEFAULT ROLE): the server logs the statement, never
#: rows events. Such a statement changes no other table, whatever names it mentions.
ACCOUNT_TABLES = frozenset(
    {
        "mysql.global_priv",
        "mysql.user",
        "mysql.db",
        "mysql.tables_priv",
        "mysql.columns_priv",
        "mysql.procs_priv",
        "mysql.proxies_priv",
        "mysql.roles_mapping",
    }
)
#: The table CREATE, ALTER and DROP SERVER change.
SERVER_TABLES = frozenset({"mysql.servers"})
#: The words between CREATE/ALTER/DROP/RENAME and what the statement creates or changes.
_OPTION_WORDS = frozenset({"OR", "REPLACE", "IF", "NOT", "EXISTS"})
#: Statements logged for their side effects, which the text does not name: a stored function's
#: writes (``SELECT f()``, ``DO f()``), a procedure's.
_OPAQUE = frozenset({"SELECT", "DO", "CALL", "WITH", "VALUES", "TABLE"})
#: The words after which ``ANALYZE`` runs a statement (MariaDB's ANALYZE UPDATE/DELETE executes it).
_ANALYZED = frozenset({"UPDATE", "DELETE", "INSERT", "REPLACE", "SELECT"})
#: The first words of DML statements sqlglot leaves as commands (or cannot parse).
_DML_WORDS = frozenset({"REPLACE", "LOAD", "INSERT", "UPDATE", "DELETE"})
_RENAME_WORDS = frozenset({"RENAME", "TABLE", "TABLES", "IF", "EXISTS", "WAIT", "NOWAIT", "TO"})
_DDL_NODES = (exp.Create, exp.Drop, exp.Alter)
_DML_NODES = (exp.Insert, exp.Update, exp.Delete)
_NAME_TOKENS = frozenset({TokenType.VAR, TokenType.IDENTIFIER})


class _Quiet(logging.Filter):
    """Drops what sqlglot logs while `classify` parses (``parsing`` set, in that thread): its
    warning for a statement it reads as a command quotes the statement, literals and all (data,
    or an account's password). What the capture makes of a statement it logs itself, without them
    (`orchestrator.binlog.statements.redacted`)."""

    def __init__(self) -> None:
        super().__init__()
        self.parsing = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.parsing, "on", False)


_QUIET = _Quiet()
logging.getLogger("sqlglot").addFilter(_QUIET)


class _Tokenizer(MySQL.Tokenizer):
    """MySQL's tokenizer without commands (which swallow the rest of a statement as one string)."""

    COMMANDS: ClassVar[set[TokenType]] = set()


class _AnsiTokenizer(_Tokenizer):
    """In a session with ``ANSI_QUOTES``: ``"name"`` is an identifier, not a string."""

    QUOTES: ClassVar[list[str | tuple[str, str]]] = ["'"]
    IDENTIFIERS: ClassVar[list[str | tuple[str, str]]] = ["`", '"']


class _LiteralTokenizer(_Tokenizer):
    """In a session with ``NO_BACKSLASH_ESCAPES``: a backslash in a string is itself."""

    STRING_ESCAPES: ClassVar[list[str]] = ["'"]


class _AnsiLiteralTokenizer(_AnsiTokenizer):
    STRING_ESCAPES: ClassVar[list[str]] = ["'"]


#: By (ANSI_QUOTES, backslash escapes).
_TOKENIZERS: dict[tuple[bool, bool], type[_Tokenizer]] = {
    (False, True): _Tokenizer,
    (True, True): _AnsiTokenizer,
    (False, False): _LiteralTokenizer,
    (True, False): _AnsiLiteralTokenizer,
}


def classify(
    sql: str,
    database: str,
    *,
    lower_case_table_names: int = 0,
    ansi_quotes: bool = False,
    backslash_escapes: bool = True,
) -> Statement:
    """Classify one QUERY event's statement.

    A statement read in a session ``sql_mode`` sqlglot's MySQL dialect does not know
    (``ANSI_QUOTES``, ``NO_BACKSLASH_ESCAPES``) is classified by the names it mentions, and one
    that cannot be tokenized at all may have changed any table (``everything``).

    Args:
        sql: the statement as the event holds it.
        database: the event's default database ("" if none).
        lower_case_table_names: the server's setting; names are lower-cased unless it is 0.
        ansi_quotes: the session had ``ANSI_QUOTES`` (``"t"`` names a table).
        backslash_escapes: the session had no ``NO_BACKSLASH_ESCAPES``.

    >>> classify("TRUNCATE TABLE `orders`", "shop")  # doctest: +NORMALIZE_WHITESPACE
    Statement(kind='truncate', tables=frozenset({'shop.orders'}), databases=frozenset(),
              parsed=True, xa=None, one_phase=False, everything=False)
    >>> sorted(classify("RENAME TABLE a TO b, x.c TO d", "s").tables)
    ['s.a', 's.b', 's.d', 'x.c']
    >>> classify("SET STATEMENT max_statement_time=100 FOR TRUNCATE TABLE t", "s").tables
    frozenset({'s.t'})
    >>> (classify("SELECT `o`.`f`()", "s").everything,
    ...  classify("ROLLBACK TO SAVEPOINT p", "s").everything)
    (True, True)
    """
    text = EXECUTABLE_COMMENT.sub(r" \1 ", sql).strip().rstrip(";").strip()
    try:
        tokens = _TOKENIZERS[ansi_quotes, backslash_escapes]().tokenize(text)
    except TokenError:  # a comment or string that does not end as the tokenizer reads it
        return Statement("ddl", parsed=False, everything=True)
    names = _Names(database, lower_case_table_names)
    first = tokens[0].text.upper() if tokens else ""
    inner = _inner(tokens, first)
    if inner is not None:
        return classify(
            text[inner:],
            database,
            lower_case_table_names=lower_case_table_names,
            ansi_quotes=ansi_quotes,
            backslash_escapes=backslash_escapes,
        )
    if first == "XA":
        return _xa(tokens)
    if first in _OPAQUE:
        return Statement("dml", names.mentioned(tokens), parsed=False, everything=True)
    if first in _DML_WORDS - {"INSERT", "UPDATE", "DELETE"}:
        return Statement("dml", names.mentioned(tokens), parsed=False)
    account = _account(tokens, first)
    if account is not None:
        return Statement("ddl", account)
    if first == "RENAME":  # RENAME TABLE[S] [IF EXISTS] a [WAIT n | NOWAIT] TO b, ...
        return Statement(
            "ddl", names.mentioned([t for t in tokens if t.text.upper() not in _RENAME_WORDS])
        )
    if first in _HARMLESS:
        return Statement("other")
    if (ansi_quotes and '"' in text) or (not backslash_escapes and "\\" in text):
        # text sqlglot's dialect would read otherwise: by the names it mentions
        return Statement(
            "dml" if first in _DML_WORDS else "ddl",
            names.mentioned(tokens),
            parsed=False,
            everything=first == "ROLLBACK",
        )
    _QUIET.parsing.on = True
    try:
        tree = sqlglot.parse_one(text, dialect="mysql")
    except (ParseError, TokenError):
        tree = None
    finally:
        _QUIET.parsing.on = False
    if tree is None or isinstance(tree, exp.Command):
        kind: Kind = "dml" if first in _DML_WORDS else "ddl"
        return Statement(kind, names.mentioned(tokens), parsed=False)
    return _from_tree(tree, names, tokens)


def _account(tokens: list[Token], first: str) -> frozenset[str] | None:
    """The ``mysql`` tables an account or server statement changes (None: not one). Its text is
    never parsed further: it holds passwords, and sqlglot's parser logs what it cannot read.

    >>> sorted(_account(_Tokenizer().tokenize("DROP ROLE IF EXISTS r"), "DROP"))[:2]
    ['mysql.columns_priv', 'mysql.db']
    >>> _account(_Tokenizer().tokenize("DROP TABLE user"), "DROP") is None
    True
    """
    if first in ("GRANT", "REVOKE"):
        return ACCOUNT_TABLES
    words = [t.text.upper() for t in tokens[1:5]]
    if first == "SET":
        account = words[:1] == ["PASSWORD"] or words[:2] == ["DEFAULT", "ROLE"]
        return ACCOUNT_TABLES if account else None
    if first not in ("CREATE", "ALTER", "DROP", "RENAME"):
        return None
    what = next((w for w in words if w not in _OPTION_WORDS), "")
    return {"USER": ACCOUNT_TABLES, "ROLE": ACCOUNT_TABLES, "SERVER": SERVER_TABLES}.get(what)


def _inner(tokens: list[Token], first: str) -> int | None:
    """Where the statement that ``SET STATEMENT var=value, ... FOR`` or ``ANALYZE [FORMAT=JSON]``
    runs begins in the text (None: not such a statement)."""
    words: frozenset[str]
    if first == "SET" and len(tokens) > 1 and tokens[1].text.upper() == "STATEMENT":
        words = frozenset({"FOR"})
    elif first == "ANALYZE":
        words = _ANALYZED
    else:
        return None
    found = next(
        (t for t in tokens[1:] if t.text.upper() in words and t.token_type != TokenType.STRING),
        None,
    )
    if found is None:
        return None
    return found.end + 1 if first == "SET" else found.start


class _Names:
    """Qualifies and folds the names a statement uses."""

    def __init__(self, database: str, lower_case_table_names: int) -> None:
        self.database = database
        self.lower = lower_case_table_names

    def table(self, node: exp.Table) -> str:
        return fold(f"{node.db or self.database}.{node.name}", self.lower)

    def tables(self, nodes: Iterable[exp.Table]) -> frozenset[str]:
        return frozenset(self.table(n) for n in nodes if n.name)

    def mentioned(self, tokens: list[Token]) -> frozenset[str]:
        """Every name the tokens hold: ``a.b`` as itself, a bare ``a`` in the default database.

        A name that starts with digits (``2024_orders``) comes as a number and a name, with
        nothing between them: joined again.
        """
        tokens = _joined(tokens)
        found: set[str] = set()
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token.token_type in _NAME_TOKENS or (
                token.text.isidentifier() and token.token_type != TokenType.STRING
            ):
                if i + 2 < len(tokens) and tokens[i + 1].token_type == TokenType.DOT:
                    found.add(fold(f"{token.text}.{tokens[i + 2].text}", self.lower))
                    i += 3
                    continue
                found.add(fold(f"{self.database}.{token.text}", self.lower))
            i += 1
        return frozenset(found)


def _joined(tokens: list[Token]) -> list[Token]:
    out: list[Token] = []
    for token in tokens:
        last = out[-1] if out else None
        if (
            last is not None
            and last.token_type == TokenType.NUMBER
            and last.end + 1 == token.start
            and token.token_type in _NAME_TOKENS | {TokenType.NUMBER}
        ):
            out[-1] = Token(
                TokenType.VAR, last.text + token.text, last.line, last.col, last.start, token.end
            )
        else:
            out.append(token)
    return out


def _from_tree(tree: exp.Expr, names: _Names, tokens: list[Token]) -> Statement:
    if isinstance(tree, exp.Transaction):
        return Statement("begin")
    if isinstance(tree, exp.Commit):
        return Statement("commit")
    if isinstance(tree, exp.Rollback):  # to a savepoint: it undoes rows events logged before it
        return (
            Statement("dml", everything=True)
            if tree.args.get("savepoint")
            else Statement("rollback")
        )
    if isinstance(tree, exp.TruncateTable):
        return Statement("truncate", names.tables(tree.expressions))
    if isinstance(tree, _DDL_NODES):
        return _ddl(tree, names)
    if isinstance(tree, exp.Insert):
        target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
        return Statement("dml", names.tables([target] if isinstance(target, exp.Table) else []))
    if isinstance(tree, _DML_NODES):  # a multi-table UPDATE/DELETE may change any table it joins
        return Statement("dml", names.tables(tree.find_all(exp.Table)))
    # A statement of a kind not known here that names a run table may have changed it: re-read
    # that table rather than guess (the binlog holds writes; a harmless one costs one read). Any
    # name it mentions counts, not only what sqlglot took for a table (`FROBNICATE t` parses as
    # a column with an alias).
    return Statement(
        "ddl", names.tables(tree.find_all(exp.Table)) | names.mentioned(tokens), parsed=False
    )


def _ddl(tree: exp.Create | exp.Drop | exp.Alter, names: _Names) -> Statement:
    kind = str(tree.args.get("kind") or "TABLE").upper()
    if kind in ("DATABASE", "SCHEMA"):
        if isinstance(tree, exp.Drop):
            dropped = [
                t.name or t.db for t in tree.args.get("tables") or [tree.this] if t is not None
            ]
            return Statement("ddl", databases=frozenset(fold(d, names.lower) for d in dropped))
        return Statement("other")  # creating or altering a database changes no table
    if isinstance(tree, exp.Drop):
        cluster = tree.args.get("cluster")
        if kind == "INDEX" and cluster is not None:
            return Statement("ddl", names.tables(cluster.find_all(exp.Table)))
        return Statement("ddl", names.tables(tree.args.get("tables") or []))
    if isinstance(tree, exp.Create):
        target = tree.this
        if isinstance(target, exp.Index):
            target = target.args.get("table")
        if isinstance(target, exp.Schema):
            target = target.this
        return Statement("ddl", names.tables([target] if isinstance(target, exp.Table) else []))
    renamed = [a.this for a in tree.args.get("actions") or [] if isinstance(a, exp.AlterRename)]
    return Statement("ddl", names.tables([tree.this, *renamed]))


# --------------------------------------------------------------------------- XA

_XA_VERBS = {
    "START": "START",
    "BEGIN": "START",
    "END": "END",
    "PREPARE": "PREPARE",
    "COMMIT": "COMMIT",
    "ROLLBACK": "ROLLBACK",
    "RECOVER": "RECOVER",
}
_XID_PARTS = frozenset(
    {TokenType.STRING, TokenType.HEX_STRING, TokenType.NUMBER, TokenType.BIT_STRING}
)


def _xa(tokens: list[Token]) -> Statement:
    """``XA <verb> xid [ONE PHASE | SUSPEND | JOIN | RESUME]``.

    >>> _xa(_Tokenizer().tokenize("XA COMMIT X'6162',X'',1 ONE PHASE")).xa
    ('COMMIT', Xid(gtrid=b'ab', bqual=b'', format_id=1))
    """
    verb = _XA_VERBS.get(tokens[1].text.upper()) if len(tokens) > 1 else None
    if verb is None:
        return Statement("ddl", parsed=False)  # not XA as we know it: treated as unknown
    parts: list[Token] = [t for t in tokens[2:] if t.token_type in _XID_PARTS]
    values = [_xid_value(t) for t in parts]
    xid = None
    if values:
        text = [v if isinstance(v, bytes) else str(v).encode() for v in values]
        format_id = values[2] if len(values) > 2 and isinstance(values[2], int) else 1
        xid = Xid(text[0], text[1] if len(text) > 1 else b"", format_id)
    words = {t.text.upper() for t in tokens[2:] if t.token_type not in _XID_PARTS}
    return Statement("xa", xa=(verb, xid), one_phase={"ONE", "PHASE"} <= words)  # type: ignore[arg-type]


def _xid_value(token: Token) -> bytes | int:
    if token.token_type == TokenType.HEX_STRING:
        return (
            bytes.fromhex(token.text)
            if len(token.text) % 2 == 0
            else bytes.fromhex("0" + token.text)
        )
    if token.token_type == TokenType.BIT_STRING:
        bits = token.text or "0"
        return int(bits, 2).to_bytes((len(bits) + 7) // 8, "big")
    if token.token_type == TokenType.NUMBER:
        return int(token.text)
    return token.text.encode("utf-8")
