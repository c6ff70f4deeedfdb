"""``MemoryScreen``: device bytes over the run's steps, the peak step and what held it, by
allocating line, and whether it fits one device of the TPU target (with the estimated fixes);
then each compiled program at its peak, buffer by buffer (its bytes over program order, the
buffers live at the peak with their kind and PyTorch line; ``p`` goes to the next program)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Sparkline, Static
from tpu_debug.tracers.events import MemoryHolder, ProgramBuffer, ProgramMemoryEvent, SourceLocation
from tpu_debug.tracers.reading.memory_view import PHASE_TEXT, MemoryView, describe_fix, memory_view, need_text
from tpu_debug.tracers.reading.peak_buffers import KIND_TEXT, made_by, made_where, peak_headline, shape_text, sum_text
from tpu_debug.tracers.reading.view import RunView
from tpu_debug.tui.format import format_bytes, location_text
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.widgets import Col, FitTable

__all__ = ["MemoryScreen"]

NOT_TRACKED = (
    "device memory was not tracked in this run: trace with memory=True (or a target), "
    "or run with tpu-debug run --memory / --target / --dry-run"
)
NO_PROGRAMS = "no compiled program's buffers were recorded (a graph's, with memory=True or a target)"


def _programs(session: RunView) -> list[ProgramMemoryEvent]:
    """The programs' peaks, the one the run's answer is about first."""
    programs = session.memory()
    first = session.memory.peak()
    return [first] + [e for e in programs if e.id != first.id] if first is not None else []


def _summary(view: MemoryView, cwd: str | None) -> Text:
    text = Text()
    s = view.summary
    steps = view.steps
    if s is None:  # a run still going (or cut short): the steps so far
        peak = max(steps, key=lambda e: e.peak_bytes)
        text.append(f"peak so far {format_bytes(peak.peak_bytes)}", style="bold")
        text.append(f" in step {peak.step} of {len(steps)}; {format_bytes(steps[-1].live_bytes)} held at the last step's end")
        return text
    text.append(f"peak {format_bytes(s.peak_bytes)}", style="bold")
    text.append(f" held by tpu tensors in step {s.peak_step} of {s.steps}; ")
    text.append(f"{format_bytes(s.persistent_bytes)} still held at its end, "
                f"{format_bytes(s.activation_bytes)} of the forward's tensors gone by then")
    if s.temp_bytes:
        whose = "TPU compiler" if s.temp_source == "target" else "local compiler"
        text.append(f"\n{need_text(s, format_bytes)} ({whose}'s temporaries)")
    if s.target is not None and s.capacity_bytes is not None:
        verdict = {True: ("fits", "bold green"), False: ("does NOT fit", "bold red")}.get(s.fits, ("unknown", "dim"))
        text.append(f"\nneeds ~{format_bytes(s.required_bytes)} per device of {format_bytes(s.capacity_bytes)} "
                    f"on one {s.target} device: ")
        text.append(verdict[0], style=verdict[1])
        text.append(" (an estimate)", style="dim")
    if s.dry_run:
        text.append(f"\ndry run: nothing executed; {s.programs} program(s) compiled for {s.target}, "
                    f"{s.oom_programs} out of HBM")
    if s.stopped:
        where = ""
        if s.location is not None:
            where = f" at {location_text(s.location, cwd, function=False).plain}"
        text.append(f"\nstopped{where}: {s.stopped}", style="yellow")
    return text


def _findings(view: MemoryView) -> Text:
    text = Text()
    for f in view.findings:
        if f.finding == "program_oom":
            text.append(f"{f.program or 'a program'} ran out of HBM on {f.target}: ", style="bold red")
        else:
            text.append(f"does not fit one {f.target} device: ", style="bold red")
        text.append(f"~{format_bytes(f.required_bytes)} of {format_bytes(f.capacity_bytes)}\n")
    fixes = view.findings[0].fixes if view.findings else ()
    for fix in fixes:
        text.append("fix: ", style="bold" if fix.fits else "dim")
        text.append(describe_fix(fix) + "\n", style="" if fix.fits else "dim")
    text.rstrip()
    return text


class MemoryScreen(RunScreen):
    """Live device bytes per step (sparkline), the peak's holders, the fit against the target,
    and the buffers at each compiled program's peak."""

    AUTO_FOCUS = "#holders"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("p", "next_program", "Next program")]

    @dataclasses.dataclass
    class Loaded(Message):
        view: MemoryView
        programs: list[ProgramMemoryEvent]

    def __init__(self) -> None:
        super().__init__()
        self._programs: list[ProgramMemoryEvent] = []
        self._shown = 0

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="mem-summary", markup=False)
        yield Static(Text("", style="dim"), id="mem-steps-label", markup=False)
        yield Sparkline([], id="mem-steps")
        yield FitTable(id="holders", cursor_type="row", zebra_stripes=True)
        yield Static(Text(""), id="mem-findings", markup=False)
        yield Static(Text(""), id="peak-title", markup=False)
        yield Sparkline([], id="peak-timeline")
        yield FitTable(id="peak-buffers", cursor_type="row", zebra_stripes=True)
        yield Static(Text(""), id="peak-sum", markup=False)

    def on_mount(self) -> None:
        # where and how much matter most: the location wraps, the phase is left out first
        self.query_one("#holders", FitTable).set_columns(
            [
                Col("held at the peak by", "where", shrink=20),
                Col("phase", "phase", drop=1),
                Col("kind", "kind", drop=2),
                Col("bytes", "bytes"),
                Col("tensors", "tensors", drop=2),
                Col("largest", "largest", drop=3),
            ]
        )
        self.query_one("#peak-buffers", FitTable).set_columns(
            [
                Col("kind", "kind"),
                Col("bytes", "bytes"),
                Col("made at", "where", shrink=16),
                Col("shape", "shape", drop=1),
                Col("made by", "op", drop=2, shrink=16),
                Col("live", "live", drop=3),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="memory")
    def _load(self) -> None:
        view = self.read(memory_view)
        programs = self.read(_programs)
        if view is not None:
            self.post_message(self.Loaded(view, programs or []))

    def action_next_program(self) -> None:
        if self._programs:
            self._shown = (self._shown + 1) % len(self._programs)
            self._show_program()

    def _show_program(self) -> None:
        table = self.query_one("#peak-buffers", FitTable)
        for widget in (table, self.query_one("#peak-timeline", Sparkline)):
            widget.display = bool(self._programs)
        if not self._programs:
            self.query_one("#peak-title", Static).update(Text(NO_PROGRAMS, style="dim"))
            self.query_one("#peak-sum", Static).update(Text(""))
            table.fill([])
            return
        e = self._programs[self._shown]
        title = Text(peak_headline(e), style="bold red" if e.status == "hbm_oom" else "bold")
        if len(self._programs) > 1:
            title.append(f"   program {self._shown + 1} of {len(self._programs)} (p: next)", style="dim")
        kinds = ", ".join(f"{KIND_TEXT.get(k, k)} {format_bytes(v)}" for k, v in e.by_kind().items())
        title.append(f"\n{kinds}", style="")
        self.query_one("#peak-title", Static).update(title)
        self.query_one("#peak-timeline", Sparkline).data = list(e.timeline_bytes) or [0]
        rows = [self._buffer_row(b) for b in e.buffers]
        table.fill(rows, [str(i) for i in range(len(rows))])
        self.query_one("#peak-sum", Static).update(Text(sum_text(e), style="dim"))

    def _buffer_row(self, b: ProgramBuffer) -> tuple[Text, ...]:
        one = b.count == 1 and b.kind != "unused"
        live = (f"{b.start}-{b.end}" if b.start >= 0 else "whole program") if one else ""
        kind = KIND_TEXT.get(b.kind, b.kind) + (" (reserved)" if b.reserved else "")
        return (
            Text(kind),
            Text(format_bytes(b.nbytes), justify="right"),
            Text(made_where(b, self.cwd)),
            Text(shape_text(b)),
            Text(made_by(b)),
            Text(live),
        )

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        view = message.view
        self._programs = message.programs
        self._shown = min(self._shown, max(len(self._programs) - 1, 0))
        self._show_program()
        table = self.query_one("#holders", FitTable)
        table.fill([])
        if not view.recorded:
            self.query_one("#mem-summary", Static).update(Text(NOT_TRACKED, style="dim"))
            self.query_one("#mem-steps", Sparkline).data = []
            self.query_one("#mem-findings", Static).update(Text(""))
            if not self._programs:  # nothing of memory at all: the line above says how to get it
                self.query_one("#peak-title", Static).update(Text(""))
            return
        self.query_one("#mem-summary", Static).update(_summary(view, self.cwd))
        steps = view.steps
        peaks = [s.peak_bytes for s in steps]
        self.query_one("#mem-steps", Sparkline).data = peaks or [0]
        if steps:
            top = max(steps, key=lambda s: s.peak_bytes)
            label = (f"peak bytes per step, {len(steps)} step(s): {format_bytes(min(peaks))} .. "
                     f"{format_bytes(top.peak_bytes)} (step {top.step})")
        else:
            label = "no step was recorded"
        self.query_one("#mem-steps-label", Static).update(Text(label, style="dim"))
        holders = [self._row(h) for h in view.peak_holders()]
        table.fill(holders, [str(i) for i in range(len(holders))])
        self.query_one("#mem-findings", Static).update(_findings(view))

    def _row(self, h: MemoryHolder) -> tuple[Text, ...]:
        if h.file:
            where = location_text(SourceLocation(h.file, h.line, h.function), self.cwd)
            if h.call_file:
                where.append(" (called at ", style="dim")
                where.append_text(location_text(SourceLocation(h.call_file, h.call_line, ""), self.cwd, function=False))
                where.append(")", style="dim")
        else:
            where = Text("before the trace", style="dim")
        return (
            where,
            Text(PHASE_TEXT.get(h.phase, h.phase)),
            Text(KIND_TEXT.get(h.kind, h.kind or "-")),
            Text(format_bytes(h.nbytes), justify="right"),
            Text(str(h.tensors), justify="right"),
            Text(f"{h.dtype}{list(h.shape)}" if h.shape else "-"),
        )
