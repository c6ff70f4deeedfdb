"""A run recorded before a field was added to its event still opens: the field reads as its
declared default (a reader of a newer version must not refuse older runs of the same schema)."""

from __future__ import annotations

import sqlite3

import torch

import tpu_debug
from tpu_debug.tracers.events import MemorySummaryEvent
from tpu_debug.tracers.memory import memory_view


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
