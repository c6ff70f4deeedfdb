"""``HelpScreen`` (``?``): the keys that work where the user is, and how to move around."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Static

__all__ = ["HelpScreen"]

_INTRO = (
    "Tab / Shift+Tab move between panes, arrows move in them, Enter opens what is selected. "
    "Click works too: rows, column headers (sort), and the keys in the footer."
)


class HelpScreen(ModalScreen[None]):
    """Key bindings of the screen underneath (its focused pane first) and of the whole app."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", key_display="?"),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self._rows = _binding_rows(under, under.app)

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Text("Keys", style="bold"), id="help-title", markup=False)
            yield Static(Text(_INTRO, style="dim"), id="help-intro", markup=False)
            table = DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            table.add_columns("key", "does", "where")
            for key, description, where in self._rows:
                table.add_row(Text(key, style="bold"), Text(description), Text(where, style="dim"))
            yield table

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


def _binding_rows(screen: Screen, app: App) -> list[tuple[str, str, str]]:
    """(keys, what they do, where) for every described binding; keys doing the same thing
    in the same place share a row (``q, ^q  Quit``)."""
    merged: dict[tuple[str, str], list[str]] = {}
    for active in screen.active_bindings.values():
        binding = active.binding
        if not binding.description or binding.system:
            continue
        display = binding.key_display or app.get_key_display(binding)
        node = active.node
        where = "everywhere" if node is app else ("this view" if node is screen else type(node).__name__)
        keys = merged.setdefault((binding.description, where), [])
        if display not in keys:
            keys.append(display)
    order = {"this view": 0, "everywhere": 1}
    rows = [(", ".join(keys), description, where) for (description, where), keys in merged.items()]
    rows.sort(key=lambda r: order.get(r[2], 2))
    return rows
