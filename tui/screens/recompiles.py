"""``RecompilesScreen``: which ops and graphs compiled most, each one's compile history,
and for a selected recompile why it happened, where, what it compiled to and where its
time went.

Master-detail, left to right and top to bottom: ops/graphs ranked by compile
count and time -> the chosen one's compiles, oldest first (paged), each with the
step it happened in (warm-up or steady state) -> for the highlighted compile,
the structured key diff against the closest previous key, the source line with
context, and its HLO or (``t``) its compile time by phase and by source line (the run's
phases when nothing is selected; ``tracers/reading/compile_time.py``). ``m`` marks a compile, ``v`` shows the HLO of the marked
one (or the closest previous one) beside the highlighted one. What to do about
an op's recompiles is the advisor's finding about it, shown as it is.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker
from tpu_debug.tracers.advisor import Finding
from tpu_debug.tracers.events import (
    COMPILE_PHASES,
    CompileEvent,
    CompileLinesEvent,
    KeyDiff,
    LineCost,
    SourceLocation,
)
from tpu_debug.tracers.reading import CompileGroup
from tpu_debug.tracers.reading.step_phases import STEADY, StepIndex, step_phases
from tpu_debug.tui.format import changed_text, diff_summary, fallback_diffs, format_seconds, location_text
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.screens.hlo import HloDiffScreen, HloScreen
from tpu_debug.tui.widgets import Col, FitTable, HloView, PagedTable, SourceExcerpt, SourceView, read_excerpt

from tpu_debug.core.errors import NotRecordedError
from tpu_debug.report import advice_of
from tpu_debug.session import Session
from tpu_debug.tracers.reading.compile_time import CompileTime, CompileUnit, Phases, compile_time
from tpu_debug.tracers.reading.recompile_analysis import summarize

__all__ = ["PHASE_NAMES", "CompileDetail", "CompileTimes", "RecompilesScreen", "compile_times", "time_text"]

PAGE = 100  # compiles loaded at a time (a recompile storm can have thousands)


@dataclasses.dataclass(frozen=True, slots=True)
class CompileDetail:
    """What the detail panes show for one compile."""

    event: CompileEvent
    number: int  # 1-based position in its op's history
    previous: CompileEvent | None  # the closest previous key
    diffs: tuple[KeyDiff, ...]
    recorded: bool  # diffs come from the run (False: computed here from the arguments)
    excerpt: SourceExcerpt | None
    hlo: str | None
    hlo_note: str


def _detail(
    session: Session, event: CompileEvent, number: int, earlier: list[CompileEvent], cwd: str | None
) -> CompileDetail:
    previous = None
    diffs = event.diffs
    recorded = True
    if event.previous is not None:
        previous = next((e for e in earlier if e.id == event.previous), None) or session.compiles.by_id(
            event.previous
        )
    elif not diffs and earlier:
        previous, computed = fallback_diffs(event, earlier)
        diffs, recorded = tuple(computed), False
    excerpt = read_excerpt(event.location, cwd) if event.location is not None else None
    hlo, note = None, ""
    if event.program is None:
        note = "no HLO recorded for this compile (the run was recorded with hlo off)"
    else:
        try:
            hlo = session.programs.text(event.program).hlo
        except NotRecordedError as exc:
            note = str(exc)
    return CompileDetail(event, number, previous, tuple(diffs), recorded, excerpt, hlo, note)


@dataclasses.dataclass(frozen=True, slots=True)
class StepsKnown:
    """Which step each compile fell in, and the advisor's findings per op or graph."""

    index: StepIndex
    phases: dict[int, str]
    findings: dict[str, Finding]  # identity -> the first finding about it

    def where(self, ts: float) -> tuple[int, str] | None:
        """(step index, phase) of a moment inside a step."""
        step = self.index.step_of(ts)
        return (step, self.phases[step]) if step is not None else None


# short names of the phases, for a narrow pane
PHASE_NAMES = {
    "dynamo_trace": "dynamo trace",
    "dynamo_guards": "dynamo guards",
    "aot_graph": "AOT joint graph",
    "aot_partition": "AOT partition",
    "lowering": "lowering",
    "xla_compile": "XLA compile",
    "target_compile": "TPU target",
    "cache_read": "cache read-back",
    "other": "other",
}
assert set(PHASE_NAMES) == set(COMPILE_PHASES)


@dataclasses.dataclass(frozen=True, slots=True)
class CompileTimes:
    """The run's compile time (phases, lines), with each program compile's unit and lines by
    its event id, and dynamo's compiles by their compile id."""

    run: CompileTime
    programs: dict[int, CompileUnit]
    frames: dict[str, list[CompileUnit]]
    lines: dict[int, tuple[LineCost, ...]]


def compile_times(session: Session) -> CompileTimes:
    ct = compile_time(session)
    programs = {u.event: u for u in ct.units if u.kind == "program"}
    frames: dict[str, list[CompileUnit]] = {}
    for u in ct.units:
        if u.kind in ("frame", "backward") and u.compile_id:
            frames.setdefault(u.compile_id, []).append(u)
    lines = {}
    if session.records(CompileLinesEvent.kind):
        lines = {e.compile_event: e.lines for e in session.events(CompileLinesEvent.kind)
                 if isinstance(e, CompileLinesEvent)}
    return CompileTimes(ct, programs, frames, lines)


def _phase_rows(phases: Phases, text: Text) -> None:
    total = phases.total
    for name, seconds in phases.items():
        if seconds > 0 and total > 0:
            text.append(f"\n  {PHASE_NAMES[name]:<16}", style="")
            text.append(f"{format_seconds(seconds):>10}")
            text.append(f" {100 * seconds / total:5.1f}%", style="dim")


def time_text(times: CompileTimes | None, event: CompileEvent | None, cwd: str | None = None) -> Text:
    """The compile time pane: ``event``'s phases (and its dynamo compile's), its lines by their
    share of the program; the run's phases when no compile is selected."""
    text = Text()
    if times is None:
        return Text("reading the compile times...", style="dim")
    unit = times.programs.get(event.id) if event is not None else None
    if unit is not None:
        text.append(f"{unit.name}: {format_seconds(unit.phases.total)}", style="bold")
        _phase_rows(unit.phases, text)
        for frame in times.frames.get(unit.compile_id or "", ()):
            label = "dynamo" if frame.kind == "frame" else "AOT backward"
            text.append(f"\n{label} {frame.compile_id} ({frame.name}): {format_seconds(frame.phases.total)}",
                        style="bold")
            _phase_rows(frame.phases, text)
        lines = sorted(times.lines.get(unit.event, ()), key=lambda x: -x.hlo_before)
        total = sum(x.hlo_before for x in lines)
        if lines and total:
            text.append("\nlines by StableHLO operations (est. share of the time):", style="bold")
            for x in lines[:5]:
                where = Text("(no source line)", style="dim") if x.file is None else location_text(
                    SourceLocation(x.file, x.line or 0, x.function or ""), cwd)
                text.append("\n  ").append_text(where)
                text.append(f"  {x.hlo_before} ops {100 * x.hlo_before / total:.0f}%", style="dim")
                if x.instances > 1:
                    text.append(f" x{x.instances} {x.module}", style="yellow")
        return text
    run = times.run
    text.append(f"run: {format_seconds(run.total)} in {len(run.units)} compiles", style="bold")
    _phase_rows(run.phases, text)
    if event is not None:
        text.append("\n(no measured phases for this compile)", style="dim")
    return text


def steps_known(session: Session) -> StepsKnown:
    steps = session.steps()
    findings: dict[str, Finding] = {}
    for f in advice_of(session).findings:
        for target in f.targets:
            findings.setdefault(target, f)
    return StepsKnown(StepIndex(steps), dict(zip((s.index for s in steps), step_phases(steps))), findings)


class RecompilesScreen(RunScreen):
    """Ops and graphs by compile count -> compile history -> why, where, HLO."""

    AUTO_FOCUS = "#ranked"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("h", "open_hlo", "HLO"),
        Binding("m", "mark", "Mark"),
        Binding("v", "compare", "Diff HLO"),
        Binding("t", "toggle_time", "Compile time"),
    ]

    @dataclasses.dataclass
    class RankedLoaded(Message):
        groups: list[CompileGroup]

    @dataclasses.dataclass
    class HistoryLoaded(Message):
        op: tuple[str, str]
        offset: int
        events: list[CompileEvent]
        has_more: bool

    @dataclasses.dataclass
    class DetailLoaded(Message):
        detail: CompileDetail

    @dataclasses.dataclass
    class StepsLoaded(Message):
        known: StepsKnown

    @dataclasses.dataclass
    class TimesLoaded(Message):
        times: CompileTimes

    def __init__(self) -> None:
        super().__init__()
        self._ops: dict[str, CompileGroup] = {}
        self._op: tuple[str, str] | None = None
        self._history: list[CompileEvent] = []
        self._detail: CompileDetail | None = None
        self._marked: CompileEvent | None = None
        self._want_event: int | None = None
        self._wanted: int | None = None  # the compile whose detail was asked for last
        self._steps: StepsKnown | None = None
        self._times: CompileTimes | None = None

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="rc-top"):
            with Vertical(id="rc-ranked-box", classes="pane"):
                yield Static(
                    Text("Ops and graphs by compiles", style="bold"), classes="pane-title", markup=False
                )
                yield FitTable(id="ranked", cursor_type="row")
            with Vertical(id="rc-history-box", classes="pane"):
                yield Static(
                    Text("Compile history", style="bold"),
                    id="history-title",
                    classes="pane-title",
                    markup=False,
                )
                yield Static(Text(""), id="changing", markup=False)
                yield PagedTable(id="history", page_size=PAGE)
        with Horizontal(id="rc-detail"):
            with Vertical(id="rc-why-box", classes="pane"):
                yield Static(Text("Why it compiled", style="bold"), classes="pane-title", markup=False)
                yield Static(Text("select a compile", style="dim"), id="why", markup=False)
            with Vertical(id="rc-source-box", classes="pane"):
                yield Static(Text("Source", style="bold"), classes="pane-title", markup=False)
                yield SourceView(id="source")
            with Vertical(id="rc-hlo-box", classes="pane"):
                yield Static(
                    Text("HLO (h: full view, v: diff)", style="bold"),
                    id="hlo-title",
                    classes="pane-title",
                    markup=False,
                )
                yield HloView(id="hlo-preview")
            with VerticalScroll(id="rc-time-box", classes="pane"):
                yield Static(Text("Compile time (t: HLO)", style="bold"), classes="pane-title", markup=False)
                yield Static(Text("reading the compile times...", style="dim"), id="compile-time", markup=False)

    def on_mount(self) -> None:
        # the counts matter most: the name wraps, then mode and time are left out; in the history,
        # what changed (whole shapes, wrapped) matters most
        self.query_one("#ranked", FitTable).set_columns(
            [
                Col("op / graph", "name", shrink=12),
                Col("mode", "mode", drop=1),
                Col("compiles", "compiles"),
                Col("re", "recompiles"),
                Col("cached", "read_backs", drop=3),
                Col("time", "time", drop=2),
            ]
        )
        self.query_one("#history", PagedTable).set_columns(
            [
                Col("#", "n"),
                Col("at", "ts", drop=2),
                Col("step", "step", drop=3),
                Col("what changed", "changed", shrink=16),
                Col("compile", "time", drop=4),
                Col("signature", "signature", drop=1, shrink=24),
            ]
        )
        super().on_mount()

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        self._load_ranked()
        self._load_steps()
        self._load_times()
        if self._op is not None:  # a reload (the run grew): keep the selected compile
            self._want_event = self._wanted
            self._load_history(*self._op, 0)

    @work(thread=True, exclusive=True, group="ranked")
    def _load_ranked(self) -> None:
        groups = self.read(lambda s: s.compiles.groups())
        if groups is not None:
            self.post_message(self.RankedLoaded(groups))

    @work(thread=True, exclusive=True, group="steps")
    def _load_steps(self) -> None:
        known = self.read(steps_known)
        if known is not None:
            self.post_message(self.StepsLoaded(known))

    @work(thread=True, exclusive=True, group="times")
    def _load_times(self) -> None:
        times = self.read(compile_times)
        if times is not None:
            self.post_message(self.TimesLoaded(times))

    @work(thread=True, exclusive=True, group="history")
    def _load_history(self, name: str, mode: str, offset: int) -> None:
        page = PAGE
        events = self.read(lambda s: s.compiles.history(name, mode=mode, limit=page + 1, offset=offset))
        if events is None or get_current_worker().is_cancelled:
            return
        self.post_message(self.HistoryLoaded((name, mode), offset, events[:page], len(events) > page))

    @work(thread=True, exclusive=True, group="detail")
    def _load_detail(self, event: CompileEvent, number: int, earlier: list[CompileEvent]) -> None:
        detail = self.read(_detail, event, number, earlier, self.cwd)
        if detail is not None and not get_current_worker().is_cancelled:
            self.post_message(self.DetailLoaded(detail))

    # -- showing ----------------------------------------------------------------------------

    @on(RankedLoaded)
    def _show_ranked(self, message: RankedLoaded) -> None:
        ranked = self.query_one("#ranked", FitTable)
        current = self._op
        self._ops = {}
        rows, keys = [], []
        for g in message.groups:
            key = f"{g.mode}\0{g.identity}"
            self._ops[key] = g
            style = "bold yellow" if g.compiles > 1 else ""
            keys.append(key)
            rows.append(
                [
                    Text(g.identity, style=style),
                    Text(g.mode),
                    Text(str(g.compiles), justify="right", style=style),
                    Text(str(g.recompiles) if g.recompiles else "-", justify="right", style=style),
                    Text(str(g.read_backs) if g.read_backs else "-", justify="right"),
                    Text(format_seconds(g.seconds), justify="right"),
                ]
            )
        ranked.fill(rows, keys)
        if not message.groups:
            self.query_one("#why", Static).update(
                Text("nothing was compiled while this run was recorded", style="dim")
            )
            return
        if current is not None and f"{current[1]}\0{current[0]}" in self._ops:
            ranked.move_cursor(row=ranked.get_row_index(f"{current[1]}\0{current[0]}"))
        else:
            ranked.move_cursor(row=0)
            first = message.groups[0]
            self._select_op(first.identity, first.mode)
        if self.focused is None:
            ranked.focus()

    @on(StepsLoaded)
    def _show_steps(self, message: StepsLoaded) -> None:
        self._steps = message.known
        table = self.query_one("#history", PagedTable)
        for e in self._history:
            if str(e.id) in table.rows:
                table.set_cell(str(e.id), "step", self._step_cell(e))
        if self._op is not None:
            self._show_changing()

    @on(TimesLoaded)
    def _show_times(self, message: TimesLoaded) -> None:
        self._times = message.times
        self._show_time()

    def _show_time(self) -> None:
        event = self._detail.event if self._detail is not None else None
        self.query_one("#compile-time", Static).update(time_text(self._times, event, self.cwd))

    def _show_changing(self) -> None:
        if self._op is None:
            return
        finding = self._steps.findings.get(self._op[0]) if self._steps is not None else None
        self.query_one("#changing", Static).update(
            _changing(self._history, self._op[1], self.query_one("#history", PagedTable).has_more, finding)
        )

    def _step_cell(self, e: CompileEvent) -> Text:
        if self._steps is None or not len(self._steps.index):
            return Text("-", style="dim")
        where = self._steps.where(e.ts)
        if where is None:
            return Text("outside", style="dim")
        step, phase = where
        if phase == STEADY:
            return Text(f"{step} steady", style="bold yellow" if e.diffs else "")
        return Text(f"{step} {phase}", style="dim")

    @on(DataTable.RowHighlighted, "#ranked")
    def _ranked_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # the table's cursor, not the event's row: highlight events of a refill arrive late
        ranked = self.query_one("#ranked", DataTable)
        if not ranked.row_count:
            return
        key = ranked.coordinate_to_cell_key((ranked.cursor_row, 0)).row_key.value
        g = self._ops.get(str(key))
        if g is not None and (g.identity, g.mode) != self._op:
            self._select_op(g.identity, g.mode)

    @on(DataTable.RowSelected, "#ranked")
    def _ranked_selected(self, event: DataTable.RowSelected) -> None:
        self.query_one("#history", PagedTable).focus()

    def _select_op(self, name: str, mode: str) -> None:
        self._op = (name, mode)
        self._history = []
        self._wanted = None
        self.query_one("#history", PagedTable).reset()
        title = Text("Compile history: ", style="bold")
        title.append(name, style="bold yellow")
        title.append(f" ({mode})", style="dim")
        self.query_one("#history-title", Static).update(title)
        self.query_one("#changing", Static).update(Text(""))
        self._load_history(name, mode, 0)

    @on(HistoryLoaded)
    def _show_history(self, message: HistoryLoaded) -> None:
        if message.op != self._op:
            return
        table = self.query_one("#history", PagedTable)
        if message.offset == 0:
            table.reset()
            self._history = []
        elif message.offset != len(self._history):
            return
        start = len(self._history)
        self._history.extend(message.events)
        events = list(enumerate(message.events, start + 1))
        table.append([self._history_cells(e, i) for i, e in events], [str(e.id) for _, e in events])
        table.has_more = message.has_more
        self._show_changing()
        if message.offset == 0 and self._history:
            want = self._want_event
            self._want_event = None
            ids = [e.id for e in self._history]
            row = ids.index(want) if want in ids else (1 if len(self._history) > 1 else 0)
            table.move_cursor(row=row)
            self._select_event(row)
        table.check_more()

    def _history_cells(self, e: CompileEvent, number: int) -> list[Text]:
        marked = self._marked is not None and self._marked.id == e.id
        label = Text(("◆" if marked else " ") + str(number), justify="right")
        if e.from_cache:  # a new key all the same: its diff says what is new, but nothing compiled
            changed = Text("read back from the compile cache", style="dim")
            if e.diffs:
                changed.append("; ").append_text(diff_summary(e.diffs))
        elif number == 1:
            changed = Text("first compile", style="dim")
        elif e.diffs:
            changed = diff_summary(e.diffs)
        else:
            changed = Text("(no recorded diff)", style="dim")
        return [
            label,
            Text(f"{e.ts:.3f}s", justify="right"),
            self._step_cell(e),
            changed,
            Text(format_seconds(e.seconds), justify="right"),
            Text(e.signature),
        ]

    @on(PagedTable.NeedMore, "#history")
    def _more_history(self, message: PagedTable.NeedMore) -> None:
        if self._op is not None:
            self._load_history(*self._op, message.offset)

    @on(DataTable.RowHighlighted, "#history")
    def _history_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select_event(self.query_one("#history", PagedTable).cursor_row)

    def _select_event(self, row: int) -> None:
        if not 0 <= row < len(self._history):
            return
        event = self._history[row]
        if self._wanted == event.id:
            return
        self._wanted = event.id
        self._load_detail(event, row + 1, self._history[:row])

    @on(DataTable.RowSelected, "#history")
    def _history_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_hlo()

    @on(DetailLoaded)
    def _show_detail(self, message: DetailLoaded) -> None:
        d = message.detail
        if d.event.id != self._wanted:
            return
        self._detail = d
        self.query_one("#why", Static).update(self._why(d))
        self.query_one("#source", SourceView).show(d.excerpt, self.cwd)
        preview = self.query_one("#hlo-preview", HloView)
        preview.set_text(d.hlo if d.hlo is not None else d.hlo_note)
        self._show_time()

    def _why(self, d: CompileDetail) -> RenderableType:
        e = d.event
        head = Text()
        head.append(f"compile {d.number}", style="bold")
        head.append(" of ")
        head.append(e.identity or e.name, style="bold")
        if e.identity and e.identity != e.name:
            head.append(f", program {e.name}")
        head.append(f" ({e.mode or '-'}), {format_seconds(e.seconds)}")
        parts: list[RenderableType] = [head]
        if e.from_cache:
            parts.append(
                Text(
                    "read back from the persistent compile cache: nothing was compiled, so it is no "
                    f"recompile (it saved {format_seconds(e.saved_seconds)} of compiling)",
                    style="dim",
                )
            )
        if d.number == 1 and d.previous is None and not d.diffs:
            parts.append(Text("first compile: nothing earlier to compare with", style="dim"))
        elif d.previous is None and not d.diffs:
            parts.append(Text("no key diff was recorded for this compile", style="dim"))
        else:
            n = len(d.diffs)
            line = Text()
            if d.previous is not None:
                number = next((i for i, h in enumerate(self._history, 1) if h.id == d.previous.id), None)
                line.append("closest key: ")
                line.append(f"compile {number}" if number else f"event {d.previous.id}", style="bold")
                line.append(f" ({n} mismatch{'es' if n != 1 else ''})")
            else:
                line.append(f"{n} mismatch{'es' if n != 1 else ''}")
            if not d.recorded:
                line.append(" (computed here from the arguments: the run recorded no key diff)", style="dim")
            parts.append(line)
            for diff in d.diffs:
                before, now = changed_text(diff.before, diff.now)
                parts.append(Text(diff.field, style="bold"))
                parts.append(Text("  ") + before + Text(" → ", style="dim") + now)
        parts.append(Text(""))
        where = Text("at ")
        where.append_text(location_text(e.location, self.cwd))
        parts.append(where)
        parts.append(Text("signature: ", style="dim") + Text(e.signature))
        return Group(*parts)

    # -- actions ----------------------------------------------------------------------------

    def action_open_hlo(self) -> None:
        d = self._detail
        if d is None:
            return
        if d.event.program is None:
            self.app.notify(d.hlo_note, severity="warning", markup=False)
            return
        self.app.push_screen(HloScreen(d.event.program, name=d.event.name, mode=d.event.mode))

    def action_toggle_time(self) -> None:
        """Show the compile time pane in the HLO pane's place, or the HLO again."""
        time_box = self.query_one("#rc-time-box")
        showing = not time_box.display
        time_box.display = showing
        self.query_one("#rc-hlo-box").display = not showing

    def action_mark(self) -> None:
        d = self._detail
        if d is None:
            return
        table = self.query_one("#history", PagedTable)
        old = self._marked
        self._marked = None if old is not None and old.id == d.event.id else d.event
        for e in (old, self._marked):
            if e is None or str(e.id) not in table.rows:
                continue
            number = next(i for i, h in enumerate(self._history, 1) if h.id == e.id)
            table.set_cell(str(e.id), "n", self._history_cells(e, number)[0])
        if self._marked is not None:
            self.app.notify(f"marked compile {d.number}; highlight another and press v", markup=False)

    def action_compare(self) -> None:
        d = self._detail
        if d is None:
            return
        other = self._marked if self._marked is not None and self._marked.id != d.event.id else d.previous
        if other is None:
            self.app.notify(
                "nothing to compare with: mark a compile with m first", severity="warning", markup=False
            )
            return
        if other.program is None or d.event.program is None:
            self.app.notify("no HLO recorded for one of the two compiles", severity="warning", markup=False)
            return
        left, right = (other, d.event) if other.id < d.event.id else (d.event, other)
        self.app.push_screen(
            HloDiffScreen(
                (left.program, _label(left, self._history)),
                (right.program, _label(right, self._history)),
            )
        )


def _changing(history: list[CompileEvent], mode: str, partial: bool, finding: Finding | None) -> Text:
    """What changed across the loaded compiles (the recompile tracker's summary of a group,
    over the compiles loaded so far), and the advisor's fix when it found this op or graph
    worth fixing."""
    groups = summarize(history)
    change = groups[0].changing if groups else None
    text = Text("")
    if change is not None:
        text.append("changed: ", style="bold")
        text.append(change.what, style="bold yellow" if finding is not None else "bold")
        values = ", ".join(change.values[:6]) + (", …" if len(change.values) > 6 else "")
        # this change explains ``count`` of the group's recompiles (others may change something else)
        total = groups[0].recompiles
        share = f"all {total}" if change.count >= total else f"{change.count} of the {total}"
        noun = "recompile" if total == 1 else "recompiles"
        text.append(f" (in {share} {noun}{' so far' if partial else ''}; values: {values})")
    if finding is not None:
        text.append("\n→ " + finding.fix, style="dim")
    return text


def _label(e: CompileEvent, history: list[CompileEvent]) -> str:
    number = next((i for i, h in enumerate(history, 1) if h.id == e.id), None)
    which = f"compile {number}" if number else f"event {e.id}"
    return f"{e.name} {which}: {e.signature}"
