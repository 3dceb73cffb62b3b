"""What Tidemark knows about a source table's shape (filled by `orchestrator.source`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column, as ``information_schema.COLUMNS`` describes it.

    Attributes:
        name: column name.
        data_type: lower-case base type, e.g. ``"bigint"``, ``"varchar"``, ``"datetime"``.
        column_type: full lower-case type, e.g. ``"bigint(20) unsigned"``, ``"enum('a','b')"``.
        nullable: whether NULL is allowed.
        precision: NUMERIC_PRECISION (decimal digits; bits for BIT), or None.
        scale: NUMERIC_SCALE, or None.
        datetime_precision: fractional seconds digits for TIME/DATETIME/TIMESTAMP, or None.
        charset: character set for text columns, or None.
        collation: collation for text columns, or None.
    """

    name: str
    data_type: str
    column_type: str
    nullable: bool
    precision: int | None = None
    scale: int | None = None
    datetime_precision: int | None = None
    charset: str | None = None
    collation: str | None = None

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type

    @property
    def display_width(self) -> int | None:
        """The ``(n)`` of ``tinyint(1)`` or ``bit(8)``; None when absent."""
        head = self.column_type.split(" ", 1)[0]
        if "(" in head and head.endswith(")") and self.data_type in _WIDTH_TYPES:
            inner = head[head.index("(") + 1 : -1]
            return int(inner) if inner.isdigit() else None
        return None


_WIDTH_TYPES = {"tinyint", "smallint", "mediumint", "int", "bigint", "bit", "year"}


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A source table: columns in ordinal order, keys, and the server's row estimate."""

    database: str
    table: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...]
    unique_not_null_keys: tuple[tuple[str, ...], ...]
    row_estimate: int
    engine: str | None = None

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    def column(self, name: str) -> ColumnInfo:
        for column in self.columns:
            if column.name.lower() == name.lower():
                return column
        raise KeyError(name)
