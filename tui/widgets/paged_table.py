"""``PagedTable``: a DataTable that asks for the next page when the cursor nears its end."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable
from tpu_debug.tui.widgets.fit_table import FitTable

__all__ = ["PagedTable"]


class PagedTable(FitTable):
    """Rows arrive a page at a time: set ``has_more`` after adding a page; when the cursor
    comes within ``prefetch`` rows of the end, :class:`NeedMore` is posted once per page.
    Home / End go to the first / last row loaded (End again loads the next page)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]

    @dataclasses.dataclass
    class NeedMore(Message):
        """Load the rows from ``offset`` on."""

        table: PagedTable
        offset: int

        @property
        def control(self) -> PagedTable:
            return self.table

    def __init__(self, *, page_size: int = 200, prefetch: int = 20, **kwargs) -> None:
        kwargs.setdefault("cursor_type", "row")
        super().__init__(**kwargs)
        self.page_size = page_size
        self.prefetch = prefetch
        self.has_more = False
        self._asked_at = -1

    def reset(self) -> None:
        """Empty the table (columns kept) before loading from the start."""
        self.fill([])
        self.has_more = False
        self._asked_at = -1

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.check_more()

    def check_more(self) -> None:
        if not self.has_more or self._asked_at == self.row_count:
            return
        if self.cursor_row >= self.row_count - self.prefetch:
            self._asked_at = self.row_count
            self.post_message(self.NeedMore(self, self.row_count))
