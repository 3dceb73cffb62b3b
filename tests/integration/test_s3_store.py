"""Storage and `doctor` against a real S3 endpoint (moto's server): the endpoint, region and
keys of ``output.s3`` are the ones pyarrow uses, with no ``AWS_*`` variable set; `doctor` writes
and removes a probe object and names the endpoint and region it used."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.preflight import writable
from orchestrator.lake import storage
from orchestrator.lake.iceberg_io import DurableFileIO
from orchestrator.lake.writer import write_table
from orchestrator.pipeline.segments import write_segment
from tests.conftest import load_pipeline, pipeline_config, s3_output, write_config
from tests.services import MotoS3

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _no_aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing but the config says where the store is."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)


def _configure(tmp_path: Path, mariadb: LocalMariaDB, s3_server: MotoS3, s3_bucket: str) -> None:
    """A pipeline with staging and lake in ``s3_bucket`` loaded: its ``output.s3`` is what
    `storage` uses."""
    load_pipeline(tmp_path, mariadb, [{"name": "a.b"}], output=s3_output(s3_server, s3_bucket))


def test_storage_goes_to_the_configured_endpoint(
    mariadb: LocalMariaDB, s3_server: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    _configure(tmp_path, mariadb, s3_server, s3_bucket)
    root = f"s3://{s3_bucket}/lake"
    storage.write_atomic(storage.join(root, "t", "_tidemark", "current.json"), b"{}\n")
    assert s3_server.keys(s3_bucket) == ["lake/t/_tidemark/current.json"]
    assert storage.read_bytes(f"s3a://{s3_bucket}/lake/t/_tidemark/current.json") == b"{}\n"
    assert storage.list_files(storage.join(root, "t"), recursive=True) == []  # _ names hidden
    storage.delete_tree(storage.join(root, "t"))
    assert [k for k in s3_server.keys(s3_bucket) if not k.endswith("/")] == []  # dir markers


def test_each_small_file_is_one_put_and_no_directory_is_an_object(
    mariadb: LocalMariaDB, s3_server: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """A data file, a segment and a manifest: one PUT each (no multipart upload for a file of
    one part), no other request (a written file's size is the bytes written, not asked of the
    store), and no empty marker object for any of their directories."""
    _configure(tmp_path, mariadb, s3_server, s3_bucket)
    log = s3_server.root / "moto.log"
    mark = log.stat().st_size
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    write_table(f"s3://{s3_bucket}/lake/a/b/data/v000001-c0000.parquet", rows)
    fs, path = storage.filesystem(f"s3a://{s3_bucket}/staging/r1/changes/a.b/seg-000001.parquet")
    write_segment(fs, path, rows)
    storage.write_atomic(f"s3://{s3_bucket}/lake/a/b/_tidemark/current.json", b"{}\n")
    lines = log.read_bytes()[mark:].decode(errors="replace")
    sent = re.findall(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) ', lines)  # ANSI
    assert sent == [
        ("PUT", f"/{s3_bucket}/lake/a/b/data/v000001-c0000.parquet"),
        ("PUT", f"/{s3_bucket}/staging/r1/changes/a.b/seg-000001.parquet"),  # no rename
        ("PUT", f"/{s3_bucket}/lake/a/b/_tidemark/current.json"),
    ]
    assert sorted(s3_server.keys(s3_bucket)) == [
        "lake/a/b/_tidemark/current.json",
        "lake/a/b/data/v000001-c0000.parquet",
        "staging/r1/changes/a.b/seg-000001.parquet",
    ]


def test_doctor_writes_and_removes_a_probe_object_naming_endpoint_and_region(
    mariadb: LocalMariaDB, s3_server: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path, mariadb, [{"name": "mysql.db"}], output=s3_output(s3_server, s3_bucket)
        ),
    )
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    where = f"endpoint {s3_server.endpoint}, region us-east-1, path-style addressing"
    lines = [
        line for line in done.stdout.splitlines() if "probe object written and removed" in line
    ]
    assert len(lines) == 2 and all(where in line for line in lines), done.stdout
    assert not [k for k in s3_server.keys(s3_bucket) if "probe" in k], "the probes are removed"
    # A bucket that does not exist: the check fails naming the endpoint and what to check.
    missing = writable("output", "output.path", "s3://no-such-bucket-here/lake")
    assert not missing.ok
    assert "endpoint AWS (us-east-1)" in missing.detail and "check output.s3" in missing.fix


def _requests(log: Path, mark: int) -> list[tuple[str, str]]:
    lines = log.read_bytes()[mark:].decode(errors="replace")
    return re.findall(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) ', lines)  # ANSI


def test_publish_requests_on_s3(
    mariadb: LocalMariaDB, s3_server: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """What publish asks of the store, request by request: a staging file moved into the lake is
    one server-side copy (its source goes with the run's staging directory, in one bulk delete);
    a file looked for is one request; an Iceberg file written knows its length, and one that
    must not replace another is looked for once."""
    _configure(tmp_path, mariadb, s3_server, s3_bucket)
    log = s3_server.root / "moto.log"
    root = f"s3://{s3_bucket}"
    write_table(f"{root}/staging/r1/reconciled/g0.parquet", pa.table({"id": [1, 2]}))
    mark = log.stat().st_size
    storage.adopt(f"{root}/staging/r1/reconciled/g0.parquet", f"{root}/lake/a/b/data/v1.parquet")
    assert storage.file_exists(f"{root}/lake/a/b/data/v1.parquet")
    assert not storage.file_exists(f"{root}/lake/a/b/data/v2.parquet")
    assert _requests(log, mark) == [
        ("PUT", f"/{s3_bucket}/lake/a/b/data/v1.parquet"),  # a copy, made by the store
        ("HEAD", f"/{s3_bucket}/lake/a/b/data/v1.parquet"),
        ("HEAD", f"/{s3_bucket}/lake/a/b/data/v2.parquet"),
    ]
    assert storage.read_bytes(f"{root}/lake/a/b/data/v1.parquet") == storage.read_bytes(
        f"{root}/staging/r1/reconciled/g0.parquet"
    )

    io = DurableFileIO()
    written = io.new_output(f"{root}/lake/a/b/metadata/00001-ab.metadata.json")
    mark = log.stat().st_size
    with written.create(overwrite=False) as out:
        out.write(b'{"format-version": 2}')
    assert len(written) == 21
    assert _requests(log, mark) == [
        ("HEAD", f"/{s3_bucket}/lake/a/b/metadata/00001-ab.metadata.json"),  # not there: write
        ("PUT", f"/{s3_bucket}/lake/a/b/metadata/00001-ab.metadata.json"),
    ]
    with pytest.raises(FileExistsError, match=re.escape("00001-ab.metadata.json")):
        io.new_output(f"{root}/lake/a/b/metadata/00001-ab.metadata.json").create(overwrite=False)
