"""A run recorded before a field was added to its event still opens: the field reads as its
declared default (a reader of a newer version must not refuse older runs of the same schema)."""

from __future__ import annotations

import sqlite3

import torch

import tpu_debug
from tpu_debug.tracers.events import MemorySummaryEvent, TargetStepEvent
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
