"""``CollectivesScreen``: programs spread over several devices, their collectives (bytes,
groups, the op and line that caused each) and what one device holds for each program."""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker
from tpu_debug.tracers.events import CollectivesEvent, SourceLocation
from tpu_debug.tui.format import format_location, format_bytes
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.widgets import Col, FitTable, SourceExcerpt, SourceView, read_excerpt

from tpu_debug.session import Session
from tpu_debug.tracers.reading.program_collectives import program_calls, program_collectives

__all__ = ["CollectivesScreen"]


def _programs(session: Session) -> tuple[list[CollectivesEvent], dict[int, int]]:
    events = program_collectives(session, target=None)
    return events, program_calls(session, [e for e in events if not e.target])


class CollectivesScreen(RunScreen):
    """Programs over several devices (most bytes sent first) and the selected one's collectives."""

    AUTO_FOCUS = "#cl-programs"

    @dataclasses.dataclass
    class Loaded(Message):
        programs: list[CollectivesEvent]
        calls: dict[int, int]

    @dataclasses.dataclass
    class SourceLoaded(Message):
        excerpt: SourceExcerpt | None

    def __init__(self) -> None:
        super().__init__()
        self.programs: list[CollectivesEvent] = []
        self.calls: dict[int, int] = {}

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="cl-summary", markup=False)
        yield FitTable(id="cl-programs", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="cl-detail"):
            with Vertical(id="cl-ops-box", classes="pane"):
                yield Static(Text("Collectives", style="bold"), id="cl-ops-title", classes="pane-title",
                             markup=False)
                yield FitTable(id="cl-ops", cursor_type="row", zebra_stripes=True)
            with Vertical(id="cl-source-box", classes="pane"):
                yield Static(Text("Source", style="bold"), classes="pane-title", markup=False)
                yield SourceView(id="cl-source")

    def on_mount(self) -> None:
        # the counts, bytes and the source line matter most: a long (combined) shape wraps
        self.query_one("#cl-programs", FitTable).set_columns(
            [
                Col("program", "program", shrink=12),
                Col("on", "on", drop=2),
                Col("devices", "devices"),
                Col("memory/device", "memory/device", drop=1),
                Col("collectives", "collectives"),
                Col("sent/run", "sent/run"),
                Col("runs", "runs"),
            ]
        )
        self.query_one("#cl-ops", FitTable).set_columns(
            [
                Col("collective", "collective", shrink=14),
                Col("groups", "groups"),
                Col("sent", "sent"),
                Col("from", "from", drop=1),
                Col("at", "at"),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="collectives")
    def _load(self) -> None:
        loaded = self.read(_programs)
        if loaded is not None:
            self.post_message(self.Loaded(*loaded))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        self.programs, self.calls = message.programs, message.calls
        table = self.query_one("#cl-programs", FitTable)
        row = table.cursor_row
        table.fill([])
        summary = Text()
        rank = self.run_app.rank_label()
        if rank:
            summary.append(f"{rank} · ", style="bold")
        if not self.programs:
            summary.append(
                "no program ran over more than one device (shard tensors over a mesh: "
                "tpu_debug.runtime.distributed)", style="dim"
            )
            self.query_one("#cl-summary", Static).update(summary)
            self.query_one("#cl-ops", FitTable).fill([])
            return
        local = [p for p in self.programs if not p.target]
        summary.append(f"{len(self.programs)} program(s) over several devices", style="bold")
        summary.append(f", {sum(len(p.collectives) for p in local)} collectives on this run's devices")
        sent = sum(p.collective_bytes * self.calls.get(p.id, 0) for p in local)
        summary.append(f", {format_bytes(sent)} sent per device in all")
        summary.append(" (ring estimates)", style="dim")
        self.query_one("#cl-summary", Static).update(summary)
        rows = []
        for p in self.programs:
            runs = self.calls.get(p.id)
            rows.append(
                [
                Text(p.name + (f"  {p.error}" if p.error else ""), style="red" if p.error else ""),
                Text(p.target or "this run", style="dim" if not p.target else "cyan"),
                Text(str(p.devices or "-"), justify="right"),
                Text(format_bytes(p.memory_bytes) if p.memory_bytes is not None else "-", justify="right"),
                Text(str(len(p.collectives)), justify="right"),
                Text(format_bytes(p.collective_bytes), justify="right"),
                Text(str(runs) if runs is not None else "-", justify="right"),
                ]
            )
        table.fill(rows, [str(i) for i in range(len(rows))])
        table.move_cursor(row=min(row, len(self.programs) - 1))
        self._select(table.cursor_row)

    @on(DataTable.RowHighlighted, "#cl-programs")
    def _program_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select(self.query_one("#cl-programs", DataTable).cursor_row)

    def _select(self, row: int) -> None:
        if not 0 <= row < len(self.programs):
            return
        p = self.programs[row]
        title = Text("Collectives of ", style="bold")
        title.append(p.name, style="bold cyan")
        if p.memory_bytes is not None:
            title.append(
                f" · per device: {format_bytes(p.argument_bytes or 0)} in, {format_bytes(p.output_bytes or 0)} out, "
                f"{format_bytes(p.temp_bytes or 0)} temporaries"
            )
        self.query_one("#cl-ops-title", Static).update(title)
        rows = [
            [
                Text(f"{c.opcode} {c.shape}"),
                Text(f"{c.groups}x{c.group_size}", justify="right"),
                Text(format_bytes(c.wire_bytes), justify="right"),
                Text(c.node or c.op or "-"),
                Text(format_location(c.file, c.line)),
            ]
            for c in p.collectives
        ]
        self.query_one("#cl-ops", FitTable).fill(rows, [str(i) for i in range(len(rows))])
        self._select_collective(0)

    @on(DataTable.RowHighlighted, "#cl-ops")
    def _op_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select_collective(self.query_one("#cl-ops", DataTable).cursor_row)

    def _select_collective(self, row: int) -> None:
        programs = self.query_one("#cl-programs", DataTable)
        if not 0 <= programs.cursor_row < len(self.programs):
            return
        collectives = self.programs[programs.cursor_row].collectives
        if not 0 <= row < len(collectives):
            self.query_one("#cl-source", SourceView).show(None, self.cwd)
            return
        c = collectives[row]
        location = SourceLocation(c.file, c.line, c.function or "") if c.file and c.line else None
        self._load_source(location)

    @work(thread=True, exclusive=True, group="collective-source")
    def _load_source(self, location: SourceLocation | None) -> None:
        excerpt = read_excerpt(location, self.cwd) if location is not None else None
        if not get_current_worker().is_cancelled:
            self.post_message(self.SourceLoaded(excerpt))

    @on(SourceLoaded)
    def _show_source(self, message: SourceLoaded) -> None:
        self.query_one("#cl-source", SourceView).show(message.excerpt, self.cwd)
