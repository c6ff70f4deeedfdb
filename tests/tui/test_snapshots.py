"""Snapshot tests: every view of the synthetic run at 100x30 and 160x45, compared with
tests/tui/snapshots/<view>-<size>.svg (see snapshot.py; UPDATE_TUI_SNAPSHOTS=1 rewrites them).
The same screens carry the checks of test_narrow.py's footer, durations and collectives tests
(those run in the slow tier): a property that holds whatever the stored picture is."""

from __future__ import annotations

import pytest
from snapshot import check_snapshot, svg_text
from textual.widgets import DataTable
from tui_helpers import DURATION, cells, column_lines, drive, press

# name -> keys pressed after the overview loaded
SCREENS = {
    "overview": (),
    "recompiles": ("2",),
    "ops": ("3",),
    "transfers": ("4",),
    "divergence": ("5",),
    "steps": ("6",),
    "memory": ("7",),
    "collectives": ("8",),
    "fit": ("9",),
    "hlo_node": ("5", "down", "enter"),
    "hlo_diff": ("2", "v"),
    "help": ("2", "question_mark"),
}
# the narrowest terminal every view is made for, and a common wide one
SIZES = {"100x30": (100, 30), "160x45": (160, 45)}
# the screens whose footer must fit 100 columns and name every view key (test_narrow.py's
# footer test, in the slow tier: these snapshots make its checks on the same screens)
FOOTER_CHECKED = ("overview", "recompiles", "ops", "divergence", "collectives", "hlo_node", "hlo_diff")


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", list(SCREENS))
def test_screen_snapshot(make_app, name, size):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, *SCREENS[name])
        svg = app.export_screenshot()
        if size == "100x30" and name in FOOTER_CHECKED:
            footer = svg_text(svg).split("\n")[-1]
            assert footer.rstrip().endswith("q Quit"), footer
            assert "? Keys" in footer
            assert "1-9 Views" in footer  # the number keys, as one range
        if name == "recompiles":  # test_narrow.py's durations test (slow tier): no duration cut
            ranked = app.screen.query_one("#ranked", DataTable)
            if "time" in [c.value for c in ranked.columns]:
                for cell in cells(column_lines(app, ranked, "time")):
                    assert DURATION.match(cell), cell
        if name == "steps":  # the same test's second view
            steps = app.screen.query_one("#steps", DataTable)
            for key in ("time", "compile_time"):
                for cell in cells(column_lines(app, steps, key)):
                    assert DURATION.match(cell), (key, cell)
        if name == "collectives":  # test_narrow.py's collectives test (slow tier)
            ops = app.screen.query_one("#cl-ops", DataTable)
            # the synthetic all-gather sends 75497472 bytes per device: 72 MiB
            assert cells(column_lines(app, ops, "sent")) == ["768 B", "72.00 MiB"]
            assert cells(column_lines(app, ops, "at")) == ["train.py:13", "train.py:11"]
            collective = " ".join(cells(column_lines(app, ops, "collective")))
            assert "all-gather (f32[1024,4096], f32[4096,4096], f32[4096,1024])" in collective
        check_snapshot(svg, f"{name}-{size}")

    drive(app, scenario, size=SIZES[size])
