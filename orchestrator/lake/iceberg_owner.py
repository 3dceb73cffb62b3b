"""Whose Iceberg table a catalog's name is: a table dir's only if the table's location is that
dir (docs/design.md, "One writer").

The identifier is ``<database>.<table>`` in ``output.catalog`` (docs/output.md), and by default
the catalog lives in the state store's database: two pipelines that share a state store (or a
catalog) but write different ``output.path``s, both naming ``shop.orders`` (two shards of one
schema), share one Iceberg table name. Without this check the second pipeline's versions were
committed to the first one's table, so a reader of the catalog got one source's rows or the
other's, whichever pipeline published last.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.iceberg_create import catalog_rows


def place(uri: str) -> str:
    """A location as a place to compare: ``file:///x``, ``file:/x`` and ``/x`` are one place, as
    are ``s3://b/x``, ``s3a://b/x`` and ``s3n://b/x`` (catalogs spell them either way).

    >>> [place(u) for u in ("file:///lake/t/", "file:/lake/t", "/lake/t", "s3a://b/lake/t")]
    ['/lake/t', '/lake/t', '/lake/t', 's3://b/lake/t']
    """
    text = uri.rstrip("/")
    for prefix in ("file://", "file:"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("s3", "s3a", "s3n"):
        return "s3://" + rest
    return text


def owns(loaded: Table, tdir: str) -> bool:
    """Whether the catalog's table is the one at table dir ``tdir``."""
    return place(loaded.location()) == place(_uri(tdir))


def check_owned(loaded: Table, table: str, tdir: str) -> None:
    """A RunFailed naming the fix when the catalog's table of ``table``'s name is at another
    location than ``tdir`` (the table fails alone; nothing is committed)."""
    if owns(loaded, tdir):
        return
    raise RunFailed(
        f"table {table}: the Iceberg catalog's table {table} is at {loaded.location()}, not in "
        f"this pipeline's output ({tdir}): another pipeline publishes a table of this name to "
        "the same catalog (pipelines that write different output paths need catalogs of their "
        "own: give one of them its own output.catalog.name); if that location is this "
        f"pipeline's former output.path, drop the catalog's table {table} and run again"
    )


def elsewhere(catalog: Catalog, tdirs: Mapping[str, str]) -> dict[str, str] | None:
    """The tables of ``tdirs`` (identifier: table dir) whose name the catalog already has at
    another location, with the metadata file it names: what `check_owned` would fail at
    publish, found before any read (doctor). One query a namespace of a SQL catalog's rows, no
    table loaded; None for another catalog (publish checks each table it loads)."""
    rows = catalog_rows(catalog, tdirs)
    if rows is None:
        return None
    return {
        identifier: metadata
        for identifier, metadata in rows.items()
        if metadata is not None
        and not place(metadata).startswith(place(_uri(tdirs[identifier])) + "/")
    }


def _uri(tdir: str) -> str:
    return storage.local_path(tdir) if storage.is_local(tdir) else tdir
