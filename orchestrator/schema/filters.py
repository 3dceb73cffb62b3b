"""A table's ``where`` filter as MySQL evaluates it, on the change rows of the binlog.

The snapshot reads ``SELECT ... WHERE <where>``; the binlog gives rows, not queries, so
capture needs the same verdict on each after-image in Python. `compile_filter` parses
the filter once (sqlglot, MySQL dialect) into a function of a row that returns True,
False or None (NULL), with MySQL's rules: three-valued logic, comparisons of numbers as
integers/decimals exactly or as doubles when a float is involved, dates and datetimes
with their literals, and text in the column's collation. Anything whose MySQL result we
cannot reproduce exactly (functions, subqueries, variables, a string literal compared
with a number, a TIMESTAMP in the session's time zone...) is refused with one message
naming the part and the fix; `check_filter` is that refusal without the table's types,
for ``validate``. Text in a collation other than a UTF-8 ``_bin`` one is compared by the
server itself (`CollationOracle`): its case, accent and pad rules are its own.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

from orchestrator.schema.collations import (
    CollationOracle,
    FilterError,
    NoOracle,
    like_regex,
    local_collation,
    pad_compare,
)
from orchestrator.schema.families import FAMILIES
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import is_boolean

Row = Mapping[str, Any]
Verdict = Callable[[Row], "bool | None"]

#: Column families the evaluator compares exactly, by the kind of value staging gives.
_KINDS = {
    "integer": "num",
    "decimal": "num",
    "float": "float",
    "text": "str",
    "date": "date",
    "datetime": "datetime",
}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?")


@dataclass(frozen=True, slots=True)
class _Term:
    """A compiled operand: its kind (num, float, str, date, datetime, bool, null, truth, any),
    how to get its value from a row, and the column it reads (None: a literal)."""

    kind: str
    get: Callable[[Row], Any]
    column: ColumnInfo | None = None
    literal: Any = None


def check_filter(sql: str) -> str | None:
    """What ``validate`` says of a filter: None when its shape is supported.

    >>> check_filter("deleted = 0 AND name LIKE 'a%'") is None
    True
    >>> check_filter("created_at > NOW()") == (
    ...     "the filter `created_at > NOW()`: `NOW()` is not supported (only columns, literals,"
    ...     " comparisons, AND/OR/NOT/XOR, IN, BETWEEN, IS [NOT] NULL and LIKE are); write the"
    ...     " filter with constants")
    True
    """
    try:
        compile_filter(sql, None, None)
    except FilterError as exc:
        return str(exc)
    return None


def compile_filter(sql: str, table: TableInfo | None, oracle: CollationOracle | None) -> Verdict:
    """The filter as a function of a row (``{column name: staging value}``): True, False or None.

    Args:
        sql: the filter, MySQL syntax.
        table: the table's columns (None: check the shape only, every column allowed).
        oracle: compares text in collations evaluated by the server; None fails at first use.

    Raises:
        FilterError: a part that cannot be evaluated exactly, named with the fix.
    """
    try:
        if any(token.comments for token in sqlglot.tokenize(sql, read="mysql")):
            # the parser drops them, the server may run them (``/*! ... */``), and ``--`` or ``#``
            # would swallow the parenthesis the read puts after the filter
            raise FilterError(f"the filter `{sql}` holds a comment; remove it")
        tree: exp.Expression = sqlglot.parse_one(sql, read="mysql")  # type: ignore[assignment]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as exc:
        raise FilterError(
            f"the filter `{sql}` is not valid SQL: {str(exc).splitlines()[0]}"
        ) from exc
    try:
        return _Compiler(table, oracle).truth(tree).get
    except FilterError as exc:
        raise FilterError(f"the filter `{sql}`: {exc}") from None
    except ValueError as exc:  # a literal Python cannot read (``1.0e``)
        raise FilterError(f"the filter `{sql}`: {exc}") from None


class _Compiler:
    def __init__(self, table: TableInfo | None, oracle: CollationOracle | None) -> None:
        self.table = table
        self.oracle = oracle

    # ------------------------------------------------------------------ boolean structure

    def truth(self, node: exp.Expression) -> _Term:
        """A node as a truth value (True/False/None)."""
        if isinstance(node, exp.Paren):
            return self.truth(node.this)
        if isinstance(node, (exp.And, exp.Or, exp.Xor)):
            return _logic(type(node).__name__, self.truth(node.this), self.truth(node.expression))
        if isinstance(node, exp.Not):
            inner = self.truth(node.this).get
            return _Term("truth", lambda r: None if (v := inner(r)) is None else not v)
        if isinstance(node, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ)):
            return self.comparison(
                type(node).__name__, self.value(node.this), self.value(node.expression)
            )
        if isinstance(node, exp.In):
            return self.in_list(node)
        if isinstance(node, exp.Between):
            value, low, high = _as_one_type(
                self.value(node.this), self.value(node.args["low"]), self.value(node.args["high"])
            )
            return _logic(
                "And", self.comparison("GTE", value, low), self.comparison("LTE", value, high)
            )
        if isinstance(node, exp.Is):
            return self.is_test(node)
        if isinstance(node, (exp.Like, exp.Escape)):
            return self.like(node)
        term = self.value(node)
        return _as_truth(term, node)

    def in_list(self, node: exp.In) -> _Term:
        if node.args.get("query") or not node.expressions:
            raise FilterError(f"`{node.sql('mysql')}`: only IN with a list of values is supported")
        left = self.value(node.this)
        tests = [self.comparison("EQ", left, self.value(e)) for e in node.expressions]

        def any_equal(row: Row) -> bool | None:
            result: bool | None = False
            for test in tests:
                v = test.get(row)
                if v:
                    return True
                if v is None:
                    result = None
            return result

        return _Term("truth", any_equal)

    def is_test(self, node: exp.Is) -> _Term:
        target = node.expression
        if isinstance(target, exp.Null):
            get = self.value(node.this).get
            return _Term("truth", lambda r: get(r) is None)
        if isinstance(target, exp.Boolean):
            truth, wanted = self.truth(node.this).get, bool(target.this)
            return _Term("truth", lambda r: truth(r) is wanted)
        raise FilterError(f"`{node.sql('mysql')}` is not supported; use IS [NOT] NULL/TRUE/FALSE")

    def like(self, node: exp.Expression) -> _Term:
        escape = "\\"
        if isinstance(node, exp.Escape):
            escape = _string_literal(node.expression, "the ESCAPE character")
            if len(escape) != 1:
                raise FilterError(f"`{node.sql('mysql')}`: ESCAPE takes one character")
            node = node.this
        if not isinstance(node, exp.Like):
            raise FilterError(f"`{node.sql('mysql')}` is not supported")
        value = self.value(node.this)
        pattern = _string_literal(node.expression, "a LIKE pattern")
        if value.kind not in ("str", "any"):
            raise FilterError(f"`{node.sql('mysql')}`: LIKE is supported on text columns only")
        match = self._like_matcher(value.column, pattern, escape)
        get, negate = value.get, bool(node.args.get("negate"))

        def like(row: Row) -> bool | None:
            v = get(row)
            return None if v is None else match(v) != negate

        return _Term("truth", like)

    def _like_matcher(
        self, column: ColumnInfo | None, pattern: str, escape: str
    ) -> Callable[[str], bool]:
        if column is not None and not local_collation(column):
            oracle = self._oracle()
            return lambda v: oracle.like(column, v, pattern, escape)
        regex = re.compile(like_regex(pattern, escape), re.DOTALL)
        return lambda v: regex.fullmatch(v) is not None

    # ------------------------------------------------------------------ comparisons

    def comparison(self, op: str, left: _Term, right: _Term) -> _Term:
        """``left <op> right`` with MySQL's type rules (both sides converted alike)."""
        left, right = _temporal_literal(left, right), _temporal_literal(right, left)
        convert, compare = self._comparable(left, right)
        lget, rget = left.get, right.get
        if op == "NullSafeEQ":

            def null_safe(row: Row) -> bool:
                a, b = lget(row), rget(row)
                if a is None or b is None:
                    return a is None and b is None
                return compare(convert(a), convert(b)) == 0

            return _Term("truth", null_safe)
        test = _TESTS[op]

        def compared(row: Row) -> bool | None:
            a, b = lget(row), rget(row)
            if a is None or b is None:
                return None
            return test(compare(convert(a), convert(b)))

        return _Term("truth", compared)

    def _comparable(
        self, left: _Term, right: _Term
    ) -> tuple[Callable[[Any], Any], Callable[[Any, Any], int]]:
        kinds = {left.kind, right.kind}
        if "any" in kinds or "null" in kinds:
            return _same, _cmp
        for bool_side, other in ((left, right), (right, left)):
            if bool_side.kind == "bool":
                if other.literal is None or other.literal != 0 or other.kind != "num":
                    name = bool_side.column.name if bool_side.column else "?"
                    raise FilterError(
                        f"column `{name}` is TINYINT(1)/BIT(1), kept as a boolean: "
                        f"compare it with 0 only (`{name} = 0`, `{name} <> 0`)"
                    )
                return _same, _cmp
        if kinds <= {"num", "float"}:
            return (float if "float" in kinds else _same), _cmp
        if kinds == {"str"}:
            return _same, self._text_order(left, right)
        if kinds <= {"date", "datetime"}:
            return (_as_datetime if len(kinds) == 2 else _same), _cmp
        raise FilterError(
            f"comparing {_describe(left)} with {_describe(right)} is not "
            "supported: MySQL converts both to doubles; write the literal in the "
            "column's type (a number for a number, a quoted 'YYYY-MM-DD' for a date)"
        )

    def _text_order(self, left: _Term, right: _Term) -> Callable[[Any, Any], int]:
        columns = [t.column for t in (left, right) if t.column is not None]
        if not columns:
            raise FilterError("comparing two string literals is not supported; compare a column")
        if len(columns) == 2 and columns[0].collation != columns[1].collation:
            raise FilterError(
                f"columns `{columns[0].name}` and `{columns[1].name}` have different "
                "collations; compare each with a literal instead"
            )
        column = columns[0]
        if local_collation(column):
            pad = "nopad" not in (column.collation or "")
            return pad_compare if pad else _cmp
        oracle = self._oracle()
        return lambda a, b: oracle.compare(column, a, b)

    def _oracle(self) -> CollationOracle:
        if self.oracle is not None:
            return self.oracle
        return NoOracle()

    # ------------------------------------------------------------------ operands

    def value(self, node: exp.Expression) -> _Term:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Null):
            return _Term("null", lambda r: None)
        if isinstance(node, exp.Boolean):
            flag = int(bool(node.this))
            return _Term("num", lambda r: flag, literal=flag)
        if (
            isinstance(node, exp.Neg)
            and isinstance(node.this, exp.Literal)
            and not node.this.is_string
        ):
            number: int | Decimal | float = -_number(node.this.this)
            return _Term(
                "float" if isinstance(number, float) else "num", lambda r: number, literal=number
            )
        if isinstance(node, exp.Literal):
            if node.is_string:
                text = _string_literal(node, "a string literal")
                return _Term("str", lambda r: text, literal=text)
            number = _number(node.this)
            return _Term(
                "float" if isinstance(number, float) else "num", lambda r: number, literal=number
            )
        if isinstance(
            node,
            (
                exp.EQ,
                exp.NEQ,
                exp.GT,
                exp.GTE,
                exp.LT,
                exp.LTE,
                exp.And,
                exp.Or,
                exp.Not,
                exp.Is,
                exp.In,
                exp.Between,
                exp.Like,
                exp.Xor,
            ),
        ):
            truth = self.truth(node).get
            return _Term("num", lambda r: None if (v := truth(r)) is None else int(v))
        raise FilterError(
            f"`{node.sql('mysql')}` is not supported (only columns, literals, "
            "comparisons, AND/OR/NOT/XOR, IN, BETWEEN, IS [NOT] NULL and LIKE are); "
            "write the filter with constants"
        )

    def column(self, node: exp.Column) -> _Term:
        if node.table:
            raise FilterError(f"`{node.sql('mysql')}`: name columns without a table")
        name = node.name
        if self.table is None:
            return _Term("any", lambda r: r.get(name))
        try:
            column = self.table.column(name)
        except KeyError:
            raise FilterError(f"table {self.table.name} has no column `{name}`") from None
        key = column.name
        family = FAMILIES.get(column.data_type)
        if is_boolean(column):
            return _Term("bool", lambda r: None if (v := r[key]) is None else int(v), column)
        kind = _KINDS.get(column.data_type if family == "temporal" else family or "")
        if (
            kind is None
            or (family == "decimal" and (column.precision or 0) > 38)
            or column.data_type in ("timestamp", "year")
            or (kind == "str" and column.data_type in ("enum", "set", "json"))
        ):
            raise FilterError(
                f"column `{name}` is {column.column_type.upper()}: filters on this "
                "type are not supported on the binlog; filter on another column"
            )
        return _Term(kind, lambda r: r[key], column)


def _logic(kind: str, left: _Term, right: _Term) -> _Term:
    a, b = left.get, right.get
    if kind == "And":

        def both(row: Row) -> bool | None:
            x = a(row)
            if x is False:
                return False
            y = b(row)
            return False if y is False else (None if x is None or y is None else True)

        return _Term("truth", both)
    if kind == "Or":

        def either(row: Row) -> bool | None:
            x = a(row)
            if x is True:
                return True
            y = b(row)
            return True if y is True else (None if x is None or y is None else False)

        return _Term("truth", either)

    def xor(row: Row) -> bool | None:
        x, y = a(row), b(row)
        return None if x is None or y is None else x != y

    return _Term("truth", xor)


def _as_one_type(*terms: _Term) -> tuple[_Term, ...]:
    """BETWEEN's three operands compared in one type (MySQL aggregates them): numbers as
    doubles when any is a float (IN compares each pair in its own type)."""
    kinds = {t.kind for t in terms} - {"null"}
    if "float" not in kinds or not kinds <= {"num", "float"}:
        return terms
    return tuple(
        _Term("float", t.get, t.column, t.literal) if t.kind == "num" else t for t in terms
    )


def _as_truth(term: _Term, node: exp.Expression) -> _Term:
    if term.kind == "truth":
        return term
    if term.kind in ("num", "float", "bool", "any"):
        get = term.get
        return _Term("truth", lambda r: None if (v := get(r)) is None else v != 0)
    if term.kind == "null":
        return _Term("truth", lambda r: None)
    raise FilterError(
        f"`{node.sql('mysql')}` as a condition is not supported; compare it with a value"
    )


def _temporal_literal(term: _Term, other: _Term) -> _Term:
    """A string literal compared with a DATE/DATETIME column, as a date or datetime."""
    if (
        term.kind != "str"
        or term.column is not None
        or other.column is None
        or other.kind not in ("date", "datetime")
    ):
        return term
    value = typed_literal(other.column, term.literal)
    kind = "datetime" if isinstance(value, dt.datetime) else "date"
    return _Term(kind, lambda r: value, literal=value)


def _string_literal(node: exp.Expression, what: str) -> str:
    if not isinstance(node, exp.Literal) or not node.is_string:
        raise FilterError(f"`{node.sql('mysql')}`: {what} must be a quoted string")
    text = str(node.this)
    if "\\" in text:
        raise FilterError(
            f"`{node.sql('mysql')}`: backslashes in string literals are not "
            "supported (they depend on sql_mode); use LIKE ... ESCAPE '!'"
        )
    return text


def _number(text: str) -> int | Decimal | float:
    """A numeric literal as MySQL types it: integer, DECIMAL, or double (with an exponent)."""
    if "e" in text.lower():
        return float(text)
    if "." in text:
        return Decimal(text)
    return int(text)


def typed_literal(column: ColumnInfo, text: str) -> Any:
    """A string literal in a DATE/DATETIME column's type (only the canonical formats)."""
    if _DATETIME.fullmatch(text):
        return dt.datetime.fromisoformat(text)
    if _DATE.fullmatch(text):
        return dt.date.fromisoformat(text)
    raise FilterError(
        f"`{text}` is not a date in the form 'YYYY-MM-DD[ hh:mm:ss[.ffffff]]' "
        f"(column `{column.name}`)"
    )


def _same(v: Any) -> Any:
    return v


def _as_datetime(v: Any) -> Any:
    return v if isinstance(v, dt.datetime) else dt.datetime.combine(v, dt.time())


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _describe(term: _Term) -> str:
    if term.column is not None:
        return f"column `{term.column.name}` ({term.column.column_type.upper()})"
    return f"the literal {term.literal!r}"


_TESTS: dict[str, Callable[[int], bool]] = {
    "EQ": lambda c: c == 0,
    "NEQ": lambda c: c != 0,
    "GT": lambda c: c > 0,
    "GTE": lambda c: c >= 0,
    "LT": lambda c: c < 0,
    "LTE": lambda c: c <= 0,
}


def used_columns(sql: str) -> Sequence[str]:
    """The column names a filter reads (as written)."""
    return sorted({c.name for c in sqlglot.parse_one(sql, read="mysql").find_all(exp.Column)})
