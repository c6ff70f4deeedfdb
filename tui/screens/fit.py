"""``FitScreen``: the fit answers the run holds (``tpu-debug fit``, ``record_fit``): per chip,
the HBM the step needs against what the compiler offers and its breakdown, the collectives,
and the step estimates."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import Static
from tpu_debug.core.format import format_bytes, format_count, format_seconds
from tpu_debug.tracers.events import FitEvent
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.widgets import Col, FitTable

__all__ = ["FitScreen"]

NO_FIT = "no fit answer in this run: tpu-debug fit MODEL --target SLICE --plan PLAN keeps one as a run"
_VERDICT = {True: ("FITS", "bold green"), False: ("DOES NOT FIT", "bold red"),
            None: ("REFUSED", "bold yellow")}

def _summary(e: FitEvent) -> Text:
    text = Text()
    text.append(f"{e.model} ({format_count(e.parameters)} parameters), {e.job}, batch {e.batch} x seq "
                f"{e.seq} on {e.target} ({e.chips} x {e.device_kind}), plan {e.plan}: ")
    text.append(*_VERDICT[e.fits])
    if e.required_bytes is not None:
        room = e.headroom_bytes or 0
        spare = f"{format_bytes(room)} to spare" if room >= 0 else f"{format_bytes(-room)} short"
        text.append(f"\nper chip: needs {format_bytes(e.required_bytes)} of {format_bytes(e.capacity_bytes)} "
                    f"usable ({e.capacity_source}); {spare}")
    parts = e.breakdown()
    if parts:
        text.append("\nbreakdown: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items()))
    if e.host_bytes:
        text.append(f"\nhost memory: {format_bytes(e.host_bytes)} per chip offloaded by the checkpoint policy "
                    "(not in the HBM figures)")
    if e.step_seconds is not None:
        text.append(f"\nestimate: step ~{format_seconds(e.step_seconds)} (compute {format_seconds(e.compute_seconds)}, "
                    f"memory {format_seconds(e.memory_seconds)}, communication {format_seconds(e.comm_seconds)}), "
                    f"~{e.tokens_per_second or 0:,.0f} tokens/s, MFU ~{e.mfu or 0:.1%}")
        text.append(" (not measured)", style="dim")
    if e.error and not e.fits:
        text.append(f"\ncompiler: {e.error}", style="dim")
    if e.communication:
        text.append("\ncommunication per step beside the plan's bound:")
    for b in e.communication:
        ratio = "the plan needs none" if b.ratio is None else f"{b.ratio:.2f}x the bound"
        text.append(f"\n  {b.kind}: {format_bytes(b.compiled_bytes)} compiled, bound {format_bytes(b.bound_bytes)}: ")
        text.append(ratio, style="bold yellow" if b.reasons else "")
        text.append(f" ({b.basis})", style="dim")
        if b.reasons:
            text.append("\n    the bytes come from: " + "; ".join(b.reasons), style="yellow")
    for c in e.caveats:
        text.append(f"\ncaution: {c}", style="yellow")
    return text


class FitScreen(RunScreen):
    """The run's fit answer: per-chip memory and its breakdown, the estimates, the collectives."""

    AUTO_FOCUS = "#fit-collectives"

    @dataclasses.dataclass
    class Loaded(Message):
        events: list[Any]

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="fit-summary", markup=False)
        yield FitTable(id="fit-collectives", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#fit-collectives", FitTable).set_columns(
            [
                Col("collective (per chip)", "kind", shrink=10),
                Col("count", "count"),
                Col("data", "data"),
                Col("on the wire", "wire"),
                Col("ICI time ~", "time", drop=1),
            ]
        )
        super().on_mount()

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="fit")
    def _load(self) -> None:
        events = self.read(lambda session: session.events("fit"))
        if events is not None:
            self.post_message(self.Loaded(events))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        table = self.query_one("#fit-collectives", FitTable)
        if not message.events:
            self.query_one("#fit-summary", Static).update(Text(NO_FIT, style="dim"))
            table.fill([])
            return
        last = message.events[-1]  # one per run from the command line; the last of a script's
        self.query_one("#fit-summary", Static).update(_summary(last))
        rows = [
            (Text(c.kind), Text(f"{c.count:,}", justify="right"),
             Text(format_bytes(c.data_bytes), justify="right"),
             Text(format_bytes(c.wire_bytes), justify="right"), Text(format_seconds(c.seconds), justify="right"))
            for c in last.collectives
        ]
        table.fill(rows, [str(i) for i in range(len(rows))])
