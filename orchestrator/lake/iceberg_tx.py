"""pyiceberg transactions that build their staged table metadata once per change, not per read.

pyiceberg (0.12) computes `Transaction.table_metadata` anew at every read: each of its
updates applied to the table's metadata, then a deep copy of the whole metadata (pydantic
models, every schema field and snapshot). One snapshot commit reads it about sixteen
times (the producer's checks, summary, manifest writers, the catalog's staging), 0.3-0.5 ms
each for a small table: about half the CPU of committing a small table's version. The
value depends only on the table's metadata and the staged updates, both immutable objects
that a change replaces (a staged update makes a new tuple; a retry refreshes the table), so
it is kept until either is replaced (its ``last-updated-ms``, the time of the first read,
is not what the catalog commits: the catalog applies the updates to the table it loads).
pyiceberg's metadata models are frozen and its code derives new ones rather than changing
them, so sharing one between the reads is safe.

`remember_factory_checks` removes the other half of that waste, pydantic's (2.14): building a
model without validation (``model_construct``, which pyiceberg uses for every new table's
metadata) asks, for each field with a default factory, whether the factory takes the validated
data, by ``inspect.signature`` (through the tokenizer for built-in factories like ``list``),
every time: about 2 ms of a new table's commit. The answer depends only on the factory, so it
is remembered per factory. (pydantic fixed this for private attributes only, pydantic#13376.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic._internal import _fields
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata


class _StagedOnce(Transaction):
    """`Transaction.table_metadata`, remembered for the table metadata and updates it was built
    from."""

    _built: tuple[Any, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        built = self._built
        if built is None or built[0] is not self._table.metadata or built[1] is not self._updates:
            built = (self._table.metadata, self._updates, super().table_metadata)
            self._built = built
        return built[2]


def transaction(table: Table) -> Transaction:
    """``table.transaction()``, building its staged metadata once per change."""
    return _StagedOnce(table)


def remember_factory_checks() -> None:
    """pydantic's check whether a default factory takes the validated data, remembered per factory
    (see the module docstring). Idempotent; a pydantic without the function is left as it is."""
    original = getattr(_fields, "takes_validated_data_argument", None)
    if original is None or getattr(original, "remembered", False):
        return
    known: dict[Any, bool] = {}

    def check(factory: Callable[..., Any]) -> bool:
        try:
            return known[factory]
        except KeyError:
            answer = known[factory] = bool(original(factory))
            return answer
        except TypeError:  # an unhashable factory: asked every time, as before
            return bool(original(factory))

    check.remembered = True  # type: ignore[attr-defined]
    setattr(_fields, "takes_validated_data_argument", check)  # noqa: B010  # replaces the module function


remember_factory_checks()
