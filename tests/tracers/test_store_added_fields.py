"""A run recorded before a field was added to its event still opens: the field reads as its
declared default, or as the older columns it is declared to be read from (a reader of a newer
version must not refuse the older runs it says it reads)."""

from __future__ import annotations

import sqlite3

import torch

import tpu_debug
from tpu_debug.core.desync import RankCall
from tpu_debug.core.records import CollectiveInfo, DesyncInfo, TransferInfo
from tpu_debug.tracers.events import (
    CollectiveCallEvent,
    CollectiveDesyncEvent,
    MemorySummaryEvent,
    SourceLocation,
    TargetStepEvent,
    TransferEvent,
)
from tpu_debug.tracers.reading.memory_view import memory_view
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter


def test_a_column_missing_from_an_older_run_reads_as_the_fields_default(tmp_path):
    with tpu_debug.trace(logdir=tmp_path / "runs", memory=True) as session:
        model = torch.nn.Linear(16, 16).to("tpu")
        model(torch.randn(4, 16, device="tpu")).sum().backward()
    db = session.run_dir / "run.db"
    conn = sqlite3.connect(db)
    try:  # the run as a reader before these fields existed wrote it
        conn.execute("ALTER TABLE memory_summaries DROP COLUMN trains")
        conn.execute("ALTER TABLE memory_summaries DROP COLUMN temp_live_bytes")
        conn.commit()
    finally:
        conn.close()
    s = memory_view(tpu_debug.open_run(session.run_dir)).summary
    assert s is not None and s.peak_bytes > 0
    defaults = {f: MemorySummaryEvent.__dataclass_fields__[f].default for f in ("trains", "temp_live_bytes")}
    assert (s.trains, s.temp_live_bytes) == (defaults["trains"], defaults["temp_live_bytes"])


def test_target_steps_of_an_older_run_read_in_the_step_numbering(tmp_path):
    """Runs recorded before target steps took the StepEvent index kept them in a ``step``
    column counted from 1, 0 being the whole run: read back, they are numbered as the run's
    steps, and the whole run says so."""
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    for step, unfinished, whole in ((0, False, False), (1, False, False), (2, True, False)):
        writer.put(TargetStepEvent(writer.new_id(), 1.0, None, 1, None, "v5e", step, 4, 4, 1e-3, 8e6, 4e3,
                                   0.25, 1 << 20, unfinished, whole))
    writer.close()
    conn = sqlite3.connect(db)
    try:  # the layout before: step counted from 1, no whole_run column
        conn.execute("ALTER TABLE target_steps ADD COLUMN step INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE target_steps SET step = step_index + 1")
        conn.execute("ALTER TABLE target_steps DROP COLUMN step_index")
        conn.execute("ALTER TABLE target_steps DROP COLUMN whole_run")
        # and an older run without step marks: its one record, the whole run, was step 0
        conn.execute("INSERT INTO events (id, kind, ts, thread, name, seconds) VALUES (99, 'target_step', 2.0, 1, "
                     "'v5e', 1e-3)")
        conn.execute("INSERT INTO target_steps (event_id, step, executions, estimated, flops, "
                     "bytes_accessed, unfinished) VALUES (99, 0, 2, 2, 8e6, 4e3, 0)")
        conn.commit()
    finally:
        conn.close()
    steps = RunQuery(db).events("target_step")
    assert [(s.step, s.unfinished, s.whole_run) for s in steps] == [
        (0, False, False), (1, False, False), (2, True, False), (0, False, True)
    ]


def test_events_that_carry_a_runtime_record_read_from_runs_of_the_layout_before(tmp_path):
    """A transfer, a collective call and a desync recorded before events kept the whole runtime
    record (schema 7: a transfer kept only its cause under ``op``, a call its shapes as text, a
    desync no message and each rank's shapes joined by "; ") read back with the record filled in
    as the old columns allow."""
    db = tmp_path / "run.db"
    writer = RunWriter(db, {"name": "demo"})
    loc = SourceLocation("train.py", 3, "main")
    writer.put(TransferEvent(writer.new_id(), 1.0, None, 1, loc, TransferInfo("d2h", 4, (), "float32", "item", 1e-4),
                             "item", True))
    writer.put(CollectiveCallEvent(writer.new_id(), 1.1, None, 1, loc, CollectiveInfo(
        "allreduce", "0", (0, 1), 0, 1, ((4, 2), (3,)), "float32", 44, "SUM")))
    writer.put(CollectiveDesyncEvent(writer.new_id(), 1.2, None, 1, loc, DesyncInfo(
        "0", (0, 1), 0, 1, "shapes", "cause", (RankCall(0, shapes=("[4]", "[2, 3]")), RankCall(1, shapes=())),
        None, "the ranks differ")))
    writer.close()
    conn = sqlite3.connect(db)
    try:  # schema 7's columns
        conn.execute("ALTER TABLE transfers DROP COLUMN runtime_op")
        conn.execute("ALTER TABLE collective_calls ADD COLUMN shapes TEXT NOT NULL DEFAULT ''")
        conn.execute("""UPDATE collective_calls SET shapes = '["[4, 2]", "[3]"]'""")
        conn.execute("ALTER TABLE collective_calls DROP COLUMN shape_dims")
        conn.execute("ALTER TABLE collective_desyncs DROP COLUMN message")
        conn.execute("ALTER TABLE collective_desync_calls ADD COLUMN shapes TEXT NOT NULL DEFAULT ''")
        conn.execute("UPDATE collective_desync_calls SET shapes = '[4]; [2, 3]' WHERE rank = 0")
        conn.execute("ALTER TABLE collective_desync_calls DROP COLUMN shape_list")
        conn.execute("PRAGMA user_version = 7")
        conn.commit()
    finally:
        conn.close()
    q = RunQuery(db)
    (transfer,) = q.events("transfer")
    assert (transfer.op, transfer.transfer.op, transfer.nbytes) == ("item", "item", 4)  # the cause stands in
    (call,) = q.events("collective_call")
    assert (call.shapes, call.ranks, call.group) == (((4, 2), (3,)), (0, 1), "0")
    (desync,) = q.events("collective_desync")
    assert [c.shapes for c in desync.calls] == [("[4]", "[2, 3]"), ()]
    assert desync.message == "" and desync.reason == "shapes"
    q.close()
