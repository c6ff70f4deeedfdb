"""The memory view (key 6): device bytes per step, the peak's holders by allocating line, the
fit against a TPU target with its fixes; and what it says for a run without memory tracking."""

from __future__ import annotations

import dataclasses

import pytest
import synthetic_run
from snapshot import check_snapshot
from textual.widgets import DataTable
from tpu_debug.tracers import events as ev
from tpu_debug.tui.screens.memory import NOT_TRACKED
from tui_helpers import drive, press, screen_text

MiB = 1024**2
GiB = 1024**3
SOURCE = str(synthetic_run.SOURCE)
HOLDERS = (
    ev.MemoryHolder(SOURCE, 12, "main", "forward", 9 * GiB, 3, (1024, 2359296), "float32"),
    ev.MemoryHolder(SOURCE, 20, "step", "optimizer", 6 * GiB, 6, (1024, 1048576), "float32"),
    ev.MemoryHolder(SOURCE, 16, "step", "backward", 3 * GiB, 3, (1024, 786432), "float32"),
    ev.MemoryHolder("", 0, "", "before trace", 64 * MiB, 2, (), ""),
)
FIXES = (
    ev.MemoryFix("chips", 5 * GiB, 4.0, True, "v5e-4"),
    ev.MemoryFix("bfloat16", 10 * GiB, 0.5, True),
    ev.MemoryFix("batch", 18 * GiB, 0.0, False),
)
STEP_PEAKS = (12 * GiB, 18 * GiB, 18 * GiB + 64 * MiB, 18 * GiB)


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    """The synthetic run with a memory trace against a v5e that does not fit."""
    run_dir = tmp_path_factory.mktemp("tui-memory") / "20260131T120000.000Z-memory"
    _db, writer = synthetic_run.write_synthetic_run(run_dir, close=False)
    nid = writer.new_id
    for i, peak in enumerate(STEP_PEAKS):
        holders = HOLDERS if i == 2 else ()
        writer.put(ev.MemoryStepEvent(nid(), float(i), None, 1, None, step=i, live_bytes=15 * GiB,
                                      peak_bytes=peak, peak_ts=i + 0.5, tensors=14, holders=holders))
    writer.put(ev.MemorySummaryEvent(
        nid(), 4.0, None, 1, None, peak_bytes=STEP_PEAKS[2], peak_step=2, end_bytes=15 * GiB, steps=4,
        persistent_bytes=15 * GiB, activation_bytes=3 * GiB, float32_bytes=18 * GiB, temp_bytes=512 * MiB,
        required_bytes=STEP_PEAKS[2] + 512 * MiB, dry_run=False, programs=0, oom_programs=0,
        temp_program="mm", temp_source="target", target="v5e", capacity_bytes=16 * GiB, fits=False,
        holders=HOLDERS))
    writer.put(ev.MemoryFindingEvent(nid(), 4.0, None, 1, None, "does_not_fit", "v5e", STEP_PEAKS[2] + 512 * MiB,
                                     16 * GiB, None, HOLDERS[:3], FIXES))
    writer.put(synthetic_run.peak_program(nid()))
    gradient = ev.ProgramBuffer("gradient", 2 * GiB, 2 * GiB, "f32", (512, 1048576), "fusion.1", "fusion",
                                "mm|aten::mm.default", 1, 4, SOURCE, 16, "step")
    writer.put(dataclasses.replace(synthetic_run.peak_program(nid(), status="ok"), name="g1/backward",
                                   total_bytes=2 * GiB, buffers=(gradient,), kinds=("gradient",),
                                   kind_bytes=(2 * GiB,), unused_bytes=0))
    writer.close(synthetic_run.FINAL)
    assert writer.error is None, writer.error
    return run_dir


def test_the_memory_view_shows_steps_holders_and_fixes(make_app, memory_run):
    app = make_app(memory_run)

    async def scenario(pilot):
        await press(pilot, "7")
        text = screen_text(app)
        assert "peak 18.06 GiB held by tpu tensors in step 2 of 4" in text, text
        assert "does NOT fit" in text and "one v5e device" in text
        assert "4 step(s)" in text and "(step 2)" in text
        # the holders at the peak, biggest first, each by its line
        holders = app.screen.query_one("#holders", DataTable)
        rows = [" ".join(str(c) for c in holders.get_row_at(i)) for i in range(holders.row_count)]
        assert [r.split("train.py:")[1].split()[0] if "train.py:" in r else "-" for r in rows] == ["12", "20", "16", "-"]
        assert "optimizer" in rows[1] and "float32[1024, 1048576]" in rows[1]
        assert "fix: 4 chips (v5e-4)" in text and "fix: bfloat16 instead of float32" in text
        check_snapshot(app.export_screenshot(), "memory")

    drive(app, scenario)


def test_the_memory_view_shows_each_programs_buffers_at_its_peak(make_app, memory_run):
    app = make_app(memory_run)

    async def scenario(pilot):
        await press(pilot, "7")
        text = screen_text(app)
        # the refused program first: its peak, then its buffers by kind with their lines
        assert "g3/forward on v5e: 20.00 GiB at its peak" in text, text
        assert "program 1 of 2" in text
        buffers = app.screen.query_one("#peak-buffers", DataTable)
        rows = [[str(c) for c in buffers.get_row_at(i)] for i in range(buffers.row_count)]
        assert rows[0][:3] == ["activations kept for backward", "8.00 GiB", "train.py:12"]
        assert rows[1][:3] == ["temporaries", "6.00 GiB", "train.py:16"]
        assert rows[-1][0] == "heap fragmentation"
        await press(pilot, "p")
        assert "g1/backward on v5e: 2.00 GiB" in screen_text(app)
        await press(pilot, "p")
        assert "g3/forward on v5e" in screen_text(app)

    drive(app, scenario, size=(160, 60))


def test_a_run_without_memory_tracking_says_how_to_get_it(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "7")
        text = " ".join(screen_text(app).split())
        assert " ".join(NOT_TRACKED.split())[:60] in text, text

    drive(app, scenario)


def test_the_memory_view_at_100x30_keeps_where_and_how_much(make_app, memory_run):
    app = make_app(memory_run)

    async def scenario(pilot):
        await press(pilot, "7")
        holders = app.screen.query_one("#holders", DataTable)
        shown = [c.value for c in holders.columns]
        assert shown[0] == "where" and "bytes" in shown, shown
        check_snapshot(app.export_screenshot(), "memory-run-100x30")

    drive(app, scenario, size=(100, 30))
