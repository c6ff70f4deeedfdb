"""Pilot tests: every view of the synthetic run, reached and worked by keyboard and mouse."""

from __future__ import annotations

import pytest
from synthetic_run import GRAPH, ODD_OP
from textual.widgets import DataTable, Input, OptionList, Static
from tpu_debug.tui.screens import (
    DivergenceScreen,
    HelpScreen,
    HloDiffScreen,
    HloScreen,
    OpsScreen,
    OverviewScreen,
    RecompilesScreen,
    TransfersScreen,
)
from tpu_debug.tui.widgets import HloDiffView, HloView, PagedTable, SourceView
from tui_helpers import drive, press, screen_text, settle, widget_text


@pytest.mark.quick
def test_overview_shows_the_run_and_its_findings(make_app):
    app = make_app()

    async def scenario(pilot):
        assert isinstance(app.screen, OverviewScreen)
        text = screen_text(app)
        assert "tpu-debug · synthetic" in text
        assert "XLA CPU (cpu), 1 device(s)" in text
        assert "train.py --steps 8" in text
        assert "finished (exit status 0)" in text
        assert "8 (explicit); warm-up 0: 3 compiles; steady 7: 1.00 s/step, 8" in text
        # the advisor's findings, the most serious first, then by the time they cost
        findings = app.screen.query_one("#findings", OptionList)
        lines = [str(findings.get_option_at_index(i).prompt) for i in range(findings.option_count)]
        assert lines[0].startswith("✖ add.Tensor is the first op over tolerance against CPU at train.py:12")
        # one cause, one finding: the batch's size recompiled the graph, and the eager mul.Tensor
        # it feeds is a consequence under it
        assert any(
            "dim 0 of arg 0 of main (train.py) forward takes a new size in steady state (8, 9, 10, 11, 12, 16): "
            "7 recompiles of 2 ops in 5 steps" in line and "(+1 consequence)" in line
            for line in lines
        ), lines
        assert not any("of mul.Tensor takes a new size" in line for line in lines), lines
        assert any(".item() at train.py:22 waits for the device in 7 of 7 steady steps" in line for line in lines)
        assert any("nonzero has no tpu lowering and runs on CPU in 2 of 7 steady steps" in line for line in lines)
        # add.Tensor recompiled once in steady state (a baked-in scalar): paid once, no finding
        assert not any("'other'" in line for line in lines), lines
        assert "fix: compare this op's inputs on both sides" in text  # the selected finding's detail
        kinds = app.screen.query_one("#kinds", DataTable)
        assert [str(k.value) for k in kinds.rows] == [
            "collectives",
            "compile",
            "divergence",
            "fallback",
            "graph_break",
            "step",
            "transfer",
        ]

    drive(app, scenario)


@pytest.mark.quick
def test_number_keys_reach_every_view_and_back(make_app):
    app = make_app()

    async def scenario(pilot):
        for key, screen_type in (
            ("2", RecompilesScreen),
            ("3", OpsScreen),
            ("4", TransfersScreen),
            ("5", DivergenceScreen),
            ("1", OverviewScreen),
        ):
            await press(pilot, key)
            assert isinstance(app.screen, screen_type), key

    drive(app, scenario)


def test_enter_on_a_finding_opens_its_view(make_app):
    app = make_app()

    async def scenario(pilot):
        findings = app.screen.query_one("#findings", OptionList)
        assert app.focused is findings
        await press(pilot, "enter")  # the divergence, first
        assert isinstance(app.screen, DivergenceScreen)
        await press(pilot, "1", "down", "enter")  # a dynamic shape
        assert isinstance(app.screen, RecompilesScreen)
        await press(pilot, "1", "down", "down", "down", "enter")  # the .item() sync
        assert isinstance(app.screen, TransfersScreen)
        await press(pilot, "1")
        kinds = app.screen.query_one("#kinds", DataTable)
        kinds.focus()
        await press(pilot, "down", "down", "enter")  # divergence (after collectives, compile)
        assert isinstance(app.screen, DivergenceScreen)

    drive(app, scenario)


def test_recompiles_master_detail(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        screen = app.screen
        ranked = screen.query_one("#ranked", DataTable)
        history = screen.query_one("#history", PagedTable)
        assert ranked.row_count == 3
        assert [str(k.value).split("\0")[1] for k in ranked.rows] == ["mul.Tensor", GRAPH, "add.Tensor"]
        assert history.row_count == 6
        # the first recompile is selected: its key diff, source line and HLO
        assert history.cursor_row == 1
        why = widget_text(screen.query_one("#why", Static))
        assert why.startswith("compile 2 of mul.Tensor (eager)")
        assert "closest key: compile 1 (1 mismatch)" in why
        assert "computed here from the arguments" not in why  # the run recorded this diff
        text = screen_text(app)
        assert "f32[8,128] → f32[9,128]" in text
        excerpt = screen.query_one("#source", SourceView).excerpt
        assert (
            excerpt.location.line == 11
            and "hidden = batch * model.scale" in excerpt.lines[11 - excerpt.first]
        )
        assert "❱ 11" in text
        assert "f32[9,128]" in screen.query_one("#hlo-preview", HloView).lines[0]
        # down the history
        history.focus()
        await press(pilot, "down", "down", "down")
        assert widget_text(screen.query_one("#why", Static)).startswith("compile 5 of mul.Tensor")
        assert "f32[11,128] → f32[12,128]" in screen_text(app)
        # another op: the compiled graph, whose diff holds brackets shown literally
        ranked.focus()
        await press(pilot, "down")
        assert history.row_count == 3
        why = widget_text(screen.query_one("#why", Static))
        assert why.startswith(f"compile 2 of {GRAPH}, program g2/forward")
        text = screen_text(app)
        assert "L['batch'].size()[0] == 8 → failed" in text
        assert "changed: dim 0 of arg 0 (in all 2 recompiles; values: 8, 9, 10)" in text
        # the compiles in steady state are marked so, with the advisor's fix for the graph
        assert "1 steady" in text and "→ dim 0 of arg 0 of main (train.py) forward, the rows of each call" in text

    drive(app, scenario)


def test_recompiles_compile_time_pane(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        screen = app.screen
        assert not screen.query_one("#rc-time-box").display
        await press(pilot, "t")
        assert screen.query_one("#rc-time-box").display and not screen.query_one("#rc-hlo-box").display
        await settle(pilot)
        # compile 2 of mul.Tensor (a 9-row input): its wall time split into its measured phases
        text = widget_text(screen.query_one("#compile-time", Static))
        assert text.startswith("mul.Tensor: 54.00 ms")
        assert "lowering          10.00 ms  18.5%" in text and "XLA compile       39.00 ms  72.2%" in text
        assert "other              5.00 ms   9.3%" in text
        await press(pilot, "t")
        assert screen.query_one("#rc-hlo-box").display and not screen.query_one("#rc-time-box").display

    drive(app, scenario)


def test_recompiles_hlo_viewer_and_side_by_side_diff(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2", "tab")
        screen = app.screen
        assert app.focused is screen.query_one("#history", PagedTable)
        await press(pilot, "enter")
        assert isinstance(app.screen, HloScreen)
        assert "f32[9,128]" in "\n".join(app.screen.query_one("#hlo", HloView).lines)
        await press(pilot, "escape")
        assert app.screen is screen
        # v with nothing marked: against the closest previous key
        await press(pilot, "v")
        assert isinstance(app.screen, HloDiffScreen)
        diff = app.screen.diff
        assert diff.changed == 5
        assert "f32[8,128]" in diff.left[2] and "f32[9,128]" in diff.right[2]
        view = app.screen.query_one("#diff", HloDiffView)
        first = view.cursor_row
        await press(pilot, "n")
        assert view.cursor_row > first
        await press(pilot, "escape")
        # mark compile 2, go to compile 6, compare
        await press(pilot, "m", "down", "down", "down", "down", "v")
        assert isinstance(app.screen, HloDiffScreen)
        text = screen_text(app)
        assert "compile 2" in text and "compile 6" in text
        assert "f32[16,128]" in "\n".join(app.screen.diff.right)
        await press(pilot, "escape")

    drive(app, scenario)


def test_ops_sort_filter_and_hlo(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "3")
        screen = app.screen
        table = screen.query_one("#ops", DataTable)
        assert app.focused is table
        names = [r.name for r in screen.visible_rows()]
        assert names[0] == "nonzero"  # the slowest: a CPU fallback
        assert ODD_OP in screen_text(app)  # console markup in a name is shown as is
        await press(pilot, "k")
        assert [r.name for r in screen.visible_rows()][:2] == ["mul.Tensor", "add.Tensor"]
        await press(pilot, "k")
        assert screen.visible_rows()[-1].name == "mul.Tensor"
        await press(pilot, "slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"add")
        await press(pilot, "enter")
        assert [r.name for r in screen.visible_rows()] == ["add.Tensor"]
        assert app.focused is table
        await press(pilot, "enter")
        assert isinstance(app.screen, HloScreen)
        assert app.screen.loaded.text.name == "add.Tensor"
        await press(pilot, "escape", "escape")
        assert len(screen.visible_rows()) == 7  # 3 graph programs, 3 ops, 1 CPU fallback

    drive(app, scenario)


def test_ops_header_click_sorts(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "3")
        screen = app.screen
        table = screen.query_one("#ops", DataTable)
        # click the "fallbacks" header: x of that column in the header row
        x = sum(c.get_render_width(table) for c in list(table.columns.values())[:7]) + 2
        await pilot.click(table, offset=(x, 0))
        await settle(pilot)
        assert screen.sort_key == "fallbacks"
        assert screen.visible_rows()[0].name == "nonzero"

    drive(app, scenario)


def test_transfers_by_call_site_over_time(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "4")
        screen = app.screen
        sites = screen.sites
        assert [(s.op, s.implicit, s.count) for s in sites] == [
            ("item", True, 8),
            ("bool", True, 8),
            ("fallback:nonzero", True, 3),
            ("copy", False, 8),
        ]
        assert sum(sum(s.timeline) for s in sites) == 27
        text = screen_text(app)
        assert "27 transfers" in text and "19 implicit" in text
        assert "▲ implicit" in text
        assert 'print(f"step {i}: {loss.item():.4f}")' in text  # the selected site's line
        await press(pilot, "down", "down", "down")
        assert 'batch = batch.to("tpu")' in screen_text(app)

    drive(app, scenario)


def test_divergence_first_highlighted_and_node_hlo(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "5")
        screen = app.screen
        table = screen.query_one("#divergences", PagedTable)
        assert [(d.name, d.first) for d in screen.events][:2] == [("add.Tensor", True), ("mean", False)]
        assert table.cursor_row == 0
        text = screen_text(app)
        assert "first divergence: add.Tensor (eager, local, forward)" in text
        assert "▶ 1" in text
        # the compiled node "mean": its graph's HLO with the node's instructions marked
        await press(pilot, "down", "enter")
        hlo = app.screen
        assert isinstance(hlo, HloScreen)
        assert hlo.node == "mean" and hlo.loaded.text.name == "g3/forward"
        view = hlo.query_one("#hlo", HloView)
        marked = [view.lines[i] for i in view.marked_lines]
        assert len(marked) == 3 and all("reduce" in line for line in marked)
        assert "node mean: 3 instruction line(s) highlighted" in screen_text(app)
        # choose another node from the list
        nodes = hlo.query_one("#nodes", OptionList)
        nodes.focus()
        await press(pilot, "up", "up")
        assert hlo.node == "mul"
        assert [view.lines[i].strip().split(" ")[0] for i in view.marked_lines] == ["%mul.0"]

    drive(app, scenario)


def test_hlo_viewer_search_stage_and_programs(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2", "h")
        hlo = app.screen
        view = hlo.query_one("#hlo", HloView)
        await press(pilot, "slash")
        await pilot.press(*"f32[9")
        await settle(pilot)
        assert len(view.matches) == 5
        await press(pilot, "enter")
        assert app.focused is view
        first = view.cursor_line
        await press(pilot, "n")
        assert view.cursor_line > first
        await press(pilot, "N")
        assert view.cursor_line == first
        await press(pilot, "s")
        assert "stablehlo.multiply" in "\n".join(view.lines)
        await press(pilot, "s")
        program = hlo.loaded.text.id
        await press(pilot, "right_square_bracket")
        assert hlo.loaded.text.id != program and hlo.loaded.text.name == "mul.Tensor"
        await press(pilot, "escape", "escape")
        assert isinstance(app.screen, RecompilesScreen)

    drive(app, scenario)


def test_help_lists_the_keys_of_the_view(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for words in ("Diff HLO", "Mark", "Recompiles", "Divergence", "^q, q"):
            assert words in text, words
        await press(pilot, "escape")
        assert isinstance(app.screen, RecompilesScreen)

    drive(app, scenario)


def test_mouse_selects_rows(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "2")
        screen = app.screen
        ranked = screen.query_one("#ranked", DataTable)
        # the header is row 0; a long name above may wrap over two rows
        y = 1 + sum(ranked.rows[key].height for key in list(ranked.rows)[:2])
        await pilot.click(ranked, offset=(2, y))  # the third op
        await settle(pilot)
        assert widget_text(screen.query_one("#history-title", Static)).strip() == (
            "Compile history: add.Tensor (eager)"
        )
        history = screen.query_one("#history", PagedTable)
        await pilot.click(history, offset=(2, 1))
        await settle(pilot)
        assert widget_text(screen.query_one("#why", Static)).startswith("compile 1 of add.Tensor (eager)")

    drive(app, scenario)


def test_compile_history_loads_page_by_page(make_app, storm_run):
    app = make_app(storm_run)

    async def scenario(pilot):
        await press(pilot, "2")
        history = app.screen.query_one("#history", PagedTable)
        assert history.row_count == 100 and history.has_more
        history.focus()
        await press(pilot, "end")  # row 100: the next page arrives
        assert history.row_count == 200 and history.cursor_row == 99
        for _ in range(3):
            await press(pilot, "end")
        assert history.row_count == 450 and not history.has_more
        await press(pilot, "end")
        assert widget_text(app.screen.query_one("#why", Static)).startswith("compile 450 of mul.Tensor")
        assert "no HLO recorded" in "\n".join(app.screen.query_one("#hlo-preview", HloView).lines)

    drive(app, scenario)


def test_every_view_an_event_kind_or_a_rule_declares_is_a_view_of_the_app():
    # the kinds and rules name their views (events.py, @rule); the app must have each one
    from tpu_debug.tracers.advisor import RULES
    from tpu_debug.tracers.events import EVENT_TYPES
    from tpu_debug.tui.app import TpuDebugApp
    from tpu_debug.tui.screens.overview import FINDING_VIEWS, KIND_VIEWS

    declared = {cls.view for cls in EVENT_TYPES.values()} | {r.view for r in RULES.values()}
    assert declared - {None} <= set(TpuDebugApp.MODES)
    # every rule's findings open a view, and the overview's tables are these declarations
    assert all(r.view is not None for r in RULES.values())
    assert FINDING_VIEWS == {kind: r.view for kind, r in RULES.items()}
    assert KIND_VIEWS == {kind: cls.view for kind, cls in EVENT_TYPES.items() if cls.view is not None}


def test_footer_says_12345678_views(make_app):
    # the footer names the views' number keys as the range README gives, the Fit view's 9 included
    from tpu_debug.tui.app import VIEW_TABLE
    from tpu_debug.tui.screens.fit import FitScreen

    app = make_app()

    async def scenario(pilot):
        footer = screen_text(app).splitlines()[-1]
        keys = f"1-{len(VIEW_TABLE)}" if len(VIEW_TABLE) < 10 else "0-9"  # a tenth view's key is 0
        assert f"{keys} Views" in footer and "12345678" not in footer, footer
        await press(pilot, "9")
        assert isinstance(app.screen, FitScreen)
        await press(pilot, "1")
        assert isinstance(app.screen, OverviewScreen)
        await press(pilot, "question_mark")
        help_text = screen_text(app)
        for title in (keys, "Views", "Recompiles", "Collectives", "Fit"):
            assert title in help_text, title

    drive(app, scenario, size=(100, 30))


def test_overview_at_100x30_cuts_view_names(make_app, tmp_path):
    # the events table is as wide as its longest kind and view name; the run's facts wrap instead
    from tpu_debug.tracers import events as ev
    from tpu_debug.tracers.store import DB_NAME
    from tpu_debug.tracers.recording.run_writer import RunWriter

    run_dir = tmp_path / "20260131T120000.000Z-long"
    run_dir.mkdir()
    meta = {"name": "long", "platform": "cpu", "device_kind": "cpu", "device_count": 1,
            "argv": ["train.py", "--steps", "8"], "cwd": str(tmp_path),
            "start_time": "2026-01-31T12:00:00.000+00:00"}
    writer = RunWriter(run_dir / DB_NAME, meta)
    at = ev.SourceLocation(str(tmp_path / "train.py"), 12, "step")
    writer.put(ev.GuardFailureEvent(writer.new_id(), 0.1, "compiled", 1, at, "step", "0/1", ("0/0: n == 2",)))
    writer.put(ev.RecompileLimitEvent(writer.new_id(), 0.2, "compiled", 1, at, "step", "recompile_limit", 8,
                                      "n == 9"))
    writer.close({"status": "finished", "exit_status": 0, "duration": 1.0})
    app = make_app(run_dir)

    async def scenario(pilot):
        import re

        kinds = re.compile(r"(guard_failure|recompile_limit)\s+\d+\s")
        rows = [line for line in screen_text(app).splitlines() if kinds.search(line)]
        assert len(rows) == 2 and all(line.rstrip().endswith(" recompiles") for line in rows), rows

    drive(app, scenario, size=(100, 30))


def test_source_pane_cuts_lines_at_30_chars(make_app):
    # at 100x30 the recompiles view's source pane is about 30 columns: a long line wraps, whole
    app = make_app()

    async def scenario(pilot):
        import io

        from rich.console import Console

        await press(pilot, "2")
        pane = app.screen.query_one("#source")
        width = pane.content_size.width
        assert width < 40, width
        console = Console(width=width, color_system=None, file=io.StringIO())
        with console.capture() as captured:
            console.print(pane.content)
        text = captured.get()
        assert "".join(text.split()).count("loss=((hidden-target)**2).mean()") == 1, text

    drive(app, scenario, size=(100, 30))
