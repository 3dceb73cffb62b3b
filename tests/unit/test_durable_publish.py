"""A local lake's published files are on disk before the catalog commit that names them.

A power cut cannot run here, so the test watches the fsync calls of a real publish (every call
still goes to the kernel): at the SQL commit that makes a metadata file current, each file the
snapshot reads (metadata file, manifest list, manifests, data files) must have been fsynced, and
each directory on the way to it synced after that name was in it; the same for a second version,
committed by pyiceberg's transaction.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from orchestrator.config import PipelineConfig
from orchestrator.lake import iceberg, iceberg_create, storage
from orchestrator.lake.iceberg_io import DurableFileIO
from tests.unit.test_iceberg import config_for, publish

#: At a SQL commit: each file fsynced before it with its size and mtime then, each synced
#: directory's names as last synced, and the lake's metadata files then.
Seen = tuple[dict[str, tuple[int, int]], dict[str, frozenset[str]], set[str]]


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Seen]]:
    files: dict[str, tuple[int, int]] = {}
    names: dict[str, frozenset[str]] = {}
    commits: list[Seen] = []
    real_fsync, real_commit = os.fsync, Session.commit

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        real_fsync(fd)
        if os.path.isdir(path):
            names[path] = frozenset(os.listdir(path))
        else:
            stat = os.fstat(fd)
            files[path] = (stat.st_size, stat.st_mtime_ns)

    def commit(self: Session) -> None:
        commits.append(
            (
                dict(files),
                dict(names),
                {str(p) for p in (tmp_path / "lake").rglob("*.metadata.json")},
            )
        )
        real_commit(self)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Session, "commit", commit)
    yield commits


def _needed(config: PipelineConfig) -> tuple[str, set[str]]:
    """The current metadata file of db.t and every file a reader of its snapshot opens."""
    table = iceberg.open_catalog(config).load_table("db.t")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    files = {table.metadata_location, snapshot.manifest_list}
    for manifest in snapshot.manifests(table.io):
        files.add(manifest.manifest_path)
        files.update(entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io))
    return storage.local_path(table.metadata_location), {storage.local_path(f) for f in files}


@pytest.mark.parametrize(
    ("versions", "keep", "registers_itself"),
    [
        (1, 2, True),
        (2, 2, True),
        (2, 1, True),
        (1, 2, False),
    ],
    ids=[
        "new table",
        "next version",
        "version 1 expired",
        "new table by pyiceberg's create transaction",
    ],
)
def test_what_a_commit_names_is_on_disk_before_it(
    tmp_path: Path,
    watched: list[Seen],
    monkeypatch: pytest.MonkeyPatch,
    versions: int,
    keep: int,
    registers_itself: bool,
) -> None:
    monkeypatch.setattr(iceberg_create, "_REGISTERS_ITSELF", registers_itself)
    config = config_for(tmp_path, keep)
    assert iceberg.catalog_properties(config)["py-io-impl"].endswith(DurableFileIO.__name__)
    for n in range(1, versions + 1):
        watched.clear()
        publish(config, tmp_path, n)
    metadata, needed = _needed(config)
    if keep == 1:
        assert len(iceberg.open_catalog(config).load_table("db.t").snapshots()) == 1, (
            "version 1 expired"
        )
    # the catalog's commit: the first SQL commit once the metadata file was written
    synced, names, _ = next(seen for seen in watched if metadata in seen[2])
    for path in sorted(needed):  # synced with its final bytes (files are never written again)
        stat = os.stat(path)
        assert synced.get(path) == (stat.st_size, stat.st_mtime_ns), (
            f"{path} not on disk at the catalog commit"
        )
    lake = tmp_path / "lake"
    for path in map(
        Path, needed
    ):  # each name from the lake's root down, as synced in its directory
        for entry in [path, *path.parents[: len(path.relative_to(lake).parts)]]:
            if versions == 1 or entry.parent.name in (
                "data",
                "metadata",
            ):  # the next version adds files
                assert entry.name in names.get(str(entry.parent), ()), (
                    f"{entry.name} not yet in {entry.parent} when that was last synced "
                    "before the commit"
                )
