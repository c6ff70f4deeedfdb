"""``HloDiffView``: two versions of a program side by side, changed lines aligned and coloured."""

from __future__ import annotations

import dataclasses
import difflib
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from tpu_debug.tui.widgets.hlo_highlight import highlight_line

__all__ = ["DiffRow", "HloDiffView", "diff_rows"]


@dataclasses.dataclass(frozen=True, slots=True)
class DiffRow:
    """One aligned row: a line index on each side (None for a gap) and how they relate."""

    left: int | None
    right: int | None
    tag: str  # "equal" | "replace" | "delete" | "insert"


def diff_rows(left: list[str], right: list[str]) -> list[DiffRow]:
    """Align two texts line by line (difflib's matching blocks, no junk heuristic)."""
    rows: list[DiffRow] = []
    matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows.extend(DiffRow(i1 + k, j1 + k, tag) for k in range(i2 - i1))
        else:
            for k in range(max(i2 - i1, j2 - j1)):
                li = i1 + k if i1 + k < i2 else None
                rj = j1 + k if j1 + k < j2 else None
                rows.append(
                    DiffRow(li, rj, "delete" if rj is None else "insert" if li is None else "replace")
                )
    return rows


class HloDiffView(ScrollView, can_focus=True):
    """Side-by-side diff of two HLO texts; ``n``/``N`` jump between changes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "hlo-diff--gutter",
        "hlo-diff--removed",
        "hlo-diff--added",
        "hlo-diff--changed",
        "hlo-diff--cursor",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "to_row(0)", "First line", show=False),
        Binding("end", "to_row(-1)", "Last line", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, always_update=True)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._left: list[str] = []
        self._right: list[str] = []
        self._rows: list[DiffRow] = []
        self._hunks: list[int] = []
        self._gutter = 3
        self._max_len = 0

    @property
    def hunks(self) -> list[int]:
        """Row indices where a run of changed lines starts."""
        return self._hunks

    def set_diff(self, left: list[str], right: list[str], rows: list[DiffRow]) -> None:
        self._left, self._right, self._rows = left, right, rows
        self._hunks = [
            i for i, r in enumerate(rows) if r.tag != "equal" and (i == 0 or rows[i - 1].tag == "equal")
        ]
        self._gutter = len(str(max(len(left), len(right), 1))) + 1
        self._max_len = max((len(x) for x in (*left, *right)), default=0)
        self._update_virtual_size()
        self.cursor_row = self._hunks[0] if self._hunks else 0

    def _half(self) -> int:
        return max(1, (self.scrollable_content_region.width - 1) // 2)

    def _update_virtual_size(self) -> None:
        half = self._half()
        extra = max(0, self._max_len + self._gutter + 1 - half)
        self.virtual_size = Size(self.scrollable_content_region.width + extra, len(self._rows))
        self.refresh()

    def on_resize(self) -> None:
        self._update_virtual_size()

    def next_hunk(self, forward: bool = True) -> bool:
        if not self._hunks:
            return False
        if forward:
            after = [i for i in self._hunks if i > self.cursor_row]
            self.cursor_row = after[0] if after else self._hunks[0]
        else:
            before = [i for i in self._hunks if i < self.cursor_row]
            self.cursor_row = before[-1] if before else self._hunks[-1]
        return True

    def validate_cursor_row(self, row: int) -> int:
        return max(0, min(row, len(self._rows) - 1))

    def watch_cursor_row(self, old: int, new: int) -> None:
        height = self.scrollable_content_region.height or 1
        top = self.scroll_offset.y
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + height:
            self.scroll_to(y=new - height + 1, animate=False)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        self.cursor_row += delta

    def action_page(self, direction: int) -> None:
        self.cursor_row += direction * max(1, self.scrollable_content_region.height - 1)

    def action_to_row(self, row: int) -> None:
        self.cursor_row = row if row >= 0 else len(self._rows) - 1

    def _side(self, lines: list[str], index: int | None, tag: str, half: int, scroll_x: int) -> list[Segment]:
        gutter_style = self.get_component_rich_style("hlo-diff--gutter")
        base = self.rich_style
        if tag == "equal":
            style = base
        elif tag == "replace":
            style = base + self.get_component_rich_style("hlo-diff--changed")
        elif (tag == "delete") == (lines is self._left):
            style = base + self.get_component_rich_style(
                "hlo-diff--removed" if tag == "delete" else "hlo-diff--added"
            )
        else:
            style = base
        if index is None:
            return [Segment(" " * half, style)]
        number = Segment(f"{index + 1:>{self._gutter - 1}} ", gutter_style)
        body = Strip(highlight_line(lines[index]).render(self.app.console)).apply_style(style)
        body = body.crop_extend(scroll_x, scroll_x + half - self._gutter, style)
        return [number, *body]

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self._rows):
            return Strip.blank(width, self.rich_style)
        row = self._rows[index]
        half = self._half()
        sep_style = self.get_component_rich_style("hlo-diff--gutter")
        segments = self._side(self._left, row.left, row.tag, half, scroll_x)
        segments.append(Segment("│", sep_style))
        segments.extend(self._side(self._right, row.right, row.tag, width - half - 1, scroll_x))
        if index == self.cursor_row:
            cursor = (
                self.get_component_rich_style("hlo-diff--cursor") if self.has_focus else Style(underline=True)
            )
            segments = list(Segment.apply_style(segments, post_style=cursor))
        return Strip(segments).crop_extend(0, width, self.rich_style)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
