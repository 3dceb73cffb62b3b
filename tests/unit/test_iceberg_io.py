"""Tidemark's FileIO reads each Iceberg metadata file once per process (docs/operations.md,
"Object storage"): a commit of a version reads the parent snapshot's manifest list and manifests
three times each through pyiceberg, two requests a read on S3."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFile

from orchestrator.lake import iceberg, iceberg_io
from orchestrator.lake.iceberg_io import DurableFileIO
from orchestrator.lake.kept_bytes import KeptBytes
from tests.unit.test_iceberg import config_for, publish


def test_a_commit_reads_each_metadata_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(iceberg_io, "_kept", KeptBytes(iceberg_io.KEPT_BYTES))  # none read yet
    config = config_for(tmp_path, keep=3)
    publish(config, tmp_path, 1)
    publish(config, tmp_path, 2)
    parent = iceberg.open_catalog(config).load_table("db.t").current_snapshot()
    assert parent is not None
    opened: Counter[str] = Counter()
    real_open = PyArrowFile.open

    def counted(self: PyArrowFile, seekable: bool = True) -> object:
        opened[self.location] += 1
        return real_open(self, seekable)

    monkeypatch.setattr(PyArrowFile, "open", counted)
    publish(config, tmp_path, 3)  # version 3 on version 2: its manifests are read again
    metadata = {k: n for k, n in opened.items() if "/metadata/" in k}
    assert parent.manifest_list in metadata, metadata
    assert max(metadata.values()) == 1, metadata  # pyiceberg alone: the manifest list 3 times


def test_only_metadata_files_are_kept(tmp_path: Path) -> None:
    io = DurableFileIO()
    data = tmp_path / "t" / "data" / "v000001-c0000.parquet"
    manifest = tmp_path / "t" / "metadata" / "snap-1-0-ab.avro"
    for path in (data, manifest):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"first")
    for path in (data, manifest):
        with io.new_input(str(path)).open() as stream:
            assert stream.read() == b"first"
        path.write_bytes(b"other")  # a metadata file is never written again: this one is
    with io.new_input(str(data)).open() as stream:
        assert stream.read() == b"other"  # read again
    kept = io.new_input(str(manifest))
    with kept.open() as stream:
        assert stream.read() == b"first"  # as read the first time
    assert len(kept) == 5 and kept.exists()


def test_kept_bytes_stay_under_the_limit_the_least_recently_read_going_first() -> None:
    kept = KeptBytes(10)
    kept.put("a", b"aaaa")
    kept.put("b", b"bbbb")
    assert kept.get("a") == b"aaaa"  # a is now the most recently read
    kept.put("c", b"cccc")  # 12 bytes: b goes
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (b"aaaa", None, b"cccc")
    kept.put("d", b"d" * 11)  # larger than the limit: never kept, nothing dropped for it
    assert (kept.get("d"), kept.get("a"), kept.get("c")) == (None, b"aaaa", b"cccc")
