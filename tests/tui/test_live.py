"""Following a run that is still being recorded: new events show up, the end is noticed."""

from __future__ import annotations

import time

from synthetic_run import FINAL, SOURCE, write_synthetic_run
from textual.widgets import DataTable
from tpu_debug.core.records import TransferInfo
from tpu_debug.tracers import events as ev
from tui_helpers import drive, press, settle


async def _until(pilot, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the TUI did not catch up with the run"
        await pilot.pause(0.05)
        await settle(pilot)


def _count(app, kind: str) -> int:
    kinds = app.screen.query_one("#kinds", DataTable)
    if kind not in kinds.rows:
        return 0
    return int(str(kinds.get_cell(kind, "count")).replace(",", ""))


def test_follows_a_running_run_until_it_ends(tmp_path, make_app):
    run_dir = tmp_path / "20260131T120000.000Z-live"
    _, writer = write_synthetic_run(run_dir, close=False)
    app = make_app(run_dir, poll_interval=0.05)
    assert app.follow

    async def scenario(pilot):
        assert "running" in app.sub_title and "following live" in app.sub_title
        assert _count(app, "transfer") == 27
        loc = ev.SourceLocation(str(SOURCE), 22, "main")
        for i in range(5):
            writer.put(
                ev.TransferEvent(writer.new_id(), 9.0 + i, None, 1, loc, TransferInfo("d2h", 4, (), "float32", "item", 1e-4), op="item", implicit=True)
            )
        writer.flush()
        await _until(pilot, lambda: _count(app, "transfer") == 32)
        await press(pilot, "4")  # a view opened later loads the current state
        assert sum(s.count for s in app.screen.sites) == 32
        writer.put(
            ev.TransferEvent(writer.new_id(), 20.0, None, 1, loc, TransferInfo("d2h", 4, (), "float32", "item", 1e-4), op="item", implicit=True)
        )
        writer.close(FINAL)
        await _until(pilot, lambda: not app.follow)
        await settle(pilot)
        assert "finished" in app.sub_title and "following" not in app.sub_title
        assert sum(s.count for s in app.screen.sites) == 33  # the current view reloaded

    drive(app, scenario)
