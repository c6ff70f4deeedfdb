"""``OverviewScreen``: the run at a glance, its steps, and the advisor's findings, each linking to its view."""

from __future__ import annotations

import dataclasses

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option
from tpu_debug.tracers.advisor import RULES
from tpu_debug.tracers.events import EVENT_TYPES
from tpu_debug.tracers.reading.lazy_graphs import summarize
from tpu_debug.tracers.reading import RunMetadata
from tpu_debug.tracers.reading.step_phases import StepSummary, summarize_steps
from tpu_debug.tui.format import format_seconds, location_text
from tpu_debug.tui.screens.base import RunScreen

from tpu_debug.report import advice_of, finding_text
from tpu_debug.session import Session

__all__ = ["FINDING_VIEWS", "FindingLine", "OverviewData", "OverviewScreen", "finding_lines", "overview_data"]

# which view shows each event kind, and what each kind of finding is about: declared with the
# event class (its ``view``) and the advisor rule (``@rule(..., view=...)``)
KIND_VIEWS = {kind: cls.view for kind, cls in EVENT_TYPES.items() if cls.view is not None}
FINDING_VIEWS = {kind: r.view for kind, r in RULES.items() if r.view is not None}


@dataclasses.dataclass(frozen=True, slots=True)
class FindingLine:
    """One line of the findings list: its text, how serious, the view that shows it, and the
    finding's full text (evidence and fix) for the detail pane."""

    text: Text
    severity: str  # "error" | "warning" | "info"
    view: str | None
    detail: Text | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class OverviewData:
    metadata: RunMetadata
    counts: dict[str, int]
    modes: list[str]
    compiles: int
    compile_seconds: float
    steps: StepSummary
    notes: list[FindingLine]  # about the recording itself (tracer errors), not the program
    read_backs: int = 0  # executables read back from the persistent compile cache: no compiles


def overview_data(session: Session, cwd: str | None) -> OverviewData:
    """What the overview shows first: the run, its events and steps (the findings come
    after, see :func:`finding_lines`)."""
    meta = session.metadata()
    counts = session.counts()
    groups = session.compiles.groups()
    notes: list[FindingLine] = []
    if counts.get("internal_error"):
        n = counts["internal_error"]
        notes.append(
            FindingLine(Text(f"{n} tracer error(s) were recorded; the traced program was not affected"), "info", None)
        )
    return OverviewData(
        meta,
        counts,
        session.modes(),
        sum(g.compiles for g in groups),
        sum(g.seconds for g in groups),
        summarize_steps(session.steps(), session.compiles()),
        notes,
        sum(g.read_backs for g in groups),
    )


def _lazy_graphs(session: Session, cwd: str | None) -> list[FindingLine]:
    # lazy mode (DEFER_AND_FUSE): a step run as several graphs, and the line that cut it
    lazy = summarize(session.events("materialize"))
    if not lazy.graphs:
        return []
    text = Text()
    if lazy.split_steps and lazy.extra_cuts:
        cut = lazy.extra_cuts[0]
        text.append(f"{lazy.split_steps} of {len(lazy.per_step)} optimizer steps", style="bold")
        text.append(f" ran as more than one lazy graph; most often cut by {cut.text}")
        if cut.location is not None:
            text.append(" at ")
            text.append_text(location_text(cut.location, cwd, function=False))
        return [FindingLine(text, "warning", "recompiles")]
    text.append(f"{lazy.graphs} lazy graph(s)", style="bold")
    text.append(f" run as {lazy.programs} program(s), {lazy.compiles} compiled")
    if lazy.graphs_per_step is not None:
        text.append(f"; {lazy.graphs_per_step:g} per optimizer step")
    return [FindingLine(text, "info", "recompiles")]


def finding_lines(session: Session, cwd: str | None) -> list[FindingLine]:
    """The advisor's findings as list lines, most serious and costly first (one pass over the
    run's events: the overview asks for them once it is shown)."""
    advice = advice_of(session)
    out = []
    for f in advice.findings:
        text = Text(f.title)
        if f.consequences:  # one cause: what it led to is in the detail pane, under it
            text.append(f"  (+{len(f.consequences)} consequence{'s' if len(f.consequences) > 1 else ''})", style="dim")
        out.append(FindingLine(text, f.severity, FINDING_VIEWS.get(f.kind), finding_text(f, terminal=True, cwd=cwd)))
    if session.counts().get("materialize"):
        out += _lazy_graphs(session, cwd)
    out += [FindingLine(Text(e), "info", None) for e in advice.errors]
    return out


def _steps_text(summary: StepSummary) -> Text:
    if not summary.steps:
        return Text("none found (no optimizer.step(), no tpu_debug.step(), no repeated loop)", style="dim")
    text = Text(f"{summary.steps:,} ({summary.detected})")
    if summary.warmup:
        ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in summary.warmup_ranges())
        text.append(f"; warm-up {ranges}: {summary.warm.compiles} compiles", style="dim")
    if summary.steady:
        compiles = summary.steady_compiles.compiles
        text.append(f"; steady {summary.steady:,}: {format_seconds(summary.step_seconds)}/step, ")
        text.append(f"{compiles} compiles", style="bold yellow" if compiles else "green")
    return text


FINDINGS_DELAY = 0.75  # seconds on the overview before its findings are looked for

_ICONS = {"error": ("✖ ", "bold red"), "warning": ("▲ ", "bold yellow"), "info": ("● ", "cyan")}


class OverviewScreen(RunScreen):
    """Platform, mode, duration, status, steps, events per kind, and the findings (Enter opens
    the view a finding is about; the pane below shows its evidence and fix)."""

    AUTO_FOCUS = "#findings"

    @dataclasses.dataclass
    class Loaded(Message):
        data: OverviewData

    @dataclasses.dataclass
    class FindingsLoaded(Message):
        findings: list[FindingLine]

    def __init__(self) -> None:
        super().__init__()
        self._notes: list[FindingLine] = []
        self._findings: list[FindingLine] = []
        self._shown: list[FindingLine] = []
        self._pending = True
        self._findings_timer: Timer | None = None

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="overview-top"):
            yield Static(Text("loading…", style="dim"), id="run-info", markup=False)
            with Vertical(id="kinds-box"):
                yield Static(Text("Events by kind", style="bold"), classes="pane-title", markup=False)
                yield DataTable(id="kinds", cursor_type="row")
        yield Static(
            Text("Findings (Enter opens the view)", style="bold"), classes="pane-title", markup=False
        )
        yield OptionList(id="findings", markup=False)
        yield Static(Text(""), id="finding-detail", markup=False)

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="overview")
    def _load(self) -> None:
        data = self.read(overview_data, self.cwd)
        if data is not None:
            self.post_message(self.Loaded(data))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        data = message.data
        self.query_one("#run-info", Static).update(self._run_info(data))
        kinds = self.query_one("#kinds", DataTable)
        kinds.clear(columns=True)
        kinds.add_column("kind", key="kind")
        kinds.add_column("events", key="count")
        kinds.add_column("view", key="view")
        for kind, n in data.counts.items():
            view = KIND_VIEWS.get(kind)
            kinds.add_row(
                Text(kind), Text(f"{n:,}", justify="right"), Text(view or "-", style="dim"), key=kind
            )
        self._notes = list(data.notes)
        self._pending = True
        self._show_findings()
        self._start_findings_pass()

    def _start_findings_pass(self) -> None:
        # a pass over the run's events: started once the user stays here a moment, so it
        # does not compete with their first steps elsewhere (a big run must be navigable
        # within two seconds of opening)
        if self._findings_timer is not None:
            self._findings_timer.stop()
        self._findings_timer = self.set_timer(FINDINGS_DELAY, self._load_findings)

    def on_screen_suspend(self) -> None:
        if self._findings_timer is not None:
            self._findings_timer.stop()
            self._findings_timer = None

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self._pending and self._findings_timer is None:
            self._start_findings_pass()

    def _load_findings(self) -> None:
        self._findings_timer = None
        self._findings_pass()

    @work(thread=True, exclusive=True, group="overview-findings")
    def _findings_pass(self) -> None:
        findings = self.read(finding_lines, self.cwd)
        if findings is not None:
            self.post_message(self.FindingsLoaded(findings))

    @on(FindingsLoaded)
    def _show_found(self, message: FindingsLoaded) -> None:
        self._findings = message.findings
        self._pending = False
        self._show_findings()

    def _show_findings(self) -> None:
        findings = [] if self._pending else list(self._findings)
        if not findings and not self._pending:
            findings = [
                FindingLine(
                    Text(
                        "nothing to fix: no recompiles, syncs, fallbacks or uploads that repeat in steady "
                        "state, no graph break in the step, no float64, no divergence"
                    ),
                    "info",
                    None,
                )
            ]
        findings += self._notes
        self._shown = findings
        options = self.query_one("#findings", OptionList)
        highlighted = options.highlighted
        options.clear_options()
        for i, f in enumerate(findings):
            icon, style = _ICONS[f.severity]
            prompt = Text(icon, style=style)
            prompt.append_text(f.text)
            if f.view:
                prompt.append(f"  → {f.view}", style="dim")
            options.add_option(Option(prompt, id=f"{i}:{f.view or ''}"))
        if self._pending:
            options.add_option(
                Option(Text("  looking for findings…", style="dim"), id="pending", disabled=True)
            )
        if findings:
            options.highlighted = min(highlighted or 0, len(findings) - 1)
        self._show_detail(options.highlighted)

    @on(OptionList.OptionHighlighted, "#findings")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show_detail(event.option_index)

    def _show_detail(self, index: int | None) -> None:
        detail: RenderableType = Text("")
        if index is not None and 0 <= index < len(self._shown) and self._shown[index].detail is not None:
            detail = Group(Text("Selected finding", style="bold"), self._shown[index].detail)
        self.query_one("#finding-detail", Static).update(detail)

    def _run_info(self, data: OverviewData) -> Table:
        m = data.metadata
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        status = Text(m.status, style="green" if m.status == "finished" else "yellow")
        if m.exit_status is not None:
            status.append(f" (exit status {m.exit_status})")
        if m.error:
            status.append(f": {m.error}", style="red")
        rows = [
            ("run", Text(self.run_app.session.run_dir.name)),
            ("command", Text(" ".join(m.argv) if m.argv else "-")),
            ("started", Text(m.start_time or "-")),
            ("duration", Text(format_seconds(m.duration) if m.duration is not None else "-")),
            ("status", status),
            ("platform", Text(f"XLA {m.platform.upper()} ({m.device_kind}), {m.device_count} device(s)")),
            ("mode", Text(", ".join(data.modes) if data.modes else "no device ops ran")),
            (
                "compiles",
                Text(f"{data.compiles:,} ({format_seconds(data.compile_seconds)} compiling)"
                     + (f"; {data.read_backs:,} read back from the compile cache" if data.read_backs else "")),
            ),
            ("steps", _steps_text(data.steps)),
            (
                "versions",
                Text(f"tpu_debug {m.tpu_debug_version}, torch {m.torch_version}, jax {m.jax_version}"),
            ),
        ]
        for key, value in rows:
            table.add_row(key, value)
        return table

    @on(OptionList.OptionSelected, "#findings")
    def _open_finding(self, event: OptionList.OptionSelected) -> None:
        view = (event.option.id or "").partition(":")[2]
        if view:
            self.app.switch_mode(view)

    @on(DataTable.RowSelected, "#kinds")
    def _open_kind(self, event: DataTable.RowSelected) -> None:
        view = KIND_VIEWS.get(str(event.row_key.value))
        if view:
            self.app.switch_mode(view)
