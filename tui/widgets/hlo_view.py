"""``HloView``: a read-only, line-virtualized HLO text view with search and highlighted lines.

Only the lines on screen are coloured and rendered (Textual's line API), so a
module of 100k lines opens as fast as one of ten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from tpu_debug.core.hlo_text import instruction_name
from tpu_debug.tui.widgets.hlo_highlight import highlight_line

__all__ = ["HloView"]


class HloView(ScrollView, can_focus=True):
    """HLO or StableHLO text: coloured, with a cursor line, search matches and a set of
    highlighted instructions (one FX node's, say)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "hlo-view--gutter",
        "hlo-view--cursor",
        "hlo-view--marked",
        "hlo-view--match",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "to_line(0)", "First line", show=False),
        Binding("end", "to_line(-1)", "Last line", show=False),
    ]

    cursor_line: reactive[int] = reactive(0, always_update=True)

    def __init__(self, text: str = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: list[str] = []
        self._cache: dict[int, Text] = {}
        self._marked: set[int] = set()
        self._matches: list[int] = []
        self._match_set: set[int] = set()
        self._term: re.Pattern[str] | None = None
        self._gutter = 2
        self.set_text(text)

    # -- content ----------------------------------------------------------------------

    @property
    def lines(self) -> list[str]:
        return self._lines

    @property
    def marked_lines(self) -> list[int]:
        return sorted(self._marked)

    @property
    def matches(self) -> list[int]:
        return list(self._matches)

    def set_text(self, text: str, *, mark: Iterable[str] = ()) -> None:
        """Show ``text``; lines defining an instruction named in ``mark`` are highlighted
        and the cursor goes to the first of them."""
        self._lines = text.splitlines() or [""]
        self._cache.clear()
        self._gutter = len(str(len(self._lines))) + 2
        width = max((len(line) for line in self._lines), default=0) + self._gutter + 1
        self.virtual_size = Size(width, len(self._lines))
        self._matches = []
        self._match_set = set()
        self._term = None
        self.mark_instructions(mark)
        # start at the first highlighted instruction, else at the entry computation (XLA puts
        # its stack-frame tables and helper computations first)
        entry = next((i for i, line in enumerate(self._lines) if line.startswith("ENTRY ")), 0)
        self.cursor_line = self.marked_lines[0] if self._marked else entry
        # after the next layout: before it the new virtual size would clamp the scroll
        self.call_after_refresh(self._show_cursor, 2)
        self.refresh()

    def _show_cursor(self, context: int = 0) -> None:
        """Scroll so the cursor line is ``context`` lines below the top."""
        self.scroll_to(y=max(0, self.cursor_line - context), animate=False)

    def mark_instructions(self, names: Iterable[str]) -> int:
        """Highlight the lines that define the named instructions; returns how many."""
        wanted = set(names)
        self._marked = set()
        if wanted:
            for i, line in enumerate(self._lines):
                if instruction_name(line) in wanted:
                    self._marked.add(i)
        self.refresh()
        return len(self._marked)

    def search(self, term: str) -> int:
        """Find ``term`` (case-insensitive, plain text); the cursor goes to the first match
        at or after it. Returns the number of matching lines."""
        self._term = re.compile(re.escape(term), re.IGNORECASE) if term else None
        self._matches = (
            [i for i, line in enumerate(self._lines) if self._term.search(line)] if self._term else []
        )
        self._match_set = set(self._matches)
        if self._matches:
            after = [i for i in self._matches if i >= self.cursor_line]
            self.cursor_line = after[0] if after else self._matches[0]
        self.refresh()
        return len(self._matches)

    def next_match(self, forward: bool = True) -> bool:
        """Move the cursor to the next (or previous) match, wrapping around."""
        if not self._matches:
            return False
        if forward:
            after = [i for i in self._matches if i > self.cursor_line]
            self.cursor_line = after[0] if after else self._matches[0]
        else:
            before = [i for i in self._matches if i < self.cursor_line]
            self.cursor_line = before[-1] if before else self._matches[-1]
        return True

    def next_marked(self, forward: bool = True) -> bool:
        marked = self.marked_lines
        if not marked:
            return False
        if forward:
            after = [i for i in marked if i > self.cursor_line]
            self.cursor_line = after[0] if after else marked[0]
        else:
            before = [i for i in marked if i < self.cursor_line]
            self.cursor_line = before[-1] if before else marked[-1]
        return True

    # -- cursor -----------------------------------------------------------------------

    def validate_cursor_line(self, line: int) -> int:
        return max(0, min(line, len(self._lines) - 1))

    def watch_cursor_line(self, old: int, new: int) -> None:
        height = self.scrollable_content_region.height or 1
        top = self.scroll_offset.y
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + height:
            self.scroll_to(y=new - height + 1, animate=False)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        self.cursor_line += delta

    def action_page(self, direction: int) -> None:
        self.cursor_line += direction * max(1, self.scrollable_content_region.height - 1)

    def action_to_line(self, line: int) -> None:
        self.cursor_line = line if line >= 0 else len(self._lines) - 1

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None:
            self.cursor_line = self.scroll_offset.y + offset.y

    # -- rendering --------------------------------------------------------------------

    def _text(self, index: int) -> Text:
        text = self._cache.get(index)
        if text is None:
            if len(self._cache) > 2000:
                self._cache.clear()
            text = self._cache[index] = highlight_line(self._lines[index])
        return text

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        base = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, base)
        text = self._text(index).copy()
        if self._term is not None and index in self._match_set:
            match_style = self.get_component_rich_style("hlo-view--match")
            for m in self._term.finditer(self._lines[index]):
                text.stylize(match_style, m.start(), m.end())
        gutter_style = self.get_component_rich_style("hlo-view--gutter")
        marker = "▌" if index in self._marked else " "
        number = f"{index + 1:>{self._gutter - 2}}"
        segments = [Segment(number, gutter_style), Segment(marker + " ", gutter_style)]
        line_style = base
        if index in self._marked:
            line_style = base + self.get_component_rich_style("hlo-view--marked")
        if index == self.cursor_line and self.has_focus:
            line_style = line_style + self.get_component_rich_style("hlo-view--cursor")
        elif index == self.cursor_line:
            line_style = line_style + Style(underline=True)
        segments.extend(text.render(self.app.console))
        strip = Strip(segments).apply_style(line_style)
        return strip.crop_extend(scroll_x, scroll_x + width, line_style)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
