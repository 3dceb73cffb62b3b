"""Where staging and output live: local paths and ``file://``, ``s3://``, ``s3a://``, ``hdfs://``
URIs.

One URI names a place for both sides of the engine: Python-side IO goes through
`pyarrow.fs` (`filesystem`), Spark gets the same place as a Hadoop URI
(`spark_uri`). Plain paths are local; ``file://`` URIs are local and are not
percent-decoded (``file:///tmp/a b`` is the directory ``/tmp/a b``), which is
also how Hadoop reads them.

Small files that readers must never see half-written (manifests) go through
`write_atomic`:

- local: write ``.<name>.tmp-<random>`` in the same directory, fsync, then
  ``os.replace`` over the target (atomic on POSIX) and fsync the directory;
- ``s3a://``: a single PUT; S3 makes an object visible whole or not at all, so
  readers see the old or the new manifest, never a mix;
- ``hdfs://`` (and any store whose rename does not overwrite): write the new
  content beside the target as ``_<name>.new-<token>``, rename the target aside to
  ``_<name>.old-<token>`` (never delete it first), rename the new file in, then
  delete the old one. A crash leaves either the old target, or - between the two
  renames - no target but both complete files of one token; `recover_atomic`
  (which `orchestrator.lake.manifest` calls when ``current.json`` is missing)
  finishes that switch, so no crash loses the manifest. A reader may briefly
  find no file between the renames; it must then retry. Data files are immutable
  and never need this.

>>> join("s3a://lake/warehouse/", "shop", "orders")
's3a://lake/warehouse/shop/orders'
>>> join("/var/lake", "shop/", "/orders")
'/var/lake/shop/orders'
>>> spark_uri("s3a://lake/x")
's3a://lake/x'
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.config import lakes, objectstore
from orchestrator.config.sections import STORAGE_SCHEMES
from orchestrator.lake.kept_bytes import KeptBytes

#: Schemes this module knows (`validate` refuses others); anything else is refused with a message
#: naming it.
SCHEMES = STORAGE_SCHEMES


def _split(uri: str) -> tuple[str, str]:
    """(scheme, rest) with scheme "" for a plain path."""
    if "://" not in uri:
        return "", uri
    scheme, rest = uri.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(
            f"unsupported storage URI scheme `{scheme}://` in {uri!r}; "
            f"use a local path or one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    return scheme, rest


def is_local(uri: str) -> bool:
    """True for plain paths and ``file://`` URIs."""
    return _split(uri)[0] in ("", "file")


def local_path(uri: str) -> str:
    """The absolute local path of a plain path or ``file://`` URI.

    >>> local_path("file:///tmp/a b")
    '/tmp/a b'
    """
    scheme, rest = _split(uri)
    if scheme == "":
        return os.path.abspath(rest)
    if scheme != "file":
        raise ValueError(f"{uri!r} is not a local path")
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    if not rest.startswith("/"):
        raise ValueError(f"file URI must be absolute (file:///...), got {uri!r}")
    return os.path.normpath(rest)


def attempt_tag() -> str:
    """A name part unique to one writer attempt. Files named with it are never written by
    another process, so a writer that lost the pipeline lock cannot overwrite what the new
    owner relies on (docs/design.md "One writer").

    >>> len(attempt_tag()), attempt_tag() != attempt_tag()
    (8, True)
    """
    return uuid.uuid4().hex[:8]


def join(base: str, *parts: str) -> str:
    """Join path segments onto a path or URI with ``/``, keeping the scheme."""
    out = base.rstrip("/") if base not in ("/", "") else base
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}" if not out.endswith("/") else out + part
    return out


def parent(uri: str) -> str:
    """The directory holding ``uri``.

    >>> parent("s3a://lake/a/b/")
    's3a://lake/a'
    """
    stripped = uri.rstrip("/")
    head, _, _ = stripped.rpartition("/")
    if not head:
        return "/" if stripped.startswith("/") else "."
    return head if not head.endswith(":/") else stripped


def basename(uri: str) -> str:
    """The last segment of ``uri``.

    >>> basename("hdfs://nn:8020/lake/t/data/v000001-c0000.parquet")
    'v000001-c0000.parquet'
    """
    return uri.rstrip("/").rpartition("/")[2]


def spark_uri(uri: str) -> str:
    """The same place as a Hadoop URI for Spark (local paths become ``file://``)."""
    if is_local(uri):
        return "file://" + local_path(uri)
    scheme, rest = _split(uri)
    return f"s3a://{rest}" if scheme == "s3" else uri


def _remote_filesystem(scheme: str, authority: str) -> pafs.FileSystem:
    if scheme in ("s3", "s3a"):
        s3 = objectstore.settings_for(f"s3://{authority}/")
        return _s3_filesystem(s3, objectstore.credentials(s3))
    return _hdfs_filesystem(authority)


@functools.lru_cache(maxsize=16)
def _s3_filesystem(
    s3: objectstore.S3Config, creds: objectstore.Credentials | None
) -> pafs.FileSystem:
    # Built directly, region given: from_uri would look the bucket's region up over the network.
    return pafs.S3FileSystem(**objectstore.pyarrow_options(s3, creds))


@functools.lru_cache(maxsize=16)
def _hdfs_filesystem(authority: str) -> pafs.FileSystem:
    fs, _ = pafs.FileSystem.from_uri(f"hdfs://{authority}/")
    return fs


#: The local filesystem (it holds no state: one serves every local path).
_LOCAL = pafs.LocalFileSystem()


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The `pyarrow.fs` filesystem and the path inside it for ``uri``.

    S3 takes its endpoint, region and addressing from the ``output.s3`` of the config that named
    the bucket, and its credentials from the variables that names or the AWS default chain
    (`orchestrator.config.objectstore`); HDFS needs libhdfs.
    """
    scheme, rest = _split(uri)
    if scheme in ("", "file"):
        return _LOCAL, local_path(uri)
    authority = urlsplit(f"{scheme}://{rest}").netloc
    fs = _remote_filesystem(scheme, authority)
    if scheme == "hdfs":
        return fs, urlsplit(uri).path or "/"
    return fs, rest.rstrip("/")


def parquet_rows(uri: str, fs: pafs.FileSystem | None = None) -> int:
    """The row count of a Parquet file, from its footer (``uri`` is a path in ``fs`` when given)."""
    if fs is None:
        fs, uri = filesystem(uri)
    with fs.open_input_file(uri) as handle:
        return int(pq.read_metadata(handle).num_rows)


def parquet_schema(uri: str) -> pa.Schema:
    """The Arrow schema of a Parquet file, from its footer (field metadata included)."""
    with open_parquet(uri) as handle:
        return pq.read_schema(handle)


def parquet_footer(uri: str) -> pq.FileMetaData:
    """The footer of a Parquet file: its schema (`FileMetaData.schema`), row groups, statistics;
    read from the store even when `open_parquet` keeps the file (publish asks it of a staging
    file to learn whether the file is still there)."""
    fs, path = filesystem(uri)
    with fs.open_input_file(path) as handle:
        return pq.read_metadata(handle)


#: A Parquet file on an object store of up to `WHOLE_BYTES` is fetched whole when `open_parquet`
#: first opens it, and its bytes kept for the next opens in this process (`WHOLE`). Opening a
#: file there costs a request for its size, one for its footer and one per read after it: the
#: rewrite of a changed small table opened its base file three times (its field IDs, its keys for
#: the row count, its rows), 8 requests, now 2. Tidemark never writes a Parquet file twice under
#: one name (data files are named by version and attempt, staging files by attempt), so kept
#: bytes stay the file's; a writer still drops a name it writes (`forget_parquet`).
WHOLE_BYTES = 1 << 20
WHOLE = KeptBytes(32 << 20)  # by `lakes.place`


@contextlib.contextmanager
def open_parquet(uri: str) -> Iterator[pa.NativeFile]:
    """A Parquet file opened for reading: local files as they are; a small one on an object
    store from memory (`WHOLE_BYTES`)."""
    fs, path = filesystem(uri)
    if is_local(uri):
        with fs.open_input_file(path) as handle:
            yield handle
        return
    key = lakes.place(uri)
    data = WHOLE.get(key)
    if data is None:
        with fs.open_input_file(path) as handle:
            if handle.size() > WHOLE_BYTES:
                yield handle
                return
            data = handle.read_buffer()
        WHOLE.put(key, data)
    with pa.BufferReader(data) as reader:
        yield reader


def forget_parquet(uri: str) -> None:
    """Drop what `open_parquet` kept of ``uri``: a file is about to be written there."""
    WHOLE.forget(lakes.place(uri))


#: Footers handed from the step that read them to the next step that needs them, in the same
#: process (`keep_footer`, `kept_footer`), at most `KEPT_FOOTERS`, the oldest dropped first.
KEPT_FOOTERS = 4096
_FOOTERS: dict[str, tuple[pq.FileMetaData, int]] = {}  # by `lakes.place`
_FOOTERS_LOCK = threading.Lock()


def keep_footer(uri: str, footer: pq.FileMetaData, nbytes: int) -> None:
    """Remember the footer and size of the Parquet file at ``uri`` for `kept_footer`: publish
    reads a staging file's footer to check its schema and moves the file's bytes to ``uri``
    unchanged; the Iceberg commit then lists the file from this footer instead of reading it
    again (two requests on an object store)."""
    key = lakes.place(uri)
    with _FOOTERS_LOCK:
        _FOOTERS.pop(key, None)
        _FOOTERS[key] = (footer, nbytes)
        while len(_FOOTERS) > KEPT_FOOTERS:
            del _FOOTERS[next(iter(_FOOTERS))]


def kept_footer(uri: str) -> tuple[pq.FileMetaData, int] | None:
    """The footer and size `keep_footer` remembered for ``uri`` (forgotten once given), or
    None."""
    key = lakes.place(uri)
    with _FOOTERS_LOCK:
        return _FOOTERS.pop(key, None)


def tree_bytes(uris: Sequence[str]) -> int:
    """Bytes of the Parquet files given (a directory: every Parquet file under it)."""
    total = 0
    for uri in uris:
        if is_file(uri):
            total += size(uri)
        else:
            total += sum(size(f) for f in list_files(uri, suffix=".parquet", recursive=True))
    return total


def table_dir(root: str, table: str) -> str:
    """A table's directory under the output root (docs/output.md, "Output layout").

    >>> table_dir("s3a://lake", "shop.orders")
    's3a://lake/shop/orders'
    """
    database, name = table.split(".", 1)
    return join(root, database, name)


def _uri_for(base: str, base_path: str, path: str) -> str:
    """Map a path found under ``base_path`` back to the URI style of ``base``."""
    relative = path[len(base_path) :].lstrip("/")
    return join(base, relative)


def exists(uri: str) -> bool:
    """Whether a file or directory exists at ``uri``."""
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def is_file(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type == pafs.FileType.File)


def file_exists(uri: str) -> bool:
    """Whether a file exists at ``uri`` (a directory there counts as none): one request on an
    object store, where `exists` and `is_file` make two for a missing key (pyarrow looks for a
    directory of that name next)."""
    fs, path = filesystem(uri)
    try:
        fs.open_input_stream(path).close()
    except FileNotFoundError:
        return False
    except OSError:  # a directory there (local disk, HDFS)
        return is_file(uri)
    return True


def list_files(uri: str, *, suffix: str = "", recursive: bool = False) -> list[str]:
    """Data files under a directory, sorted; ``[]`` when it does not exist.

    Hidden and bookkeeping files (names starting with ``.`` or ``_``, such as
    Spark's ``_SUCCESS`` and ``.crc`` files) are left out.
    """
    fs, path = filesystem(uri)
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
    found = []
    for info in fs.get_file_info(selector):
        relative = info.path[len(path) :].lstrip("/")
        if info.type != pafs.FileType.File or not info.base_name.endswith(suffix):
            continue
        if any(part.startswith((".", "_")) for part in relative.split("/")):
            continue
        found.append(_uri_for(uri, path, info.path))
    return sorted(found)


def parquet_files(uri: str) -> list[str]:
    """The Parquet files a read chunk's path holds: the path itself when it names one (a chunk
    the driver read: `orchestrator.pipeline.read.local`), else the files under the directory (a
    Spark job's part files), sorted.

    >>> parquet_files("/nowhere/c000001-a1b2-db.t.parquet")
    ['/nowhere/c000001-a1b2-db.t.parquet']
    """
    return [uri] if uri.endswith(".parquet") else list_files(uri, suffix=".parquet")


def list_dirs(uri: str) -> list[str]:
    """Names of the directories directly under ``uri``, sorted; ``[]`` when it does not exist."""
    fs, path = filesystem(uri)
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
    return sorted(
        i.base_name for i in fs.get_file_info(selector) if i.type == pafs.FileType.Directory
    )


def size(uri: str) -> int:
    """Size of a file in bytes."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(uri)
    return int(info.size or 0)


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.read())


def read_if_exists(uri: str) -> bytes | None:
    """A file's bytes, or None when there is no file at ``uri``: one request, where `exists`
    then `read_bytes` make two (a run reads thousands of small manifests and plans)."""
    try:
        return read_bytes(uri)
    except FileNotFoundError:
        return None


def makedirs(uri: str) -> None:
    fs, path = filesystem(uri)
    fs.create_dir(path, recursive=True)


def parent_made(fs: pafs.FileSystem, path: str) -> None:
    """``path``'s parent directory made on ``fs`` before a file is written there, where
    directories exist apart from their files. An object store's are only its keys' prefixes:
    pyarrow would write an empty marker object for each level (a request each, and one more for
    the bucket), for every file."""
    if not isinstance(fs, pafs.S3FileSystem):
        fs.create_dir(parent(path), recursive=True)


def delete_tree(uri: str) -> None:
    """Remove a directory and everything under it; nothing happens when it is absent."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def delete_file(uri: str) -> None:
    """Remove one file; nothing happens when it is absent."""
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def move(source: str, target: str) -> None:
    """Rename a file or directory (a copy on object stores); the target's parent is created."""
    fs, src = filesystem(source)
    _, dst = filesystem(target)
    parent_made(fs, dst)
    fs.move(src, dst)


def adopt(source: str, target: str) -> None:
    """Move a finished file to ``target`` (replacing it): a rename where both are on one
    filesystem; within one S3 bucket a copy made by the store, the source left for its
    directory's removal (a delete there is two requests: pyarrow writes a marker object for the
    directory it may have emptied); else a copy and a delete of the source."""
    fs, src = filesystem(source)
    target_fs, dst = filesystem(target)
    if type(fs) is type(target_fs) and _authority(source) == _authority(target):
        if isinstance(fs, pafs.S3FileSystem):
            fs.copy_file(src, dst)
        else:
            move(source, target)
        return
    parent_made(target_fs, dst)
    pafs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=target_fs)
    fs.delete_file(src)


def _authority(uri: str) -> str:
    scheme, rest = _split(uri)
    return "" if scheme in ("", "file") else urlsplit(f"{scheme}://{rest}").netloc


def write_atomic(uri: str, data: bytes) -> None:
    """Write a small file so readers see either the old or the new content whole.

    See the module docstring for how each store does it.
    """
    scheme, _ = _split(uri)
    if scheme in ("", "file"):
        _write_atomic_local(Path(local_path(uri)), data)
        return
    fs, path = filesystem(uri)
    if scheme in ("s3", "s3a"):
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    replace_by_renames(fs, path, data)


def _aside(path: str, kind: str, token: str) -> str:
    return f"{parent(path)}/_{basename(path)}.{kind}-{token}"


def replace_by_renames(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """`write_atomic` where rename does not overwrite: new beside, old aside, new in, old gone."""
    token = uuid.uuid4().hex
    new, old = _aside(path, "new", token), _aside(path, "old", token)
    with fs.open_output_stream(new) as out:
        out.write(data)
    moved_aside = fs.get_file_info(path).type != pafs.FileType.NotFound
    if moved_aside:
        fs.move(path, old)
    fs.move(new, path)
    if moved_aside:
        fs.delete_file(old)


def recover_atomic(uri: str, fs: pafs.FileSystem | None = None) -> bool:
    """Finish a `replace_by_renames` a crash interrupted between its renames: the target is
    missing and a token has both its new and its old file; the new one (complete: it was
    closed before the old one moved) becomes the target. Returns whether it did."""
    if fs is None:
        fs, path = filesystem(uri)
    else:
        path = uri
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return False
    prefix = f"_{basename(path)}."
    try:
        siblings = fs.get_file_info(pafs.FileSelector(parent(path)))
    except FileNotFoundError:
        return False
    names = {info.base_name: info for info in siblings}
    pairs = [
        info
        for name, info in names.items()
        if name.startswith(prefix + "new-") and f"{prefix}old-{name[len(prefix) + 4 :]}" in names
    ]
    if not pairs:
        return False
    newest = max(pairs, key=lambda info: (info.mtime_ns or 0, info.base_name))
    token = newest.base_name[len(prefix) + 4 :]
    fs.move(_aside(path, "new", token), path)
    fs.delete_file(_aside(path, "old", token))
    return True


def sync(uris: Sequence[str]) -> None:
    """Put local files and directories on disk (fsync: a file's bytes and size, a directory's
    names); other stores' writes are durable when acknowledged, and are skipped. A directory is
    synced after the files and directories created in it."""
    for uri in uris:
        if not is_local(uri):
            continue
        fd = os.open(local_path(uri), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def makedirs_durable(uri: str) -> None:
    """A local directory made with each one it creates on disk (its parent synced after it);
    nothing for other stores, whose directories are made by the writes into them."""
    if not is_local(uri):
        return
    path, missing = Path(local_path(uri)), []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir()
        sync([str(created.parent)])


def _write_atomic_local(target: Path, data: bytes) -> None:
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        out = open(tmp, "wb")  # noqa: SIM115  # closed below
    except FileNotFoundError:  # the directory is made on the first write into it
        makedirs_durable(str(target.parent))
        out = open(tmp, "wb")  # noqa: SIM115
    try:
        with out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    sync([str(target.parent)])
