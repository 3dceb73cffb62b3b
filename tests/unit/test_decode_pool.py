"""Rows events decoded in worker processes (`orchestrator.binlog.pool`): real workers give what
the capture's own decoding gives, a row the decoder cannot read is named by its event, and a
table's buffer names that event's position (`orchestrator.pipeline.capture.pooled`)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pytest

from orchestrator.binlog import pool
from orchestrator.binlog.batch import FastDecoding
from orchestrator.binlog.events import RowsLayout
from orchestrator.binlog.reader import RowsEvent
from orchestrator.pipeline.capture.buffer import CaptureTable
from orchestrator.pipeline.capture.pooled import DecodeFailed, PooledBuffer
from orchestrator.positions import BinlogPosition
from tests.unit.test_rowdecode import INFO, ROWS, TABLE_MAP, image

#: (op, row images, first row kept) of three events: inserts, an update of two rows, a delete.
EVENTS = [
    ("I", b"".join(image(r) for r in ROWS), 0),
    ("U", image(ROWS[0]) + image(ROWS[2]) + image(ROWS[3]) + image(ROWS[1]), 1),
    ("D", image(ROWS[2]), 0),
]


def in_process(events: list[tuple[str, bytes, int]]) -> list[pa.Array]:
    """What the capture's own decoding makes of the events."""
    decoding = FastDecoding(INFO, (0,), lambda raw: raw)
    images: list[Any] = []
    keys: list[Any] = []
    shape = None
    for op, body, first in events:
        event = RowsEvent(
            "db.t", op, "b.1", 1, body, RowsLayout(5, True, 0, len(body)), TABLE_MAP, None
        )  # type: ignore[arg-type]
        shape, rows, old = decoding.rows(event)
        images += rows[first:]
        keys += old[first:]
    return decoding.arrays(shape, images, keys)


def test_workers_decode_as_the_capture_does() -> None:
    job = pool.job_of(INFO, (0,), TABLE_MAP, EVENTS)
    with pool.DecodePool(2) as workers:
        results = [workers.submit(job).result(timeout=60) for _ in range(3)]
    expected = in_process(EVENTS)
    for decoded in results:
        assert decoded.error is None
        assert decoded.counts == (4, 1, 1)  # the update's first pair left out
        assert [a.to_pylist() for a in decoded.arrays] == [a.to_pylist() for a in expected]
    assert decoded.arrays[4].to_pylist()[0] == 2**64 - 1  # BIGINT UNSIGNED, as DECIMAL(20, 0)


def test_a_row_that_cannot_be_read_names_its_event() -> None:
    cut = [EVENTS[0], ("I", image(ROWS[0])[:-3], 0)]  # its row runs past the bytes there are
    decoded = pool.decode(pool.job_of(INFO, (0,), TABLE_MAP, cut))
    assert decoded.failed_at == 1 and decoded.error is not None and decoded.arrays == ()
    assert decoded.counts == (4,)


class _Given:
    """A pool that answers each job with the next of ``answers``."""

    def __init__(self, answers: list[pool.Decoded]) -> None:
        self.answers = answers

    def submit(self, job: pool.Job) -> Future[pool.Decoded]:
        future: Future[pool.Decoded] = Future()
        future.set_result(self.answers.pop(0))
        return future


def rows_event(op: str, body: bytes, end: int) -> RowsEvent:
    return RowsEvent(
        "db.t",
        op,
        "b.000007",
        end,
        b"xx" + body,
        RowsLayout(5, True, 2, 2 + len(body)),
        TABLE_MAP,
        None,
    )  # type: ignore[arg-type]


def test_the_buffer_numbers_rows_from_their_events_and_names_a_failing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = CaptureTable(INFO, ("id",), BinlogPosition("b.000001", 4))
    decoding = FastDecoding(INFO, (0,), lambda raw: raw)
    good = pool.decode(pool.job_of(INFO, (0,), TABLE_MAP, EVENTS))
    monkeypatch.setattr("orchestrator.pipeline.capture.pooled.JOB_BYTES", 1)  # a job an event
    answers = [pool.decode(pool.job_of(INFO, (0,), TABLE_MAP, [e])) for e in EVENTS]
    buffer = PooledBuffer(table, decoding, _Given(answers))  # type: ignore[arg-type]
    for (op, body, first), end in zip(EVENTS, (100, 200, 300), strict=True):
        buffer.add(rows_event(op, body, end), 7, first, 0)
    assert buffer.counted() == 6 and len(buffer) == 6 and buffer.first_position() == (7, 100)
    drained = buffer.drain().table
    assert drained.column("_tm_pos").to_pylist() == [100] * 4 + [200, 300]
    assert drained.column("_tm_row").to_pylist() == [0, 1, 2, 3, 1, 0]  # from each event's first
    assert drained.column("_tm_op").to_pylist() == ["I"] * 4 + ["U", "D"]
    assert drained.column("id").to_pylist() == good.arrays[0].to_pylist()

    failing = pool.Decoded((4,), (), ValueError("cut short"), 1)
    buffer = PooledBuffer(table, decoding, _Given([failing]))  # type: ignore[arg-type]
    monkeypatch.setattr("orchestrator.pipeline.capture.pooled.JOB_BYTES", 1 << 20)
    for (op, body, first), end in zip(EVENTS, (100, 200, 300), strict=True):
        buffer.add(rows_event(op, body, end), 7, first, 0)
    with pytest.raises(DecodeFailed) as failed:
        buffer.drain()
    assert (failed.value.file, failed.value.end) == (7, 200)
    assert isinstance(failed.value.cause, ValueError)


@pytest.mark.parametrize(
    ("entry", "imported"),
    [
        ("runpy.run_module('orchestrator.binlog.worker', run_name='__main__')", "False"),
        ("import orchestrator.binlog.pool", "True"),  # the control: the decoding modules alone
    ],
)
def test_a_worker_imports_no_pandas(entry: str, imported: str) -> None:
    """A worker's decoding modules convert a value at import: the worker's entry
    (`orchestrator.binlog.worker`) has pyarrow look for pandas first, with pandas refused."""
    probe = f"import runpy, sys\n{entry}\nprint('pandas' in sys.modules, file=sys.stderr)"
    env = {k: v for k, v in os.environ.items() if k != "_AIRFLOW_PARSING_CONTEXT_DAG_ID"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        stdin=subprocess.DEVNULL,  # no job: the worker's loop ends at once
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.split()[-1:] == [imported]
