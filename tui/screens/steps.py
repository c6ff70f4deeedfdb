"""``StepsScreen``: the run's steps, warm-up and steady state, with what ran in each."""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import Sparkline, Static
from tpu_debug.tracers.events import StepEvent
from tpu_debug.tracers.reading.step_time import (
    PARTS,
    Goodput,
    StepSplit,
    Verdict,
    goodput,
    split_step,
    verdict,
)
from tpu_debug.tracers.reading.step_phases import STEADY, StepSummary, step_phases, summarize_steps
from tpu_debug.tui.format import format_bytes, format_seconds
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.widgets import Col, PagedTable

from tpu_debug.session import Session

__all__ = ["StepsData", "StepsScreen", "steps_data"]

PAGE = 500  # rows added to the table at a time (a long run has many thousands of steps)
POINTS = 120  # points of the step-time sparkline

_HOW = {"optimizer": "optimizer.step()", "explicit": "tpu_debug.step()", "loop": "loop", "torch_trace": "compile (TORCH_TRACE)"}


BAR = 16  # cells of a step's stacked bar
# each part's colour in the stacked bars and their legend (tracers/reading/step_time.py's PARTS)
PART_STYLE = {
    "input": "magenta",
    "compile": "yellow",
    "sync": "red",
    "collective": "blue",
    "checkpoint": "cyan",
    "dispatch": "green",
    "host": "grey62",
}


@dataclasses.dataclass(frozen=True, slots=True)
class StepsData:
    steps: list[StepEvent]
    phases: list[str]
    summary: StepSummary
    splits: list[StepSplit | None] = dataclasses.field(default_factory=list)
    verdict: Verdict | None = None
    goodput: Goodput | None = None


def steps_data(session: Session) -> StepsData:
    """The run's steps, each one's phase and split, their summary, the run's bound and goodput."""
    steps = session.steps()
    phases = step_phases(steps)
    good = goodput(steps, phases, session.metadata().duration, session.steps.waits("checkpoint")) if steps else None
    return StepsData(steps, phases, summarize_steps(steps, session.compiles()), [split_step(s) for s in steps],
                     verdict(steps, phases), good)


def split_bar(split: StepSplit | None, width: int = BAR) -> Text:
    """A step's split as a stacked bar of ``width`` cells, one colour per part, each part's
    cells in proportion to its share (largest remainders get the odd cells)."""
    if split is None:
        return Text("-", style="dim")
    if split.seconds <= 0:
        return Text(" " * width)
    exact = [width * p / split.seconds for p in split.parts]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: cells[i] - exact[i])[: width - sum(cells)]:
        cells[i] += 1
    bar = Text()
    for name, n in zip(PARTS, cells):
        if n:
            bar.append("█" * n, style=PART_STYLE[name])
    return bar


def legend() -> Text:
    """What each colour of the stacked bars is."""
    text = Text("went to: ", style="dim")
    for name in PARTS:
        text.append("█", style=PART_STYLE[name])
        text.append(f" {name}  ")
    return text


def _sparkline(values: list[float], points: int = POINTS) -> list[float]:
    """``values`` in at most ``points`` buckets (each the largest of its values)."""
    if len(values) <= points:
        return values
    width = len(values) / points
    return [max(values[int(i * width) : max(int(i * width) + 1, int((i + 1) * width))]) for i in range(points)]


class StepsScreen(RunScreen):
    """Steps in order: phase (warm-up or steady), how each was found, time, ops, compiles, transfers."""

    AUTO_FOCUS = "#steps"

    @dataclasses.dataclass
    class Loaded(Message):
        data: StepsData

    def __init__(self) -> None:
        super().__init__()
        self._data: StepsData | None = None

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="st-summary", markup=False)
        yield Static(legend(), id="st-legend", markup=False)
        yield Static(Text("time per step", style="dim"), id="st-time-label", markup=False)
        yield Sparkline([], id="st-time")
        yield PagedTable(id="steps", page_size=PAGE, zebra_stripes=True)

    def on_mount(self) -> None:
        # time, compiles and transfers per step matter most: the rest is left out first
        self.query_one("#steps", PagedTable).set_columns(
            [
                Col("step", "step"),
                Col("phase", "phase"),
                Col("ended by", "how", drop=1),
                Col("time", "time"),
                Col("went to", "split"),
                Col("eager ops", "ops", drop=3),
                Col("graphs", "graphs", drop=4),
                Col("dispatch", "dispatch", drop=2),
                Col("compiles", "compiles"),
                Col("compile time", "compile_time"),
                Col("transfers", "transfers"),
                Col("bytes", "bytes", drop=5),
                Col("fallbacks", "fallbacks", drop=6),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="steps")
    def _load(self) -> None:
        data = self.read(steps_data)
        if data is not None:
            self.post_message(self.Loaded(data))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        data = self._data = message.data
        self.query_one("#st-summary", Static).update(_summary_text(data.summary, data.verdict, data.goodput))
        table = self.query_one("#steps", PagedTable)
        row = table.cursor_row
        table.reset()
        if not data.steps:
            return
        seconds = [s.seconds for s in data.steps]
        self.query_one("#st-time", Sparkline).data = _sparkline(seconds)
        self.query_one("#st-time-label", Static).update(
            Text(
                f"time per step, steps {data.steps[0].index}..{data.steps[-1].index} "
                f"(max {format_seconds(max(seconds))})",
                style="dim",
            )
        )
        self._add_rows(0)
        table.move_cursor(row=min(row, table.row_count - 1))

    def _add_rows(self, offset: int) -> None:
        data = self._data
        if data is None:
            return
        table = self.query_one("#steps", PagedTable)
        end = min(len(data.steps), offset + PAGE)
        rows, keys = [], []
        splits = data.splits[offset:end] or [None] * (end - offset)
        for s, phase, split in zip(data.steps[offset:end], data.phases[offset:end], splits):
            compiling = phase == STEADY and s.compiles > 0
            style = "bold yellow" if compiling else ("dim" if phase != STEADY else "")
            keys.append(str(s.index))
            rows.append([
                Text(str(s.index), justify="right"),
                Text("steady, compiles" if compiling else phase, style=style),
                Text(_HOW.get(s.detected, s.detected), style="dim"),
                Text(format_seconds(s.seconds), justify="right"),
                split_bar(split),
                Text(f"{s.eager_ops:,}", justify="right"),
                Text(f"{s.graph_runs:,}", justify="right"),
                Text(format_seconds(s.op_seconds), justify="right"),
                Text(str(s.compiles), justify="right", style=style),
                Text(format_seconds(s.compile_seconds) if s.compiles else "-", justify="right"),
                Text(str(s.transfers), justify="right"),
                Text(format_bytes(s.transfer_bytes), justify="right"),
                Text(str(s.fallbacks) if s.fallbacks else "-", justify="right"),
            ])
        table.append(rows, keys)
        table.has_more = end < len(data.steps)
        table.check_more()

    @on(PagedTable.NeedMore, "#steps")
    def _more(self, message: PagedTable.NeedMore) -> None:
        self._add_rows(message.offset)


def _summary_text(summary: StepSummary, bound: Verdict | None = None, good: Goodput | None = None) -> Text:
    text = _steps_text(summary)
    if bound is not None:
        text.append("\n")
        text.append(bound.bound, style="bold" if bound.part == "dispatch" else "bold yellow")
        text.append(bound.render().removeprefix(bound.bound))
    if good is not None and good.total_seconds > 0:
        text.append("\ngoodput ")
        text.append(f"{100 * good.share:.0f}%", style="bold")
        text.append(f" of {format_seconds(good.total_seconds)}; badput: ")
        bad = [b for b in good.badput if b.seconds > 0]
        text.append(", ".join(f"{b.cause} {format_seconds(b.seconds)}" for b in bad) or "none", style="dim")
    return text


def _steps_text(summary: StepSummary) -> Text:
    text = Text()
    if not summary.steps:
        text.append(
            "no steps: the run called neither optimizer.step() (with tpu parameters) nor tpu_debug.step(), "
            "and repeated no loop of ops",
            style="dim",
        )
        return text
    how = " + ".join(_HOW.get(d, d) for d in (summary.detected or "").split("+"))
    text.append(f"{summary.steps:,} steps", style="bold")
    text.append(f" (ended by {how})")
    if summary.warmup:
        ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in summary.warmup_ranges())
        text.append(" · warm-up ")
        text.append(ranges, style="bold")
        text.append(f": {summary.warm.compiles} compiles, {format_seconds(summary.warm.seconds)}", style="dim")
        if summary.warm.read_backs:
            text.append(f", {summary.warm.read_backs} read back ({format_seconds(summary.warm.read_back_seconds)})",
                        style="dim")
    if summary.steady:
        compiles = summary.steady_compiles.compiles
        text.append(f" · steady {summary.steady:,} steps: {format_seconds(summary.step_seconds)}/step, ")
        text.append(f"{summary.ops_per_step:,.0f} ops/step, ")
        text.append(f"{compiles} compiles", style="bold yellow" if compiles else "green")
    return text
