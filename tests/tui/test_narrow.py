"""The views at a 100x30 terminal (and 160x45): the columns that matter stay, no value is
cut, every key is in the footer or the help screen."""

from __future__ import annotations

import re

import pytest
from rich.text import Text
from synthetic_run import GRAPH, LENGTHS
from textual.widgets import DataTable
from tpu_debug.tui.widgets.fit_table import Col, plan_columns
from tui_helpers import DURATION, cells, column_lines, drive, press, screen_text

NARROW = (100, 30)
WIDE = (160, 45)
VIEW_KEYS = {
    "1": "Overview",
    "2": "Recompiles",
    "3": "Ops",
    "4": "Transfers",
    "5": "Divergence",
    "6": "Steps",
    "7": "Memory",
    "8": "Collectives",
    "9": "Fit",
}


def test_recompiles_at_100x30_shows_the_counts_and_whole_shape_changes(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        ranked = app.screen.query_one("#ranked", DataTable)
        # mul.Tensor compiled once per distinct length, the first compile is not a recompile
        distinct = len(set(LENGTHS))
        compiles = cells(column_lines(app, ranked, "compiles"))
        assert compiles[0] == str(distinct)
        assert cells(column_lines(app, ranked, "recompiles"))[0] == str(distinct - 1)
        names = " ".join(cells(column_lines(app, ranked, "name")))
        assert GRAPH in names  # wrapped over two rows, never cut
        history = app.screen.query_one("#history", DataTable)
        changed = " ".join(cells(column_lines(app, history, "changed")))
        # the second compile's change, wrapped in its column but whole (the pane shows the
        # first rows only)
        assert f"f32[{LENGTHS[0]},128] → f32[{LENGTHS[1]},128]" in changed

    drive(app, scenario, size=NARROW)


# twin in the default tier: test_snapshots.py::test_screen_snapshot[recompiles-*] and [steps-*]
# make these checks on the same views at both sizes
@pytest.mark.slow
@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["100x30", "160x45"])
def test_durations_are_never_cut(make_app, size):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        shown = [c.value for c in app.screen.query_one("#ranked", DataTable).columns]
        if "time" in shown:
            for cell in cells(column_lines(app, app.screen.query_one("#ranked", DataTable), "time")):
                assert DURATION.match(cell), cell
        await press(pilot, "6")
        steps = app.screen.query_one("#steps", DataTable)
        for key in ("time", "compile_time"):
            for cell in cells(column_lines(app, steps, key)):
                assert DURATION.match(cell), (key, cell)

    drive(app, scenario, size=size)


# twin in the default tier: test_snapshots.py::test_screen_snapshot[collectives-*] makes these
# checks on the same view at both sizes
@pytest.mark.slow
@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["100x30", "160x45"])
def test_collectives_show_bytes_and_the_source_line(make_app, size):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "8")
        ops = app.screen.query_one("#cl-ops", DataTable)
        # the synthetic all-gather sends 75497472 bytes per device: 72 MiB
        assert cells(column_lines(app, ops, "sent")) == ["768 B", "72.00 MiB"]
        assert cells(column_lines(app, ops, "at")) == ["train.py:13", "train.py:11"]
        collective = " ".join(cells(column_lines(app, ops, "collective")))
        assert "all-gather (f32[1024,4096], f32[4096,4096], f32[4096,1024])" in collective

    drive(app, scenario, size=size)


# twin in the default tier: test_snapshots.py::test_screen_snapshot[<screen>-100x30] makes these
# checks on the footer of the same seven screens (FOOTER_CHECKED there), at no cost of its own
@pytest.mark.slow
@pytest.mark.parametrize("keys", [(), ("2",), ("3",), ("5",), ("8",), ("5", "down", "enter"), ("2", "v")])
def test_the_footer_fits_100_columns_and_names_every_view_key(make_app, keys):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, *keys)
        footer = screen_text(app).split("\n")[-1]
        assert footer.rstrip().endswith("q Quit"), footer
        assert "? Keys" in footer
        assert f"1-{len(VIEW_KEYS)} Views" in footer  # the number keys, as one range

    drive(app, scenario, size=NARROW)


def test_help_lists_every_view_key_at_100x30(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "8", "question_mark")
        text = screen_text(app)
        for key, title in VIEW_KEYS.items():
            assert re.search(rf"\b{key}\s+{title}\b", text), (key, title)
        assert re.search(r"\br\s+Ranks", text)

    drive(app, scenario, size=NARROW)


def test_the_number_keys_open_their_views(make_app):
    app = make_app()

    async def scenario(pilot):
        for key, title in VIEW_KEYS.items():
            await press(pilot, key)
            assert app.current_mode == title.lower()

    drive(app, scenario, size=NARROW)


def _rows(*widths: int) -> list[list[Text]]:
    return [[Text("x" * w) for w in widths]]


def test_plan_keeps_every_column_when_they_fit():
    cols = [Col("a", "a"), Col("b", "b", drop=1)]
    assert plan_columns(cols, _rows(5, 5), width=20, pad=1) == {"a": 5, "b": 5}


def test_plan_wraps_a_descriptive_column_before_leaving_one_out():
    cols = [Col("name", "name", shrink=6), Col("n", "n", drop=1)]
    # 20 + 2 + 3 + 2 = 27 cells; 20 available: the name wraps to 20 - (3 + 2) - 2 = 13
    assert plan_columns(cols, _rows(20, 3), width=20, pad=1) == {"name": 13, "n": 3}


def test_plan_leaves_out_the_least_important_first():
    cols = [Col("name", "name", shrink=6), Col("x", "x", drop=2), Col("y", "y", drop=1), Col("n", "n")]
    # 8 + 12 + 12 + 5 = 37 cells: y (drop 1) goes, then 25 cells fit (no column grows)
    assert plan_columns(cols, _rows(6, 10, 10, 3), width=30, pad=1) == {"name": 6, "x": 10, "n": 3}


def test_plan_leaves_out_an_optional_descriptive_column_before_wrapping():
    cols = [Col("what", "what", shrink=8), Col("sig", "sig", drop=1, shrink=8)]
    # both fit at their minimum (20), not at their natural width (34): sig goes, what stays whole
    assert plan_columns(cols, _rows(14, 16), width=25, pad=1) == {"what": 14}


def test_the_columns_refit_when_the_terminal_is_resized(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        ranked = app.screen.query_one("#ranked", DataTable)
        assert cells(column_lines(app, ranked, "mode"))[0] == "eager"  # wide: every column
        await pilot.resize_terminal(*NARROW)
        await press(pilot)
        shown = [c.value for c in ranked.columns]
        assert "mode" not in shown and "compiles" in shown, shown
        assert cells(column_lines(app, ranked, "compiles"))[0] == str(len(set(LENGTHS)))
        await pilot.resize_terminal(*WIDE)
        await press(pilot)
        assert "mode" in [c.value for c in ranked.columns]

    drive(app, scenario, size=WIDE)
