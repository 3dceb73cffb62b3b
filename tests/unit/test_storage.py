"""Storage URIs and local file operations (no server, no Spark)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from orchestrator.lake import storage
from orchestrator.lake.kept_bytes import KeptBytes
from orchestrator.lake.manifest import current_uri, find_manifest


@pytest.mark.parametrize(
    ("base", "parts", "joined"),
    [
        ("/var/lake", ("shop", "orders"), "/var/lake/shop/orders"),
        ("/var/lake/", ("/shop/", "orders/"), "/var/lake/shop/orders"),
        ("file:///var/lake", ("shop",), "file:///var/lake/shop"),
        ("s3a://bucket", ("a", "b.parquet"), "s3a://bucket/a/b.parquet"),
        ("hdfs://nn:8020/lake", ("t", "", "data"), "hdfs://nn:8020/lake/t/data"),
        ("/", ("x",), "/x"),
    ],
)
def test_join(base: str, parts: tuple[str, ...], joined: str) -> None:
    assert storage.join(base, *parts) == joined


@pytest.mark.parametrize(
    ("uri", "parent", "name"),
    [
        ("/var/lake/shop/orders", "/var/lake/shop", "orders"),
        ("s3a://bucket/a/b/", "s3a://bucket/a", "b"),
        ("s3a://bucket/a", "s3a://bucket", "a"),
        ("hdfs://nn:8020/lake/x.json", "hdfs://nn:8020/lake", "x.json"),
        ("/top", "/", "top"),
    ],
)
def test_parent_and_basename(uri: str, parent: str, name: str) -> None:
    assert storage.parent(uri) == parent
    assert storage.basename(uri) == name


@pytest.mark.parametrize(
    ("uri", "spark"),
    [
        ("/tmp/a b/c", "file:///tmp/a b/c"),
        ("file:///tmp/x", "file:///tmp/x"),
        ("s3a://bucket/k", "s3a://bucket/k"),
        ("s3://bucket/k", "s3a://bucket/k"),
        ("hdfs://nn/lake", "hdfs://nn/lake"),
    ],
)
def test_spark_uri(uri: str, spark: str) -> None:
    assert storage.spark_uri(uri) == spark


def test_relative_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert storage.spark_uri("lake/t") == f"file://{tmp_path}/lake/t"
    assert storage.local_path("file:///tmp/a b/../c") == "/tmp/c"


def test_unknown_scheme_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="gs://"):
        storage.filesystem("gs://bucket/x")
    with pytest.raises(ValueError, match="absolute"):
        storage.local_path("file://relative/x")


def test_object_store_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fs, path = storage.filesystem("s3a://bucket/lake/t/")
    assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/lake/t"
    assert (
        not storage.is_local("s3a://bucket/x")
        and storage.is_local("file:///x")
        and storage.is_local("x")
    )


@pytest.mark.parametrize("style", ["path", "uri"])
def test_local_files(tmp_path: Path, style: str) -> None:
    root = (
        str(tmp_path / "dir with space") if style == "path" else f"file://{tmp_path}/dir with space"
    )
    data = storage.join(root, "data")
    assert (
        not storage.exists(root)
        and storage.list_files(data) == []
        and storage.list_dirs(root) == []
    )
    storage.makedirs(data)
    for name in ("b.parquet", "a.parquet", "_SUCCESS", ".a.parquet.crc", "notes.txt"):
        Path(storage.local_path(storage.join(data, name))).write_bytes(b"12345")
    Path(storage.local_path(storage.join(data, "_tmp", "x.parquet"))).parent.mkdir()
    Path(storage.local_path(storage.join(data, "_tmp", "x.parquet"))).write_bytes(b"1")
    Path(storage.local_path(storage.join(data, "sub", "y.parquet"))).parent.mkdir()
    Path(storage.local_path(storage.join(data, "sub", "y.parquet"))).write_bytes(b"1")

    assert storage.list_files(data, suffix=".parquet") == [
        storage.join(data, "a.parquet"),
        storage.join(data, "b.parquet"),
    ]
    assert storage.list_files(data, suffix=".parquet", recursive=True)[-1] == storage.join(
        data, "sub", "y.parquet"
    )
    assert storage.list_dirs(data) == ["_tmp", "sub"]
    assert storage.is_file(storage.join(data, "a.parquet")) and not storage.is_file(data)
    assert storage.size(storage.join(data, "a.parquet")) == 5
    assert storage.read_bytes(storage.join(data, "a.parquet")) == b"12345"
    assert storage.read_if_exists(storage.join(data, "a.parquet")) == b"12345"
    assert storage.read_if_exists(storage.join(data, "none.json")) is None
    assert storage.read_if_exists(storage.join(root, "none", "x.json")) is None
    with pytest.raises(OSError):  # not a file, but something is there: an error, not "absent"
        storage.read_if_exists(data)

    storage.move(storage.join(data, "a.parquet"), storage.join(root, "moved", "deep", "a.parquet"))
    assert storage.exists(storage.join(root, "moved", "deep", "a.parquet"))
    assert not storage.exists(storage.join(data, "a.parquet"))
    storage.delete_file(storage.join(data, "b.parquet"))
    storage.delete_file(storage.join(data, "b.parquet"))  # absent: nothing happens
    storage.delete_tree(data)
    storage.delete_tree(data)
    assert not storage.exists(data) and storage.exists(root)
    with pytest.raises(FileNotFoundError):
        storage.size(data)


def test_write_atomic_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "meta" / "current.json"
    storage.write_atomic(str(target), b"first")
    assert target.read_bytes() == b"first"
    storage.write_atomic(f"file://{target}", b"second, longer")
    assert target.read_bytes() == b"second, longer"
    assert os.listdir(target.parent) == ["current.json"]


def test_write_atomic_failure_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "current.json"
    storage.write_atomic(str(target), b"old")

    def crash(src: str, dst: str) -> None:
        raise OSError("crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="crash before rename"):
        storage.write_atomic(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["current.json"]


class _CrashAfter:
    """A real local filesystem whose ``move`` dies (like the process would) after ``moves``
    moves."""

    def __init__(self, moves: int) -> None:
        self.fs = pafs.LocalFileSystem()
        self.moves = moves

    def __getattr__(self, name: str) -> object:
        return getattr(self.fs, name)

    def move(self, src: str, dest: str) -> None:
        if self.moves == 0:
            raise SystemExit("killed")
        self.moves -= 1
        self.fs.move(src, dest)


@pytest.mark.parametrize("moves", [0, 1])
def test_replace_by_renames_never_loses_the_target(tmp_path: Path, moves: int) -> None:
    """hdfs-style replacement (rename does not overwrite): a crash before or between the two
    renames leaves the old content or, once `recover_atomic` ran, the new one; never nothing."""
    target = tmp_path / "current.json"
    target.write_bytes(b"old")
    with pytest.raises(SystemExit):
        storage.replace_by_renames(_CrashAfter(moves), str(target), b"new")  # type: ignore[arg-type]
    assert target.exists() == (moves == 0)
    recovered = storage.recover_atomic(str(target), pafs.LocalFileSystem())
    assert recovered == (moves == 1)
    assert target.read_bytes() == (b"old" if moves == 0 else b"new")
    assert not [p.name for p in tmp_path.iterdir() if ".old-" in p.name]
    storage.replace_by_renames(pafs.LocalFileSystem(), str(target), b"newer")
    assert target.read_bytes() == b"newer"
    assert not storage.recover_atomic(str(target), pafs.LocalFileSystem())


def test_a_manifest_cut_between_renames_is_found(tmp_path: Path) -> None:
    """`find_manifest` finishes the interrupted switch instead of seeing no published table
    (whose next publish would start over and delete files retained versions share)."""
    tdir = tmp_path / "t"
    uri = current_uri(str(tdir))
    Path(uri).parent.mkdir(parents=True)
    Path(uri).write_text('{"version": 1}')
    with pytest.raises(SystemExit):
        storage.replace_by_renames(_CrashAfter(1), uri, b'{"version": 2}')  # type: ignore[arg-type]
    assert not Path(uri).exists()
    found = find_manifest(str(tdir))
    assert found is not None and found["version"] == 2


def test_a_kept_footer_is_given_once_under_any_spelling_of_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    footer = storage.parquet_footer(str(path))
    assert footer.num_rows == 3

    storage.keep_footer(str(path), footer, path.stat().st_size)
    kept = storage.kept_footer(f"file://{path}")  # the Iceberg commit's spelling
    assert kept is not None and kept[0].equals(footer) and kept[1] == path.stat().st_size
    assert storage.kept_footer(str(path)) is None  # given once

    monkeypatch.setattr(storage, "KEPT_FOOTERS", 2)
    for name in ("a", "b", "c"):
        storage.keep_footer(str(tmp_path / name), footer, 1)
    assert storage.kept_footer(str(tmp_path / "a")) is None  # the oldest dropped
    assert storage.kept_footer(str(tmp_path / "c")) is not None


class _Counting:
    """A local filesystem that counts the files opened for reading."""

    def __init__(self) -> None:
        self.local, self.opened = pafs.LocalFileSystem(), 0

    def open_input_file(self, path: str) -> pa.NativeFile:
        self.opened += 1
        return self.local.open_input_file(path)

    def __getattr__(self, name: str) -> object:
        return getattr(self.local, name)


def test_a_small_remote_parquet_file_is_fetched_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`storage.open_parquet` on an object store: a file up to `WHOLE_BYTES` is opened once and
    read from memory after; a bigger one each time; the least recently opened go first beyond
    the kept bytes' limit; a file written again is read anew."""
    from orchestrator.lake.writer import file_range, read_published, write_table

    fs = _Counting()
    monkeypatch.setattr(storage, "filesystem", lambda uri: (fs, str(uri)))
    monkeypatch.setattr(storage, "is_local", lambda uri: False)
    monkeypatch.setattr(storage, "WHOLE", KeptBytes(0))
    table = pa.table({"id": list(range(100)), "v": [f"v{i}" for i in range(100)]})
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    size = write_table(a, table)
    write_table(b, table)
    storage.WHOLE.limit = size * 3 // 2  # room for one file

    assert storage.parquet_schema(a).names == ["id", "v"]
    assert file_range(a, ["id"])["rows"] == 100
    assert sum(x.num_rows for x in read_published(a, table.schema)) == 100
    assert fs.opened == 1
    storage.parquet_schema(b)  # b is kept, a dropped
    storage.parquet_schema(b)
    storage.parquet_schema(a)
    assert fs.opened == 3
    storage.parquet_footer(a)  # publish's "is the staging file still there": always the store's
    assert fs.opened == 4

    write_table(a, table.slice(0, 10))  # the same name written again: read anew
    assert sum(x.num_rows for x in read_published(a, table.schema)) == 10
    assert fs.opened == 5
    assert storage.WHOLE.names() == [storage.lakes.place(a)]  # b went to make room

    monkeypatch.setattr(storage, "WHOLE_BYTES", size - 1)  # too big to keep
    storage.parquet_schema(b)
    storage.parquet_schema(b)
    assert fs.opened == 7
