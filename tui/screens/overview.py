"""``OverviewScreen``: the run at a glance, and what is worth a look, each linking to its view."""

from __future__ import annotations

import dataclasses

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option
from tpu_debug.tracers.query import RunMetadata, TransferSite
from tpu_debug.tui.format import format_float, format_seconds, location_text
from tpu_debug.tui.screens.base import RunScreen

from tpu_debug.session import Session

__all__ = ["Finding", "OverviewData", "OverviewScreen", "overview_data"]

# which view shows each event kind
KIND_VIEWS = {
    "compile": "recompiles",
    "graph_break": "recompiles",
    "op": "ops",
    "fallback": "ops",
    "transfer": "transfers",
    "divergence": "divergence",
    "guard_failure": "recompiles",
    "recompile_limit": "recompiles",
    "materialize": "recompiles",  # lazy mode: its fused graphs are compiles there
}


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """Something worth a look: what it says, how serious, and the view that shows it."""

    text: Text
    severity: str  # "warning" | "info" | "error"
    view: str | None
    order: int = 0  # where it goes in the list (findings arrive in two batches)


@dataclasses.dataclass(frozen=True, slots=True)
class OverviewData:
    metadata: RunMetadata
    counts: dict[str, int]
    modes: list[str]
    compiles: int
    compile_seconds: float
    findings: list[Finding]
    transfers_pending: bool  # the transfer findings come later (one pass over every transfer)


def _top_recompiles(session: Session, cwd: str | None) -> list[Finding]:
    from tpu_debug.tracers.recompiles import summarize

    groups = [g for g in session.compile_groups() if g.compiles > 1]
    out = []
    for g in groups[:3]:
        text = Text()
        text.append(g.identity, style="bold")
        text.append(f" ({g.mode}) compiled {g.compiles} times, {format_seconds(g.seconds)} compiling")
        history = session.compile_history(g.identity, mode=g.mode, limit=200)
        summary = summarize(history)
        change = summary[0].changing if summary else None
        if change is not None:
            text.append(f"; keeps changing: {change.what} ({change.count}x)", style="yellow")
        where = next((c.location for c in reversed(history) if c.location is not None), None)
        if where is not None:
            text.append(" at ")
            text.append_text(location_text(where, cwd, function=False))
        out.append(Finding(text, "warning" if g.recompiles or g.names > 1 else "info", "recompiles"))
    return out


def _transfers(sites: list[TransferSite], cwd: str | None) -> list[Finding]:
    implicit = [s for s in sites if s.implicit]
    if not implicit:
        return []
    total = sum(s.count for s in implicit)
    top = max(implicit, key=lambda s: (s.count, s.seconds))
    text = Text()
    text.append(f"{total} implicit transfer{'s' if total != 1 else ''}", style="bold")
    text.append(f" (syncs nobody asked for); most from {top.op} ({top.direction}, {top.count}x) at ")
    text.append_text(location_text(top.location, cwd, function=False))
    return [Finding(text, "warning", "transfers", order=1)]


def _divergence(session: Session, cwd: str | None) -> list[Finding]:
    ranked = session.ranked_divergences(limit=1)
    if not ranked:
        return []
    d = ranked[0]
    text = Text()
    text.append("first divergence" if d.first else "largest divergence", style="bold")
    text.append(": ")
    text.append(d.name, style="bold")
    text.append(f" ({d.mode or '-'}, {d.measure}) max abs {format_float(d.max_abs)}")
    if d.ratio:
        text.append(f", {format_float(d.ratio)}x its tolerance")
    if d.nan_origin:
        text.append(", NaN/Inf starts here", style="red")
    text.append(" at ")
    text.append_text(location_text(d.location, cwd, function=False))
    return [Finding(text, "error" if d.first or d.nan_origin else "info", "divergence", order=2)]


def _lazy_graphs(session: Session, cwd: str | None) -> list[Finding]:
    # lazy mode (DEFER_AND_FUSE): a step run as several graphs, and the line that cut it
    from tpu_debug.tracers.lazy_graphs import summarize

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
        return [Finding(text, "warning", "recompiles", order=3)]
    text.append(f"{lazy.graphs} lazy graph(s)", style="bold")
    text.append(f" run as {lazy.programs} program(s), {lazy.compiles} compiled")
    if lazy.graphs_per_step is not None:
        text.append(f"; {lazy.graphs_per_step:g} per optimizer step")
    return [Finding(text, "info", "recompiles", order=3)]


def _by_name(counts: dict[str, tuple[int, float]], what: str, view: str, order: int) -> list[Finding]:
    if not counts:
        return []
    total = sum(n for n, _ in counts.values())
    names = sorted(counts.items(), key=lambda kv: -kv[1][0])
    text = Text()
    text.append(f"{total} {what}", style="bold")
    text.append(": " + ", ".join(f"{name} ×{n}" for name, (n, _) in names[:4]))
    if len(names) > 4:
        text.append(f", +{len(names) - 4} more", style="dim")
    return [Finding(text, "warning", view, order)]


def overview_data(session: Session, cwd: str | None) -> OverviewData:
    """What the overview shows first: all of it but the transfer findings (see
    :func:`transfer_findings`), from the run's indexes and small tables."""
    meta = session.metadata()
    counts = session.counts()
    groups = session.compile_groups()
    findings: list[Finding] = []
    findings += _top_recompiles(session, cwd)
    if counts.get("divergence"):
        findings += _divergence(session, cwd)
    if counts.get("materialize"):
        findings += _lazy_graphs(session, cwd)
    if counts.get("fallback"):
        findings += _by_name(
            session.counts_by_name("fallback"), "CPU fallbacks (ops with no lowering)", "ops", 3
        )
    if counts.get("recompile_limit"):
        findings += [
            dataclasses.replace(f, severity="error")
            for f in _by_name(
                session.counts_by_name("recompile_limit"), "hit dynamo's recompile limit", "recompiles", 4
            )
        ]
    if counts.get("graph_break"):
        findings += _by_name(session.counts_by_name("graph_break"), "graph breaks", "recompiles", 5)
    wide = session.float64_ops()  # runs on this backend; a TPU has no float64
    if wide:
        findings += _by_name(
            {name: (runs, 0.0) for name, (_, runs) in wide.items()},
            "op executions in float64 (a TPU has no float64)", "ops", 5,
        )
    if counts.get("internal_error"):
        n = counts["internal_error"]
        findings.append(
            Finding(
                Text(f"{n} tracer error(s) were recorded; the traced program was not affected"),
                "info",
                None,
                6,
            )
        )
    return OverviewData(
        meta,
        counts,
        session.modes(),
        sum(g.compiles for g in groups),
        sum(g.seconds for g in groups),
        findings,
        bool(counts.get("transfer")),
    )


def transfer_findings(session: Session, cwd: str | None) -> list[Finding]:
    """The overview's transfer findings (a pass over every transfer of the run)."""
    return _transfers(session.transfer_sites(), cwd)


TRANSFER_PASS_DELAY = 0.75  # seconds on the overview before its transfer findings are looked for

_ICONS = {"error": ("✖ ", "bold red"), "warning": ("▲ ", "bold yellow"), "info": ("● ", "cyan")}


class OverviewScreen(RunScreen):
    """Platform, mode, duration, status, events per kind, and the findings (Enter opens one)."""

    AUTO_FOCUS = "#findings"

    @dataclasses.dataclass
    class Loaded(Message):
        data: OverviewData

    @dataclasses.dataclass
    class TransfersLoaded(Message):
        findings: list[Finding]

    def __init__(self) -> None:
        super().__init__()
        self._findings: list[Finding] = []
        self._pending = False
        self._transfer_timer: Timer | None = None

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
        self._findings = list(data.findings)
        self._pending = data.transfers_pending
        self._show_findings()
        if data.transfers_pending:
            self._start_transfer_pass()

    def _start_transfer_pass(self) -> None:
        # a pass over every transfer: started once the user stays here a moment, so it
        # does not compete with their first steps elsewhere (a big run must be navigable
        # within two seconds of opening)
        if self._transfer_timer is not None:
            self._transfer_timer.stop()
        self._transfer_timer = self.set_timer(TRANSFER_PASS_DELAY, self._load_transfers)

    def on_screen_suspend(self) -> None:
        if self._transfer_timer is not None:
            self._transfer_timer.stop()
            self._transfer_timer = None

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self._pending and self._transfer_timer is None:
            self._start_transfer_pass()

    def _load_transfers(self) -> None:
        self._transfer_timer = None
        self._transfer_pass()

    @work(thread=True, exclusive=True, group="overview-transfers")
    def _transfer_pass(self) -> None:
        findings = self.read(transfer_findings, self.cwd)
        if findings is not None:
            self.post_message(self.TransfersLoaded(findings))

    @on(TransfersLoaded)
    def _show_transfers(self, message: TransfersLoaded) -> None:
        self._findings = [f for f in self._findings if f.view != "transfers"] + message.findings
        self._pending = False
        self._show_findings()

    def _show_findings(self) -> None:
        findings = sorted(self._findings, key=lambda f: f.order)
        if not findings and not self._pending:
            findings = [
                Finding(
                    Text("nothing stands out: no recompiles, implicit transfers, divergences or fallbacks"),
                    "info",
                    None,
                )
            ]
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
                Option(Text("  looking through the transfers…", style="dim"), id="pending", disabled=True)
            )
        if findings:
            options.highlighted = min(highlighted or 0, len(findings) - 1)

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
                Text(f"{data.compiles:,} ({format_seconds(data.compile_seconds)} compiling)"),
            ),
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
