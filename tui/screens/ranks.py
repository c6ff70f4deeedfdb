"""``RanksScreen`` (``r``): the ranks of a multi-process run side by side; Enter shows one."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from tpu_debug.core.errors import TpuDebugError
from tpu_debug.session import Session

__all__ = ["RanksScreen"]


def load_ranks(group: Any) -> tuple[list[tuple[int, dict[str, str]]], str]:
    """Each rank's figures (the report's per-rank columns) and where the ranks first differ,
    read with sessions of this thread's own."""
    from tpu_debug.tracers.collectives import compare_ranks

    from tpu_debug.report import rank_figures

    out = []
    events = []
    for rank, path in group.rank_dirs().items():
        with Session(path / "run.db") as session:
            figures = rank_figures(session)
            error = session.metadata().error
            figures["error"] = error.splitlines()[0] if error else ""
            out.append((rank, figures))
            events.append((rank, session.events("collectives")))
    diff = compare_ranks(events)
    agreement = diff.render() if diff is not None else (
        "every rank compiled the same multi-device programs, with the same collectives" if len(out) > 1 else ""
    )
    return out, agreement


class RanksScreen(ModalScreen[int | None]):
    """One row per rank: status, work, collectives; Enter switches the TUI to that rank."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("r", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    @dataclasses.dataclass
    class Loaded(Message):
        figures: list[tuple[int, dict[str, str]]]
        agreement: str

    def __init__(self, group: Any, current: int | None) -> None:
        super().__init__()
        self.group = group
        self.current = current
        self.ranks: list[int] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="ranks-box"):
            yield Static(Text(f"Ranks of {self.group.name}", style="bold"), id="ranks-title", markup=False)
            yield DataTable(id="ranks-table", cursor_type="row", zebra_stripes=True)
            yield Static(Text("loading…", style="dim"), id="ranks-agreement", markup=False)

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="ranks")
    def _load(self) -> None:
        try:
            figures, agreement = load_ranks(self.group)
        except TpuDebugError as exc:
            self.app.call_from_thread(self.app.show_error, str(exc))  # type: ignore[attr-defined]
            return
        self.post_message(self.Loaded(figures, agreement))

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

    @on(DataTable.RowSelected, "#ranks-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self.query_one("#ranks-table", DataTable).cursor_row
        self.dismiss(self.ranks[row] if 0 <= row < len(self.ranks) else None)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
