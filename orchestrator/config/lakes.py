"""What a loaded config says about the files Tidemark writes under its lake and staging paths,
for code given only a file's URI (`orchestrator.lake.writer`), as `objectstore` does for
buckets: `register` when a config is parsed, `integer_encoding` for a file about to be written.
A process may load several configs (tests, the DAG processor): each path keeps its own.
`place` spells a storage URI one way, for any table of places kept by URI."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from urllib.parse import urlsplit

#: `OutputConfig.integer_encoding`'s values: the first is the default.
INTEGER_ENCODINGS = ("delta", "plain")

_ENCODINGS: dict[str, str] = {}
_LOCK = threading.Lock()


def place(uri: str) -> str:
    """``uri`` as one spelling of its place, ending in ``/``: an absolute local path, or
    ``scheme://authority/path`` with ``s3a`` spelled ``s3``.

    >>> place("file:///tmp/lake/"), place("s3a://b/lake"), place("s3://b/lake/x.parquet")
    ('/tmp/lake/', 's3://b/lake/', 's3://b/lake/x.parquet/')
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return os.path.abspath(uri).rstrip("/") + "/"
    scheme = scheme.lower()
    if scheme == "file":
        return os.path.abspath(urlsplit(uri).path).rstrip("/") + "/"
    return f"{'s3' if scheme == 's3a' else scheme}://{rest.strip('/')}/"


def register(encoding: str, roots: Sequence[str]) -> None:
    """Remember ``encoding`` (a config's ``output.integer_encoding``) for every file under
    ``roots`` (its lake and staging paths)."""
    with _LOCK:
        for root in roots:
            _ENCODINGS[place(root)] = encoding


def integer_encoding(uri: str) -> str:
    """The ``output.integer_encoding`` of the registered path holding ``uri`` (the deepest, where
    one pipeline's path is inside another's), else the default."""
    spelled = place(uri)
    with _LOCK:
        roots = [root for root in _ENCODINGS if spelled.startswith(root)]
        return _ENCODINGS[max(roots, key=len)] if roots else INTEGER_ENCODINGS[0]
