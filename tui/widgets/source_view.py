"""``SourceView``: the user's source line with a few lines around it (read, never run)."""

from __future__ import annotations

import dataclasses
import os

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tui.format import location_text

__all__ = ["SourceExcerpt", "SourceView", "read_excerpt"]

_MAX_FILE_BYTES = 20 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SourceExcerpt:
    """Lines ``first`` .. of a file around ``location.line``, or why they could not be read."""

    location: SourceLocation
    first: int
    lines: tuple[str, ...]
    problem: str | None = None


def read_excerpt(location: SourceLocation, cwd: str | None, context: int = 3) -> SourceExcerpt:
    """Read the lines around ``location`` from disk (the file is only read, as text).

    A relative path is taken relative to the run's working directory ``cwd``.
    """
    path = location.file
    if not os.path.isabs(path) and cwd:
        path = os.path.join(cwd, path)
    first = max(1, location.line - context)
    last = location.line + context
    if location.file.startswith("<"):
        return SourceExcerpt(location, first, (), f"no source file ({location.file})")
    try:
        if os.path.getsize(path) > _MAX_FILE_BYTES:
            return SourceExcerpt(location, first, (), "source file too large to show")
        lines = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if number > last:
                    break
                if number >= first:
                    lines.append(line.rstrip("\r\n"))
    except OSError as exc:
        return SourceExcerpt(location, first, (), f"source not readable: {exc.strerror or exc}")
    if location.line > first + len(lines) - 1:
        return SourceExcerpt(
            location, first, tuple(lines), "the file is shorter now than when the run was recorded"
        )
    return SourceExcerpt(location, first, tuple(lines))


class SourceView(Static):
    """Shows a :class:`SourceExcerpt`: path and line, then the code with the line marked."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(Text("no source line", style="dim"), id=id, classes=classes, markup=False)
        self.excerpt: SourceExcerpt | None = None

    def show(self, excerpt: SourceExcerpt | None, cwd: str | None) -> None:
        self.excerpt = excerpt
        self.update(self.render_excerpt(excerpt, cwd))

    @staticmethod
    def render_excerpt(excerpt: SourceExcerpt | None, cwd: str | None) -> RenderableType:
        if excerpt is None:
            return Text("no source line recorded", style="dim")
        head = location_text(excerpt.location, cwd)
        head.stylize("bold")
        parts: list[RenderableType] = [head]
        if excerpt.lines:
            parts.append(
                Syntax(
                    "\n".join(excerpt.lines),
                    "python",
                    theme="ansi_dark",
                    line_numbers=True,
                    start_line=excerpt.first,
                    highlight_lines={excerpt.location.line},
                    word_wrap=True,  # a narrow pane wraps a long line rather than cut it
                    background_color="default",
                )
            )
        if excerpt.problem:
            parts.append(Text(excerpt.problem, style="dim italic"))
        return Group(*parts)
