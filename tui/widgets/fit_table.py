"""``FitTable``: a DataTable whose columns fit its width, chosen by priority.

A table wider than its pane hides its right-hand columns behind a horizontal
scroll, and the cell at the pane's edge is cut mid-value ("461.16 m"). Here each
column says how much it matters and how far it can shrink: when the rows do not
fit, descriptive columns wrap down to their minimum width first, then the least
important columns are left out; a kept cell is never cut. The table refits when
its width changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import DataTable

__all__ = ["Col", "FitTable"]

_SCROLLBAR = 2  # the vertical scrollbar's width: reserved so a long table still fits


@dataclasses.dataclass(frozen=True)
class Col:
    """One column: ``drop`` 0 is always kept; when the table is too narrow the columns with
    ``drop`` 1 are left out first, then 2, and so on; ``shrink`` is the width a descriptive column may wrap down to
    (None: always as wide as its widest cell)."""

    label: str
    key: str
    drop: int = 0
    shrink: int | None = None


def _width(cell: Text) -> int:
    return max((line.cell_len for line in cell.split()), default=0)


def _as_text(cell: Any) -> Text:
    return cell if isinstance(cell, Text) else Text(str(cell))


def plan_columns(cols: Sequence[Col], rows: Sequence[Sequence[Text]], width: int, pad: int) -> dict[str, int]:
    """The columns to show (key -> width, in table order) for ``rows`` in ``width`` cells
    (``pad`` cells around each column); ``width`` 0 means unlimited."""
    natural = [max([len(c.label), *(_width(row[i]) for row in rows)]) for i, c in enumerate(cols)]
    least = [min(n, c.shrink) if c.shrink is not None else n for n, c in zip(natural, cols, strict=True)]
    kept = list(range(len(cols)))

    def total(widths: list[int]) -> int:
        return sum(widths[i] + 2 * pad for i in kept)

    if width > 0:
        # leave out the least important columns (the rightmost of equal importance first)
        while total(least) > width:
            droppable = [i for i in kept if cols[i].drop > 0]
            if not droppable:
                break
            kept.remove(min(droppable, key=lambda i: (cols[i].drop, -i)))
        # a descriptive column that may be left out goes before one that matters wraps
        while total(natural) > width:
            optional = [i for i in kept if cols[i].drop > 0 and cols[i].shrink is not None]
            if not optional:
                break
            kept.remove(min(optional, key=lambda i: (cols[i].drop, -i)))
    widths = list(natural)
    excess = total(widths) - width if width > 0 else 0
    while excess > 0:
        # narrow the widest column that can still wrap, one cell at a time
        can = [i for i in kept if widths[i] > least[i]]
        if not can:
            break
        widest = max(can, key=lambda i: widths[i] - least[i])
        widths[widest] -= 1
        excess -= 1
    return {cols[i].key: widths[i] for i in kept}


class FitTable(DataTable):
    """Set the columns with :meth:`set_columns`, the rows with :meth:`fill` (and, a page at
    a time, :meth:`append`): each row is one cell per declared column, in order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cols: list[Col] = []
        self._rows: list[tuple[list[Text], str | None]] = []
        self._plan: dict[str, int] = {}
        self._fitted_width = -1

    def set_columns(self, cols: Sequence[Col]) -> None:
        self._cols = list(cols)
        self.fill([])

    @property
    def shown_columns(self) -> list[str]:
        """The keys of the columns shown now."""
        return list(self._plan)

    def _available(self) -> int:
        width = self.size.width
        return max(width - _SCROLLBAR, 1) if width else 0

    def fill(self, rows: Sequence[Sequence[Any]], keys: Sequence[str | None] | None = None) -> None:
        """Replace every row (and fit the columns to them)."""
        keys = list(keys) if keys is not None else [None] * len(rows)
        self._rows = [([_as_text(c) for c in row], key) for row, key in zip(rows, keys, strict=True)]
        self._refit()

    def append(self, rows: Sequence[Sequence[Any]], keys: Sequence[str | None]) -> None:
        """Add rows at the end; the columns refit when a new cell is wider than its column."""
        new = [([_as_text(c) for c in row], key) for row, key in zip(rows, keys, strict=True)]
        self._rows.extend(new)
        plan = plan_columns(self._cols, [r for r, _ in self._rows], self._available(), self.cell_padding)
        if plan != self._plan:
            self._refit()
            return
        for cells, key in new:
            self._add(cells, key)

    def set_cell(self, row_key: str, col_key: str, cell: Any) -> None:
        """Change one cell (kept for a refit even while its column is left out)."""
        cell = _as_text(cell)
        index = [c.key for c in self._cols].index(col_key)
        for cells, key in self._rows:
            if key == row_key:
                cells[index] = cell
        if col_key not in self._plan:
            return
        if _width(cell) > self._plan[col_key]:
            self._refit()
        else:
            self.update_cell(row_key, col_key, cell)

    def _refit(self) -> None:
        if not self._cols:  # columns added the DataTable way: nothing to fit
            self.clear()
            return
        cursor = self.cursor_row
        self._fitted_width = self.size.width
        self._plan = plan_columns(
            self._cols, [r for r, _ in self._rows], self._available(), self.cell_padding
        )
        self.clear(columns=True)
        for col in self._cols:
            if col.key in self._plan:
                self.add_column(col.label, key=col.key, width=self._plan[col.key])
        for cells, key in self._rows:
            self._add(cells, key)
        if self._rows and cursor > 0:
            self.move_cursor(row=min(cursor, len(self._rows) - 1), animate=False)

    def _add(self, cells: list[Text], key: str | None) -> None:
        shown = [cell for col, cell in zip(self._cols, cells, strict=True) if col.key in self._plan]
        wraps = any(
            _width(cell) > self._plan[col.key]
            for col, cell in zip(self._cols, cells, strict=True)
            if col.key in self._plan
        )
        self.add_row(*shown, key=key, height=None if wraps else 1)

    def on_resize(self, event: events.Resize) -> None:
        if self._cols and event.size.width != self._fitted_width:
            self._refit()
