"""``RanksScreen`` (``r``): the ranks of a multi-process run side by side; Enter shows one."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static
from tpu_debug.core.errors import TpuDebugError
from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.tracers.reading.program_collectives import compare_ranks
from tpu_debug.tracers.reading.rank_programs import compiled_programs, first_program_difference

from tpu_debug.report import rank_figures
from tpu_debug.report.ranks import c10d_data, call_text, in_collectives_text, ops_text, straggler_lines
from tpu_debug.session import Session

__all__ = ["RanksScreen"]


def load_ranks(group: Any) -> tuple[list[tuple[int, dict[str, str]]], str, dict[str, Any]]:
    """Each rank's figures (the report's per-rank columns), where the ranks' programs first
    differ, and their c10d collectives side by side (:func:`~tpu_debug.report.ranks.c10d_data`),
    read with sessions of this thread's own."""


    out = []
    events = []
    sessions = [(rank, Session(path / "run.db")) for rank, path in group.rank_dirs().items()]
    try:
        for rank, session in sessions:
            figures = rank_figures(session)
            error = session.metadata().error
            figures["error"] = error.splitlines()[0] if error else ""
            out.append((rank, figures))
            events.append((rank, session.events("collectives")))
        c10d = c10d_data(sessions)
        graphs = first_program_difference({rank: compiled_programs(s) for rank, s in sessions})
    finally:
        for _, session in sessions:
            session.close()
    diff = compare_ranks(events)
    agreement = diff.render() if diff is not None else (
        "every rank compiled the same multi-device programs, with the same collectives"
        if len(out) > 1 and any(e for _, e in events) else ""
    )
    if graphs is not None:
        agreement = "\n".join(a for a in (graphs.render(), agreement) if a)
    return out, agreement, c10d


def _sequence_text(c10d: dict[str, Any]) -> Text:
    """The desyncs, then each group's collectives in order, one line per collective and rank."""

    text = Text()
    for d in c10d["desyncs"]:
        text.append(f"collective desync: {d['text']}\n", style="bold red")
    for line in straggler_lines(c10d):
        text.append(line + "\n", style="bold yellow")
    for seq in c10d["sequence"]:
        text.append(f"group {seq['group']}: collectives in order ({len(seq['rows'])} of {seq['total']})\n",
                    style="bold")
        for row in seq["rows"]:
            differ = row["seq"] == seq["first_difference"]
            for i, c in enumerate(row["calls"]):
                head = f"{row['seq']:>4} {'≠' if differ else ' '} " if i == 0 else " " * 7
                text.append(f"{head}rank {c['rank']}: {call_text(c['call'])}\n", style="red" if differ else "")
    return text


class RanksScreen(ModalScreen[int | None]):
    """One row per rank: status, work, collectives; Enter switches the TUI to that rank."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("r", "dismiss", "Close", show=False),
        Binding("q", "app.quit", "Quit"),  # as in every view: q leaves the TUI
    ]

    @dataclasses.dataclass
    class Loaded(Message):
        figures: list[tuple[int, dict[str, str]]]
        agreement: str
        c10d: dict[str, Any]

    def __init__(self, group: Any, current: int | None) -> None:
        super().__init__()
        self.group = group
        self.current = current
        self.ranks: list[int] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="ranks-box"):
            yield Static(Text(f"Ranks of {self.group.name}", style="bold"), id="ranks-title", markup=False)
            yield DataTable(id="ranks-table", cursor_type="row", zebra_stripes=True)
            yield Static(Text("loading…", style="dim"), id="ranks-agreement", markup=False)
            yield Static(Text(""), id="ranks-c10d-title", markup=False)
            yield DataTable(id="ranks-c10d", cursor_type="none", zebra_stripes=True)
            yield Static(Text(""), id="ranks-sequence", markup=False)

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="ranks")
    def _load(self) -> None:
        try:
            figures, agreement, c10d = load_ranks(self.group)
        except TpuDebugError as exc:
            self.app.call_from_thread(self.app.show_error, str(exc))  # type: ignore[attr-defined]
            return
        self.post_message(self.Loaded(figures, agreement, c10d))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        table = self.query_one("#ranks-table", DataTable)
        table.clear(columns=True)
        if not message.figures:
            self.query_one("#ranks-agreement", Static).update(Text("no rank recorded anything", style="dim"))
            return
        keys = list(message.figures[0][1])
        table.add_column("rank", key="rank")
        for key in keys:
            table.add_column(key, key=key)
        self.ranks = []
        for rank, figures in message.figures:
            mark = "▶ " if rank == self.current else "  "
            table.add_row(
                Text(f"{mark}{rank}", style="bold" if rank == self.current else ""),
                *[Text(figures[k], style="red" if k == "error" and figures[k] else "") for k in keys],
                key=str(rank),
            )
            self.ranks.append(rank)
        if self.current in self.ranks:
            table.move_cursor(row=self.ranks.index(self.current))
        table.focus()
        self.query_one("#ranks-agreement", Static).update(Text(message.agreement))
        self._show_c10d(message.c10d)

    def _show_c10d(self, c10d: dict[str, Any]) -> None:
        """Each rank's c10d collectives per group, then their order and the first desync."""


        if not any(r["calls"] for r in c10d["per_rank"]):
            return
        self.query_one("#ranks-c10d-title", Static).update(Text("c10d collectives by rank", style="bold"))
        table = self.query_one("#ranks-c10d", DataTable)
        table.clear(columns=True)
        for column in ("rank", "group (ranks)", "calls", "bytes", "waited", "in them", "by op"):
            table.add_column(column, key=column)
        for r in c10d["per_rank"]:
            for g in r["groups"]:
                table.add_row(
                    str(r["rank"]), f"{g['group']} ({', '.join(map(str, g['ranks']))})", str(g["count"]),
                    format_bytes(g["bytes"]), format_seconds(g["waited"]), in_collectives_text(g), ops_text(g["ops"]),
                )
        self.query_one("#ranks-sequence", Static).update(_sequence_text(c10d))

    @on(DataTable.RowSelected, "#ranks-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self.query_one("#ranks-table", DataTable).cursor_row
        self.dismiss(self.ranks[row] if 0 <= row < len(self.ranks) else None)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
