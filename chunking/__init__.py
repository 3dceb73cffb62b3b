"""Key ranges and chunk planning: pure Python, no Spark, no Airflow.

The public surface: value objects (`KeyRange`, `Chunk`, `TablePlan`), key
encoding (`encode_key`, `decode_key`), predicate rendering (`chunk_predicate`,
`sql_literal`), and planning (`plan_key_space`, or `open_splitter` for a lazy
splitter). Database access is a `Query` callable, so the library runs against
any connection that can execute SQL text.

May import: orchestrator, errors, positions, services, schema.
"""

from __future__ import annotations

from chunking.even import EvenSplitter, even_boundaries
from chunking.keys import Key, KeyValue, decode_key, encode_key, key_order
from chunking.mysql import Query, chunk_predicate, quote_identifier, quote_table, sql_literal
from chunking.ranges import Chunk, KeyRange, Strategy, TablePlan
from chunking.splitter import (
    EXACT_COUNT_BELOW,
    ChunkingError,
    CountingQuery,
    Decision,
    Splitter,
    choose_strategy,
    distribution_factor,
    open_splitter,
    plan_key_space,
)
from chunking.uneven import UnevenSplitter

__all__ = [
    "EXACT_COUNT_BELOW",
    "Chunk",
    "ChunkingError",
    "CountingQuery",
    "Decision",
    "EvenSplitter",
    "Key",
    "KeyRange",
    "KeyValue",
    "Query",
    "Splitter",
    "Strategy",
    "TablePlan",
    "UnevenSplitter",
    "choose_strategy",
    "chunk_predicate",
    "decode_key",
    "distribution_factor",
    "encode_key",
    "even_boundaries",
    "key_order",
    "open_splitter",
    "plan_key_space",
    "quote_identifier",
    "quote_table",
    "sql_literal",
]
