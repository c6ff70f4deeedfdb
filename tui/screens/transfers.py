"""``TransfersScreen``: host <-> device transfers by call site and over time, implicit ones
(syncs nobody asked for: ``.item()``, ``print``, ``bool()``, CPU fallbacks) marked and first.
A site the advisor found worth fixing shows its finding's fix."""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Sparkline, Static
from textual.worker import get_current_worker
from tpu_debug.tracers.advisor import Finding
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.reading import TransferSite
from tpu_debug.tui.format import format_bytes, format_seconds, location_text, sparkline
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.widgets import Col, FitTable, SourceExcerpt, SourceView, read_excerpt

from tpu_debug.report import advice_of
from tpu_debug.session import Session

__all__ = ["TransfersScreen"]

BUCKETS = 60  # time buckets of the timeline (the per-site column shows them in 20)


# the kinds of finding that are about a transfer site: the site's cause as the finding has it
_SITE_FINDINGS = ("implicit_sync", "h2d_every_step", "cpu_fallback")


def site_findings(session: Session) -> dict[tuple[SourceLocation | None, str], Finding]:
    """The advisor's findings about transfer sites, by (line, cause)."""
    out: dict[tuple[SourceLocation | None, str], Finding] = {}
    for f in advice_of(session).findings:
        if f.kind in _SITE_FINDINGS and f.cause is not None:
            cause = f"fallback:{f.cause}" if f.kind == "cpu_fallback" else f.cause
            out.setdefault((f.evidence.location, cause), f)
    return out


def _mini(timeline: tuple[int, ...], width: int = 20) -> str:
    if not timeline:
        return ""
    step = len(timeline) / width
    return sparkline([sum(timeline[int(i * step) : int((i + 1) * step)]) for i in range(width)])


class TransfersScreen(RunScreen):
    """Transfer sites (implicit first, then most frequent) with a timeline of each."""

    AUTO_FOCUS = "#sites"

    @dataclasses.dataclass
    class Loaded(Message):
        sites: list[TransferSite]

    @dataclasses.dataclass
    class SourceLoaded(Message):
        excerpt: SourceExcerpt | None

    @dataclasses.dataclass
    class FindingsLoaded(Message):
        findings: dict[tuple[SourceLocation | None, str], Finding]

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[TransferSite] = []
        self._findings: dict[tuple[SourceLocation | None, str], Finding] = {}

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="tr-summary", markup=False)
        yield Static(Text("all transfers over time", style="dim"), id="tr-all-label", markup=False)
        yield Sparkline([], id="tr-all")
        yield FitTable(id="sites", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="tr-detail"):
            with Vertical(id="tr-site-box", classes="pane"):
                yield Static(
                    Text("Selected site over time", style="bold"),
                    id="tr-site-label",
                    classes="pane-title",
                    markup=False,
                )
                yield Sparkline([], id="tr-site")
                yield Static(Text(""), id="tr-site-info", markup=False)
            with Vertical(id="tr-source-box", classes="pane"):
                yield Static(Text("Source", style="bold"), classes="pane-title", markup=False)
                yield SourceView(id="tr-source")

    def on_mount(self) -> None:
        # where, how many and how long matter most: the timeline and labels are left out first
        self.query_one("#sites", FitTable).set_columns(
            [
                Col("kind", "kind", drop=3),
                Col("dir", "dir", drop=2),
                Col("by", "by", shrink=8),
                Col("where", "where", shrink=16),
                Col("count", "count"),
                Col("bytes", "bytes", drop=4),
                Col("time", "time"),
                Col("over time", "timeline", drop=1),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load()
        self._load_findings()

    @work(thread=True, exclusive=True, group="transfer-findings")
    def _load_findings(self) -> None:
        findings = self.read(site_findings)
        if findings is not None:
            self.post_message(self.FindingsLoaded(findings))

    @on(FindingsLoaded)
    def _show_findings(self, message: FindingsLoaded) -> None:
        self._findings = message.findings
        self._select(self.query_one("#sites", DataTable).cursor_row)

    @work(thread=True, exclusive=True, group="transfers")
    def _load(self) -> None:
        sites = self.read(lambda s: s.transfers.sites(buckets=BUCKETS))
        if sites is not None:
            self.post_message(self.Loaded(sites))

    @work(thread=True, exclusive=True, group="transfer-source")
    def _load_source(self, location: SourceLocation | None) -> None:
        excerpt = read_excerpt(location, self.cwd) if location is not None else None
        if not get_current_worker().is_cancelled:
            self.post_message(self.SourceLoaded(excerpt))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        sites = self.sites = message.sites
        table = self.query_one("#sites", FitTable)
        row = table.cursor_row
        table.fill([])
        summary = Text()
        if not sites:
            summary.append("no host <-> device transfers were recorded", style="dim")
            self.query_one("#tr-summary", Static).update(summary)
            return
        total = sum(s.count for s in sites)
        implicit = sum(s.count for s in sites if s.implicit)
        summary.append(f"{total:,} transfers", style="bold")
        summary.append(
            f", {format_bytes(sum(s.nbytes for s in sites))}, {format_seconds(sum(s.seconds for s in sites))}"
        )
        summary.append(f" · {implicit:,} implicit", style="bold yellow" if implicit else "dim")
        summary.append(f" · {len(sites)} call sites")
        self.query_one("#tr-summary", Static).update(summary)
        overall = [sum(s.timeline[i] for s in sites if s.timeline) for i in range(BUCKETS)]
        self.query_one("#tr-all", Sparkline).data = overall
        t0 = min(s.first_ts for s in sites)
        t1 = max(s.last_ts for s in sites)
        self.query_one("#tr-all-label", Static).update(
            Text(f"all transfers over time, {t0:.2f}s .. {t1:.2f}s ({BUCKETS} buckets)", style="dim")
        )
        rows = []
        for s in sites:
            kind = Text("▲ implicit", style="bold yellow") if s.implicit else Text("explicit", style="dim")
            rows.append([
                kind,
                Text(s.direction),
                Text(s.op),
                location_text(s.location, self.cwd),
                Text(f"{s.count:,}", justify="right"),
                Text(format_bytes(s.nbytes), justify="right"),
                Text(format_seconds(s.seconds), justify="right"),
                Text(_mini(s.timeline), style="yellow" if s.implicit else "cyan"),
            ])
        table.fill(rows, [str(i) for i in range(len(rows))])
        table.move_cursor(row=min(row, len(sites) - 1))
        self._select(table.cursor_row)
        if self.focused is None:
            table.focus()

    @on(DataTable.RowHighlighted, "#sites")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select(self.query_one("#sites", DataTable).cursor_row)

    def _select(self, row: int) -> None:
        if not 0 <= row < len(self.sites):
            return
        s = self.sites[row]
        self.query_one("#tr-site", Sparkline).data = list(s.timeline) or [0]
        label = Text("Selected site over time: ", style="bold")
        label.append(f"{s.op} ({s.direction})", style="bold yellow" if s.implicit else "bold")
        self.query_one("#tr-site-label", Static).update(label)
        info = Text()
        info.append(f"{s.count:,} transfers, {format_bytes(s.nbytes)}, {format_seconds(s.seconds)}; ")
        info.append(f"first at {s.first_ts:.3f}s, last at {s.last_ts:.3f}s")
        if s.implicit:
            info.append("\nimplicit: the program waited for the device here without asking for a copy", style="yellow")
        finding = self._findings.get((s.location, s.op))
        if finding is not None:
            info.append("\n" + finding.title, style="bold")
            info.append("\n→ " + finding.fix, style="dim")
        self.query_one("#tr-site-info", Static).update(info)
        self._load_source(s.location)

    @on(SourceLoaded)
    def _show_source(self, message: SourceLoaded) -> None:
        self.query_one("#tr-source", SourceView).show(message.excerpt, self.cwd)
