"""The report's core: the section registry, the helpers sections render with, and the render driver.

A section is declared once, with ``@section(title, order=..., key=..., render=...)`` on
its data function (one module per section or small family of sections in this package):
``data(session)`` gives the section as plain JSON values (dicts, lists, strings, numbers,
None), and ``render(data, terminal)`` turns that data, and nothing else, into a rich
renderable (``None``: the section is left out of the text). :func:`report_data`
(``tpu-debug report --json``, under the versioned schema :data:`REPORT_SCHEMA`,
docs/report_schema.md) and :func:`print_report` read the same data, so the JSON holds
every section.

Text that comes from the run (op names, paths, HLO) is always wrapped in
``rich.text.Text``, so it is never read as markup. Plain text (a file, a pipe) never cuts
a cell: cells wrap, and the width is ``width``, else ``$COLUMNS``, else :data:`PLAIN_WIDTH`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Column, Table
from rich.text import Text

from tpu_debug.core.errors import ReportSectionError
from tpu_debug.core.format import format_location
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "EVENT_HEADER",
    "NOT_MEASURED",
    "PLAIN_WIDTH",
    "RANKS_SCHEMA",
    "REPORT_SCHEMA",
    "SECTIONS",
    "Section",
    "assemble",
    "dim_note",
    "full_where",
    "is_imported",
    "json_safe",
    "kv_text",
    "location_data",
    "make_console",
    "plain_record",
    "plain_width",
    "print_heading",
    "print_report",
    "print_title",
    "report_data",
    "report_table",
    "section",
    "section_data",
    "site_text",
    "where_text",
]

# the version of report_data's layout: a reader checks it (docs/report_schema.md)
REPORT_SCHEMA = "tpu_debug.report/1"
# the version of rank_data's layout (a multi-process run: one report per rank inside)
RANKS_SCHEMA = "tpu_debug.ranks/1"
# the line width of plain text when neither the caller nor $COLUMNS gives one: wide, since
# a file or a pipe has no edge, and the cells wrap beyond it rather than lose text
PLAIN_WIDTH = 160


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    title: str
    order: int
    key: str | None
    data: Callable[[RunView], Any]
    render: Callable[[Any, bool], RenderableType | None]
    heading: Callable[[RunView], str] | None = None
    into: str | None = None


SECTIONS: list[Section] = []


def section(
    title: str,
    *,
    order: int,
    key: str | None,
    render: Callable[[Any, bool], RenderableType | None],
    heading: Callable[[RunView], str] | None = None,
    into: str | None = None,
) -> Callable:
    """Register a report section on its data function ``fn(session) -> JSON value``.

    Args:
        title: the section's name (unique), and its heading unless ``heading`` is given.
        order: where it goes, lowest first.
        key: the field of :func:`report_data` that holds the section's data; ``None``:
            the data is a dict whose fields are top-level fields of the report.
        render: ``render(data, terminal)`` gives the text from the data (``None``: left out).
        heading: ``heading(data)`` gives the printed heading (``"TPU target (v5e)"``).
        into: with ``key=None``, the key of another section whose data (a dict) this one's
            fields join in the JSON (``"compiles"``: ``compiles.phases``), where a subject's
            data is read in one place though its text is a section of its own.

    Raises:
        ReportSectionError: a section with this title or key is already registered.
    """

    def register(fn: Callable[[RunView], Any]) -> Callable:
        if any(s.title == title or (key is not None and s.key == key) for s in SECTIONS):
            raise ReportSectionError(
                f"report section {title!r} (key {key!r}) is registered twice; give the new section "
                "another title and key"
            )
        SECTIONS.append(Section(title, order, key, fn, render, heading, into))
        SECTIONS.sort(key=lambda s: s.order)
        return fn

    return register


class _PlainTable(Table):
    """A plain-text table that fits its width without cutting a cell or splitting a word.

    rich narrows columns that do not fit by cutting into them evenly, below their longest
    word, and crops what still does not fit (a table's last columns and border). Here each
    column keeps at least its longest word (a left cell: ``train.py:48`` stays whole) or its
    longest cell (a right cell: ``328.00 ms``); when even that is too wide, the columns go
    into several tables, each repeating the first column so that its rows read alone.
    """

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns = list(range(len(self.columns)))
        yield from self._fitted(columns, options.max_width)

    def _fitted(self, indexes: list[int], width: int) -> RenderResult:
        low = [_least_width(self.columns[i]) for i in indexes]
        if sum(low) + _chrome(len(indexes)) <= width or len(indexes) <= 2:
            yield _part(self, indexes, width)
            return
        groups: list[list[int]] = [[indexes[0]]]
        for i, least in zip(indexes[1:], low[1:]):
            wanted = sum(_least_width(self.columns[j]) for j in groups[-1]) + least
            if len(groups[-1]) > 1 and wanted + _chrome(len(groups[-1]) + 1) > width:
                groups.append([indexes[0]])
            groups[-1].append(i)
        for n, group in enumerate(groups):
            if n:
                yield Text("")
            yield _part(self, group, width)


def _chrome(columns: int) -> int:
    # ASCII2 with its edge: a border before each column and after the last, one space each side
    return columns + 1 + 2 * columns


def _cell_text(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _least_width(column: Column) -> int:
    words = _cell_text(column.header).split() or [""]
    cells = [_cell_text(c) for c in column.cells]
    if column.justify == "left":
        words += [w for c in cells for w in c.split()]
    else:
        words += [line for c in cells for line in c.splitlines()]
    return max(len(w) for w in words)


def _most_width(column: Column) -> int:
    lines = [line for c in [column.header, *column.cells] for line in _cell_text(c).splitlines()]
    return max((len(line) for line in lines), default=0)


def _part(table: Table, indexes: list[int], width: int) -> Table:
    """The columns ``indexes`` of ``table`` as a table whose column widths fit ``width``."""
    room = width - _chrome(len(indexes))
    low = [_least_width(table.columns[i]) for i in indexes]
    high = [max(lo, _most_width(table.columns[i])) for lo, i in zip(low, indexes)]
    widths = list(low)
    spare = room - sum(low)
    # the spare room goes to the columns that wrap, in proportion to what wrapping costs them
    wanting = sum(hi - lo for lo, hi in zip(low, high))
    if spare > 0 and wanting:
        for k, (lo, hi) in enumerate(zip(low, high)):
            widths[k] = min(hi, lo + spare * (hi - lo) // wanting)
    part = Table(box=table.box, show_edge=table.show_edge, header_style=table.header_style)
    for i, w in zip(indexes, widths):
        column = table.columns[i]
        part.add_column(column.header, justify=column.justify, overflow="fold", width=max(w, 1))
    for row in zip(*(list(table.columns[i].cells) for i in indexes)):
        part.add_row(*row)
    return part


def report_table(terminal: bool, *columns: tuple[str, str], left_width: int = 40) -> Table:
    table = (Table if terminal else _PlainTable)(
        box=box.SIMPLE_HEAD if terminal else box.ASCII2,
        show_edge=not terminal,
        header_style="bold" if terminal else "",
    )
    for title, justify in columns:
        left = justify == "left"
        # a terminal gets one line per row (a long signature ends in "…"); plain text, read
        # later in a file or a log, keeps every cell whole and wraps it instead
        table.add_column(
            title,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=terminal,
            overflow="ellipsis" if terminal else "fold",
            max_width=left_width if left and terminal else None,
            min_width=None if left else len(title),
        )
    return table


def dim_note(text: str) -> Text:
    return Text(text, style="dim")


def kv_text(rows: list[tuple[str, str]]) -> Text:
    width = max(len(k) for k, _ in rows) + 2
    text = Text()
    for i, (k, v) in enumerate(rows):
        if i:
            text.append("\n")
        text.append(k.ljust(width), style="bold")
        text.append(v)
    return text


def plain_record(value: Any, skip: tuple[str, ...] = ("thread",)) -> Any:
    """A record as JSON values: a dataclass as a dict of its fields (but ``skip``), tuples
    as lists, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_record(getattr(value, f.name), skip) for f in dataclasses.fields(value) if f.name not in skip}
    if isinstance(value, (list, tuple)):
        return [plain_record(v, skip) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_record(v, skip) for k, v in value.items()}
    return value


def location_data(loc: Any) -> dict[str, Any] | None:
    return {"file": loc.file, "line": loc.line, "function": loc.function} if loc is not None else None


def where_text(loc: dict | None) -> str:
    """``train.py:12`` of a location's data."""
    return "-" if loc is None else format_location(loc["file"], loc["line"])


def site_text(loc: dict | None) -> str:
    """``train.py:12 in step`` of a location's data."""
    return "-" if loc is None else format_location(loc["file"], loc["line"], loc["function"])


def full_where(loc: dict | None) -> str:
    """The whole path, line and function of a location's data."""
    return "-" if loc is None else format_location(loc["file"], loc["line"], loc["function"], full=True)


# the fields every event has that a section's data leaves out
EVENT_HEADER = ("id", "ts", "mode", "thread")

# what an imported TORCH_TRACE log cannot say (it records compiles, guards and graph breaks)
NOT_MEASURED = "not in an imported TORCH_TRACE log"


def is_imported(session: RunView) -> bool:
    return bool(getattr(session.metadata(), "imported_from", None))


def json_safe(value: Any) -> Any:
    # JSON has no NaN or Infinity: they are written as null
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def section_data(session: RunView) -> list[tuple[Section, Any]]:
    return [(sec, sec.data(session)) for sec in SECTIONS]


def assemble(parts: list[tuple[Section, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {"schema": REPORT_SCHEMA}
    for sec, part in parts:
        if sec.key is not None:
            data[sec.key] = part
        elif sec.into is None:
            data.update(part)
    for sec, part in parts:  # after every section's own data, whatever their order
        if sec.key is None and sec.into is not None and isinstance(data.get(sec.into), dict):
            data[sec.into].update(part)
    return json_safe(data)


def report_data(session: RunView) -> dict[str, Any]:
    """The report of ``session``'s run as data, every section of it, under :data:`REPORT_SCHEMA`
    (docs/report_schema.md describes every field): the data the text report is printed from.

    Returns:
        A dict of JSON values (``json.dumps`` takes it as it is).

    Example::

        data = report_data(tpu_debug.open_run())
        data["schema"], [f["kind"] for f in data["findings"]]
        # ('tpu_debug.report/1', ['implicit_sync'])
    """
    return assemble(section_data(session))


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit with status 1; the command line ends quietly with 0 instead
        self.quiet = True
        raise BrokenPipeError


def make_console(file: Any, terminal: bool | None, width: int | None) -> Console:
    file = file if file is not None else sys.stdout
    if terminal is None:
        terminal = bool(getattr(file, "isatty", lambda: False)())
    if terminal:
        return _Console(file=file, width=width, force_terminal=True, highlight=False, emoji=False)
    return _Console(
        file=file,
        width=width or plain_width(),
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
        soft_wrap=False,
    )


def plain_width() -> int:
    """The line width of plain text (a file, a pipe): ``$COLUMNS``, else :data:`PLAIN_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PLAIN_WIDTH


def print_title(console: Console, title: str) -> None:
    if console.is_terminal:
        console.rule(Text(title, style="bold"))
    else:
        console.print(Text(title))
        console.print(Text("=" * min(console.width, len(title))))


def print_heading(console: Console, text: str) -> None:
    console.print()
    console.print(Text(text, style="bold underline" if console.is_terminal else ""))


def print_report(
    session: RunView, *, file: Any = None, terminal: bool | None = None, width: int | None = None
) -> None:
    """Print the report of ``session``'s run to ``file`` (default stdout).

    Args:
        session: a :class:`~tpu_debug.session.Session`.
        file: where to print.
        terminal: force rich terminal output (True) or plain text (False);
            default: rich when ``file`` is a terminal.
        width: line width (plain text: default ``$COLUMNS``, else :data:`PLAIN_WIDTH`;
            cells wrap, never cut).
    """
    console = make_console(file, terminal, width)
    print_title(console, f"tpu_debug report: {session.metadata().name}")
    for sec, data in section_data(session):
        body = sec.render(data, console.is_terminal)
        if body is None:
            continue
        print_heading(console, sec.heading(data) if sec.heading is not None else sec.title)
        console.print(body)


# -- multi-process runs ----------------------------------------------------------------------


