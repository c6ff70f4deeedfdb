"""``DivergenceScreen``: ops and graph nodes whose results differ from PyTorch on CPU, the
first one over tolerance highlighted at the top, the rest by error (paged)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker
from tpu_debug.tracers.events import DivergenceEvent
from tpu_debug.tui.format import format_float, location_text
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.screens.hlo import HloScreen
from tpu_debug.tui.widgets import Col, PagedTable, SourceExcerpt, SourceView, read_excerpt

from tpu_debug.session import Session

__all__ = ["DivergenceScreen"]

PAGE = 200


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    program: int | None
    node: str | None


def _hlo_target(session: Session, d: DivergenceEvent) -> _Target:
    if d.mode == "compiled":
        program = session.programs.of_node(d.name, graph=d.graph) if d.graph else None
        program = program if program is not None else session.programs.of_node(d.name)
        if program is not None:
            return _Target(program, d.name)
    programs = session.programs(name=d.name)
    return _Target(programs[0].id if programs else None, None)


def _detail_table(d: DivergenceEvent) -> Table:
    """One divergence in full: status, measure, errors against tolerance, result, NaN/Inf,
    and its triage verdict (noise or a wrong op, and the zero crossings behind a drift)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    status = (
        Text(f"first over tolerance ({d.measure})", style="bold red")
        if d.first
        else Text(
            "over tolerance" if d.over else "within tolerance", style="yellow" if d.over else "green"
        )
    )
    what = Text(d.name)
    if d.target and d.target != d.name:
        what.append(f"  {d.target}", style="dim")
    if d.graph:
        what.append(f"  in graph {d.graph}", style="dim")
    rows = [
        ("op / node", what),
        ("status", status),
        (
            "measure",
            Text(
                f"{d.measure} ({'CPU op on the same inputs' if d.measure == 'local' else 'against a CPU shadow run'}), {d.phase}"
            ),
        ),
        (
            "max abs error",
            Text(
                f"{format_float(d.max_abs)}  (tolerance there {format_float(d.tolerance)}, {format_float(d.ratio)}x)"
            ),
        ),
        ("max rel error", Text(format_float(d.max_rel))),
        ("ULP distance", Text(format_float(d.ulp))),
        (
            "mismatched",
            Text(
                f"{d.mismatched:,} of {d.numel:,} element(s)"
                if d.numel
                else f"{d.mismatched:,} element(s)"
            ),
        ),
        ("rtol / atol", Text(f"{format_float(d.rtol)} / {format_float(d.atol)}")),
    ]
    if d.shape or d.dtype:
        dtype = d.dtype + (f" (device: {d.device_dtype})" if d.dtype_mismatch else "")
        rows.append(("result", Text(f"{dtype}[{','.join(map(str, d.shape))}]")))
    if d.nan_origin or d.device_nonfinite or d.cpu_nonfinite:
        nan = Text("NaN/Inf first appear here; " if d.nan_origin else "", style="red")
        nan.append(f"{d.device_nonfinite} non-finite on device only, {d.cpu_nonfinite} on CPU only")
        rows.append(("NaN/Inf", nan))
    if d.autograd_node:
        rows.append(("autograd node", Text(d.autograd_node)))
    if d.highest is not None:
        rows.append(
            (
                "at precision highest",
                Text(
                    "within tolerance: TPU-like matmul precision explains it"
                    if d.highest
                    else "still over tolerance"
                ),
            )
        )
    verdict = d.triage_text()
    if verdict:  # what to do next depends on it most: right under the status
        style = "bold red" if d.verdict == "wrong" else "green"
        rows[2:2] = [("verdict", Text(verdict, style=style))] + [
            ("also", Text(c.render())) for c in d.crossings[1:]
        ]
    for key, value in rows:
        table.add_row(key, value)
    return table


class DivergenceScreen(RunScreen):
    """Divergent ops/nodes ranked; Enter opens the HLO (a graph node's instructions highlighted)."""

    AUTO_FOCUS = "#divergences"

    BINDINGS: ClassVar[list[BindingType]] = [Binding("h", "open_hlo", "HLO")]

    @dataclasses.dataclass
    class Loaded(Message):
        offset: int
        events: list[DivergenceEvent]
        has_more: bool

    @dataclasses.dataclass
    class SourceLoaded(Message):
        event_id: int
        excerpt: SourceExcerpt | None

    @dataclasses.dataclass
    class TargetFound(Message):
        event: DivergenceEvent
        target: _Target

    def __init__(self) -> None:
        super().__init__()
        self.events: list[DivergenceEvent] = []

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="dv-summary", markup=False)
        yield PagedTable(id="divergences", page_size=PAGE, zebra_stripes=True)
        with Horizontal(id="dv-detail"):
            with Vertical(id="dv-info-box", classes="pane"):
                title = Text("Selected", style="bold")
                title.append("  Enter / h: its HLO", style="dim")  # in the title: the rows may fill the pane
                yield Static(title, classes="pane-title", markup=False)
                yield Static(Text(""), id="dv-info", markup=False)
            with Vertical(id="dv-source-box", classes="pane"):
                yield Static(Text("Source", style="bold"), classes="pane-title", markup=False)
                yield SourceView(id="dv-source")

    def on_mount(self) -> None:
        # the op, its numbers and where it is matter most: the labels are left out first
        self.query_one("#divergences", PagedTable).set_columns(
            [
                Col("#", "rank"),
                Col("op / node", "name", shrink=12),
                Col("mode", "mode", drop=5),
                Col("phase", "phase", drop=4),
                Col("measure", "measure", drop=3),
                Col("max abs", "max_abs"),
                Col("× tol", "ratio"),
                Col("ULP", "ulp", drop=2),
                Col("mismatched", "mismatched", drop=1),
                Col("verdict", "verdict", drop=6),
                Col("where", "where", shrink=16),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load(0)

    @work(thread=True, exclusive=True, group="divergence")
    def _load(self, offset: int) -> None:
        events = self.read(lambda s: s.divergences.ranked(limit=PAGE + 1, offset=offset))
        if events is not None and not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(offset, events[:PAGE], len(events) > PAGE))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        table = self.query_one("#divergences", PagedTable)
        if message.offset == 0:
            row = table.cursor_row
            table.reset()
            self.events = []
            self._summary(message.events)
        elif message.offset != len(self.events):
            return
        start = len(self.events)
        self.events.extend(message.events)
        numbered = list(enumerate(message.events, start + 1))
        table.append([self._cells(d, i) for i, d in numbered], [str(d.id) for _, d in numbered])
        table.has_more = message.has_more
        if message.offset == 0 and self.events:
            table.move_cursor(row=min(row, len(self.events) - 1))
            self._select(table.cursor_row)
            if self.focused is None:
                table.focus()
        table.check_more()

    def _summary(self, events: list[DivergenceEvent]) -> None:
        summary = Text()
        if not events:
            summary.append(
                "no divergence was recorded (the run was not checked against CPU, or nothing diverged)",
                style="dim",
            )
        elif events[0].first:
            d = events[0]
            summary.append("first divergence: ", style="bold red")
            summary.append(d.name, style="bold")
            summary.append(f" ({d.mode or '-'}, {d.measure}, {d.phase}) at ")
            summary.append_text(location_text(d.location, self.cwd))
        else:
            summary.append("nothing went over tolerance; largest errors first", style="green")
        self.query_one("#dv-summary", Static).update(summary)

    def _cells(self, d: DivergenceEvent, rank: int) -> list[Text]:
        the_first = rank == 1 and d.first
        style = "bold red" if the_first else ("red" if d.first else ("yellow" if d.over else ""))
        label = Text(f"{'▶ ' if the_first else ''}{rank}", style=style, justify="right")
        name = Text(d.name, style=style or "bold")
        if d.first and not the_first:
            name.append(" first", style="red")
        if d.nan_origin:
            name.append(" NaN/Inf", style="bold red")
        numel = f" of {d.numel:,}" if d.numel else ""
        return [
            label,
            name,
            Text(d.mode or "-"),
            Text(d.phase),
            Text(d.measure),
            Text(format_float(d.max_abs), justify="right", style=style),
            Text(format_float(d.ratio) if d.ratio else "-", justify="right", style=style),
            Text(format_float(d.ulp), justify="right"),
            Text(f"{d.mismatched:,}{numel}", justify="right"),
            Text(d.verdict or "-", style="bold red" if d.verdict == "wrong" else ""),
            location_text(d.location, self.cwd, function=False),
        ]

    @on(PagedTable.NeedMore, "#divergences")
    def _more(self, message: PagedTable.NeedMore) -> None:
        self._load(message.offset)

    @on(DataTable.RowHighlighted, "#divergences")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select(self.query_one("#divergences", PagedTable).cursor_row)

    def _select(self, row: int) -> None:
        if not 0 <= row < len(self.events):
            return
        d = self.events[row]
        self.query_one("#dv-info", Static).update(_detail_table(d))
        self._load_source(d.id, d.location)

    @work(thread=True, exclusive=True, group="divergence-source")
    def _load_source(self, event_id: int, location) -> None:
        excerpt = read_excerpt(location, self.cwd) if location is not None else None
        if not get_current_worker().is_cancelled:
            self.post_message(self.SourceLoaded(event_id, excerpt))

    @on(SourceLoaded)
    def _show_source(self, message: SourceLoaded) -> None:
        self.query_one("#dv-source", SourceView).show(message.excerpt, self.cwd)

    @on(DataTable.RowSelected, "#divergences")
    def _selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_hlo()

    def action_open_hlo(self) -> None:
        table = self.query_one("#divergences", PagedTable)
        if 0 <= table.cursor_row < len(self.events):
            self._find_target(self.events[table.cursor_row])

    @work(thread=True, exclusive=True, group="divergence-hlo")
    def _find_target(self, d: DivergenceEvent) -> None:
        target = self.read(_hlo_target, d)
        if target is not None:
            self.post_message(self.TargetFound(d, target))

    @on(TargetFound)
    def _open(self, message: TargetFound) -> None:
        t = message.target
        if t.program is None:
            self.app.notify(f"{message.event.name}: no HLO recorded for it", severity="warning", markup=False)
            return
        name = None if t.node else message.event.name
        self.app.push_screen(HloScreen(t.program, name=name, mode=message.event.mode, node=t.node))
