"""Snapshot tests: the main screens of the synthetic run at 120x36, compared with
tests/tui/snapshots/*.svg (see snapshot.py; UPDATE_TUI_SNAPSHOTS=1 rewrites them)."""

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
    "hlo_node": ("5", "down", "enter"),
    "hlo_diff": ("2", "v"),
    "help": ("2", "question_mark"),
}


@pytest.mark.parametrize("name", list(SCREENS))
def test_screen_snapshot(make_app, name):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, *SCREENS[name])
        check_snapshot(app.export_screenshot(), name)

    drive(app, scenario)
