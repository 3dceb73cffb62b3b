"""`doctor`'s checks of where a run writes: the output and staging locations, their free space,
and the state store. Each is one `Check`, like the source's.

A location passes when it can be created and a probe file written to it and removed again (on
an object store, a probe object; the check names the endpoint and region it used);
free space (local paths only: an object store has none to run out of) passes when it holds
the tables still to snapshot, estimated from information_schema's ``data_length`` times
`SPACE_MARGIN` (staging and output each hold a compressed copy, usually smaller than InnoDB's).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from orchestrator.config import PipelineConfig, objectstore
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.manifest import current_uri
from orchestrator.pipeline.context import table_dir
from orchestrator.source.check import Check
from orchestrator.source.connection import Source
from orchestrator.state.store import StateStore

#: Free space wanted per byte of InnoDB data still to snapshot.
SPACE_MARGIN = 1.5


def _why(exc: BaseException) -> str:
    """An OS error in a few words ("Permission denied: '/x'"), never a traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def object_store(uri: str) -> str:
    """Which object store ``uri`` is on, as `doctor` names it (never a secret): endpoint,
    region, addressing and where the keys come from; "" for other stores.

    >>> object_store("/var/lake")
    ''
    >>> print(object_store("s3://nobody-named-this/lake").replace(", ", ",\\n"))
    endpoint AWS (us-east-1),
    region us-east-1,
    virtual-hosted addressing,
    keys from the AWS default chain
    """
    if not objectstore.is_s3(uri):
        return ""
    s3 = objectstore.settings_for(uri)
    keys = (
        f"keys from ${s3.access_key_env} / ${s3.secret_key_env}"
        if s3.access_key_env
        else "keys from the AWS default chain"
    )
    addressing = "path-style" if s3.path_style else "virtual-hosted"
    region = objectstore.region(s3)
    endpoint = objectstore.endpoint(s3) or f"AWS ({region})"
    return f"endpoint {endpoint}, region {region}, {addressing} addressing, {keys}"


def writable(name: str, key: str, uri: str) -> Check:
    """Whether ``uri`` can be created and written: a probe file (an object on an object
    store), removed again; for an object store the check names the endpoint and region used."""
    probe = storage.join(uri, f".tidemark-probe-{os.getpid()}")
    store = object_store(uri)
    at = f" ({store})" if store else ""
    try:
        storage.makedirs_durable(uri)  # a local directory's name on disk (the lake's root)
        storage.makedirs(uri)
        storage.write_atomic(probe, b"probe\n")
        storage.delete_file(probe)
    except Exception as exc:  # any storage error is what the check reports
        fix = f"make it writable for this user, or point {key} elsewhere"
        if store:
            fix = (
                "check output.s3 (endpoint, region, path_style), the bucket and the keys' "
                f"permissions, or point {key} elsewhere"
            )
        return Check(name, False, f"{uri} cannot be written ({_why(exc)}){at}", fix)
    if store:
        return Check(name, True, f"{uri} is writable: a probe object written and removed{at}")
    return Check(name, True, f"{uri} is writable")


def _published(config: PipelineConfig, table: str) -> bool:
    try:
        return storage.exists(current_uri(storage.table_dir(config.output.path, table)))
    except OSError:  # an output path that cannot be listed: `writable` says why
        return False


def to_snapshot_bytes(config: PipelineConfig, source: Source, tables: Sequence[str]) -> int:
    """InnoDB data length of the pipeline's ``tables`` not published yet."""
    names = [t for t in tables if not _published(config, t)]
    if not names:
        return 0
    marks = ", ".join(["%s"] * len(names))
    rows = source.query(
        "SELECT COALESCE(SUM(data_length), 0) FROM information_schema.TABLES "
        f"WHERE CONCAT(table_schema, '.', table_name) IN ({marks})",
        names,
    )
    return int(rows[0][0] or 0)


def free_space(config: PipelineConfig, needed: int) -> list[Check]:
    """One check per local file system that output and staging live on."""
    checks = []
    seen: set[int] = set()
    for key, uri in (("output.path", config.output.path), ("output.staging", config.staging_path)):
        if not storage.is_local(uri):
            continue
        path = storage.local_path(uri)
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        device = os.stat(path).st_dev
        if device in seen:
            continue
        seen.add(device)
        free = shutil.disk_usage(path).free
        want = int(needed * SPACE_MARGIN)
        detail = f"{free / 2**20:,.0f} MiB free at {path}, about {want / 2**20:,.0f} MiB needed"
        checks.append(
            Check(
                f"free space {key}",
                free >= want,
                detail,
                "free space there or point it at a larger volume" if free < want else "",
            )
        )
    return checks


def state_store(config: PipelineConfig) -> Check:
    """Whether the state store opens (its tables created when new) and, for SQLite, whether
    its directory takes the journal files it writes next to the database."""
    try:
        store = StateStore(config.state.url)
        try:
            store.runs(config.pipeline, limit=1)
        finally:
            store.close()
        url = config.state.url
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            directory = os.path.dirname(url[len("sqlite:///") :]) or "."
            check = writable("state store", "state.url", directory)
            if not check.ok:
                return check
    except Exception as exc:  # any failure to open is what the check reports
        return Check(
            "state store",
            False,
            f"cannot be opened ({_why(exc)})",
            "make state.url's database (and, for SQLite, its directory) writable",
        )
    return Check("state store", True, "opens and is writable")


def iceberg_catalog(config: PipelineConfig, tables: Sequence[str] = ()) -> Check:
    """Whether the Iceberg catalog every table is committed to opens: a SQL catalog connects
    (its tables created when new, as the state store's are), a REST catalog answers for its
    configuration. A run that cannot open it fails where it first commits, after its reads. And,
    in a SQL catalog, that none of ``tables`` is a name the catalog has at another location
    (another lake's table: `orchestrator.lake.iceberg_owner`), which would fail at publish."""
    from orchestrator.lake import iceberg  # pyiceberg: imported by doctor, not by every command
    from orchestrator.lake.iceberg_owner import elsewhere

    name = config.output.catalog.name
    try:
        taken = elsewhere(iceberg.open_catalog(config), {t: table_dir(config, t) for t in tables})
    except RunFailed as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return Check(
            "Iceberg catalog",
            False,
            f"`{name}` cannot be opened ({type(cause).__name__}: {_why(cause)})",
            "check output.catalog's type and uri, and that its server is up and reachable",
        )
    finally:
        iceberg.close_catalogs()
    if taken:
        first = sorted(taken)[0]
        return Check(
            "Iceberg catalog",
            False,
            f"`{name}` has {len(taken)} of the pipeline's tables at another location, another "
            f"lake's: {first} at {taken[first]}"
            + (f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""),
            "give this pipeline its own output.catalog.name (pipelines writing different output "
            "paths need catalogs of their own); their publish would fail",
        )
    return Check("Iceberg catalog", True, f"`{name}` opens")


def lake_checks(config: PipelineConfig, source: Source, tables: Sequence[str]) -> list[Check]:
    """Every check of where a run writes (``tables``: the pipeline's, patterns expanded)."""
    checks = [writable("output", "output.path", config.output.path)]
    if config.staging_path != storage.join(config.output.path, "_staging") or not checks[0].ok:
        checks.append(writable("staging", "output.staging", config.staging_path))
    checks += free_space(config, to_snapshot_bytes(config, source, tables))
    checks.append(state_store(config))
    checks.append(iceberg_catalog(config, tables))
    return checks
