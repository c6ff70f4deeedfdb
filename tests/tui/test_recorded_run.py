"""Pilot tests on a run recorded for real (tpu_debug.trace around a loop whose input
length changes): every view opens and shows what the recording holds."""

from __future__ import annotations

import re

from textual.widgets import DataTable, Static
from tpu_debug.tui.screens import HloDiffScreen, HloScreen, OpsScreen, RecompilesScreen
from tpu_debug.tui.widgets import HloView, PagedTable, SourceView
from tui_helpers import drive, press, screen_text, widget_text

import tpu_debug


def test_recorded_run_in_every_view(make_app, recorded_run):
    app = make_app(recorded_run)

    async def scenario(pilot):
        text = screen_text(app)
        assert "tpu-debug · recorded" in text and "XLA CPU" in text
        # a loop without optimizer: its iterations are the steps; the ops compile for each
        # new length while it warms up, then the sequence repeats: nothing to fix
        assert "4 (loop); warm-up 0-2" in text, text
        assert "nothing to fix" in text

        await press(pilot, "2")
        screen = app.screen
        assert isinstance(screen, RecompilesScreen)
        ranked = screen.query_one("#ranked", DataTable)
        keys = [str(k.value) for k in ranked.rows]
        assert "eager\0mul.Tensor" in keys
        ranked.move_cursor(row=keys.index("eager\0mul.Tensor"))
        await press(pilot, "tab")
        history = screen.query_one("#history", PagedTable)
        assert history.row_count == 3  # lengths 4, 5, 6
        why = widget_text(screen.query_one("#why", Static))
        assert why.startswith("compile 2 of mul.Tensor")
        signature = next(line for line in why.splitlines() if line.startswith("signature: "))
        assert "5,8" in signature
        # a recompile shows what changed (recorded, or computed from its arguments)
        assert re.search(r"^  .*4,8.* → .*5,8", why, re.MULTILINE), why
        excerpt = screen.query_one("#source", SourceView).excerpt
        assert "y = x * w + 1.0" in excerpt.lines[excerpt.location.line - excerpt.first]
        assert "HloModule" in screen.query_one("#hlo-preview", HloView).lines[0]
        await press(pilot, "h")
        assert isinstance(app.screen, HloScreen) and "5,8" in "\n".join(
            app.screen.query_one("#hlo", HloView).lines
        )
        await press(pilot, "escape", "v")
        assert isinstance(app.screen, HloDiffScreen) and app.screen.diff.changed > 0
        await press(pilot, "escape")

        await press(pilot, "3")
        assert isinstance(app.screen, OpsScreen)
        rows = {(r.name, r.mode): r for r in app.screen.rows}
        assert rows[("mul.Tensor", "eager")].compiles == 3 and rows[("mul.Tensor", "eager")].count >= 4
        assert any(mode == "compiled" for _, mode in rows)

        await press(pilot, "4")
        sites = app.screen.sites
        item = [s for s in sites if s.op == "item"]
        assert item and all(s.implicit for s in item) and sum(s.count for s in item) == 8

        await press(pilot, "5")
        assert "no divergence was recorded" in screen_text(app)

    drive(app, scenario)


def test_the_ops_view_shows_the_reports_ops_rows(make_app, fallback_run):
    from tpu_debug.report import report_data

    app = make_app(fallback_run)
    with tpu_debug.open_run(fallback_run) as session:
        report = {(o["name"], o["mode"]): o for o in report_data(session)["ops"]}

    async def scenario(pilot):
        await press(pilot, "3")
        assert isinstance(app.screen, OpsScreen)
        shown = {(r.name, r.mode): r for r in app.screen.rows}
        assert shown.keys() == report.keys()
        for key, r in shown.items():
            o = report[key]
            assert (r.count, r.seconds, r.compiles, r.fallbacks, r.programs) == (
                o["count"], o["seconds"], o["compiles"], o["fallbacks"], o["programs"]), key

    drive(app, scenario)
    # the op with no lowering is one row of both: its three calls, each run on the CPU
    squash = report[("squash", "eager")]
    assert (squash["count"], squash["fallbacks"], squash["compiles"], squash["programs"]) == (3, 3, 0, 0)
    assert squash["seconds"] > 0
    # the device's ops are there too (x * 2 + 1 at each call), with no fallback calls
    assert report[("mul.Tensor", "eager")]["count"] >= 3 and report[("add.Tensor", "eager")]["count"] >= 3
    assert all(o["fallbacks"] == 0 for key, o in report.items() if key != ("squash", "eager"))
