"""A version made current: the Iceberg snapshot recorded in its manifest, the manifest written
as ``_tidemark/versions/<n>.json`` and ``current.json`` (atomically: the moment Tidemark's
readers switch), then retention (`retain`): versions beyond ``output.keep_versions`` and older
than ``output.keep_hours`` dropped with their Iceberg snapshots and the files nothing kept lists.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.manifest import (
    IcebergEntry,
    Manifest,
    apply_retention,
    current_uri,
    find_manifest,
    manifest_json,
    version_uri,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def switch(
    config: PipelineConfig,
    catalog: Catalog,
    tdir: str,
    manifest: Manifest,
    snapshot: IcebergEntry,
    guard: Callable[[], None],
    previous: Manifest | None = None,
) -> Manifest:
    """Record the Iceberg snapshot in the version's manifest, make it current, apply retention
    (``previous``: the version current before, as publish read it; retention need not read its
    file again)."""
    manifest["iceberg"] = snapshot
    guard()
    write_current(tdir, manifest)
    retain(config, catalog, tdir, manifest, guard, previous)
    return manifest


def write_current(tdir: str, manifest: Manifest) -> None:
    """Write the version's manifest and make it current; never over a newer version (only a
    process that lost the pipeline lock could try: it fails here instead)."""
    shown = find_manifest(tdir)
    if shown is not None and shown["version"] > manifest["version"]:
        raise RunFailed(
            f"table {manifest['table']}: version {shown['version']} is current, newer than "
            f"version {manifest['version']} this run was switching to: another run published "
            "it; rerun `tidemark run`"
        )
    body = manifest_json(manifest)
    storage.write_atomic(version_uri(tdir, manifest["version"]), body)
    storage.write_atomic(current_uri(tdir), body)


def retain(
    config: PipelineConfig,
    catalog: Catalog,
    tdir: str,
    manifest: Manifest,
    guard: Callable[[], None],
    previous: Manifest | None = None,
) -> None:
    """Retention, ``manifest`` being current (``previous``: a version before it, as read); expiring
    snapshots writes new Iceberg metadata, which ``current.json`` then names."""

    def expire(dropped: list[int]) -> set[str]:
        from orchestrator.lake import iceberg  # a run that commits has imported it

        needed, location = iceberg.expire_versions(catalog, manifest["table"], tdir, dropped)
        entry = manifest.get("iceberg")
        if entry is not None and location is not None and location != entry["metadata_location"]:
            entry["metadata_location"] = location
            guard()
            write_current(tdir, manifest)
        return needed

    apply_retention(
        tdir,
        config.output.keep_versions,
        expire,
        keep_hours=config.output.keep_hours,
        guard=guard,
        current=manifest,
        known=[previous] if previous is not None else [],
    )


def published_at(manifest: Manifest) -> dt.datetime:
    """When ``manifest``'s version was published (``published_at`` is UTC, ``...Z``).

    >>> published_at({"published_at": "2026-11-22T10:00:00Z"}).isoformat()  # type: ignore
    '2026-11-22T10:00:00+00:00'
    """
    at = dt.datetime.fromisoformat(manifest["published_at"])  # a tenth of strptime's time
    return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
