"""Snapshot tests: every view of the synthetic run at 100x30 and 160x45, compared with
tests/tui/snapshots/<view>-<size>.svg (see snapshot.py; UPDATE_TUI_SNAPSHOTS=1 rewrites them)."""

from __future__ import annotations

import pytest
from snapshot import check_snapshot
from tui_helpers import drive, press

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


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", list(SCREENS))
def test_screen_snapshot(make_app, name, size):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, *SCREENS[name])
        check_snapshot(app.export_screenshot(), f"{name}-{size}")

    drive(app, scenario, size=SIZES[size])
