"""The run report: what ran where, the heaviest ops and programs, and one section per tracer.

Sections are registered with ``@section(title, order=...)``; each takes a
:class:`~tpu_debug.session.Session` and returns a rich renderable, or ``None``
to be left out. Text that comes from the run (op names, paths, HLO) is always
wrapped in ``rich.text.Text``, so it is never read as markup.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["section", "print_report", "SECTIONS", "format_seconds", "format_bytes"]


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    title: str
    order: int
    render: Callable[[Any, bool], RenderableType | None]


SECTIONS: list[Section] = []


def section(title: str, *, order: int) -> Callable:
    """Register a report section (``fn(session, terminal) -> renderable | None``).

    Raises:
        ValueError: a section with this title is already registered.
    """

    def register(fn: Callable[[Any, bool], RenderableType | None]) -> Callable:
        if any(s.title == title for s in SECTIONS):
            raise ValueError(f"report section {title!r} is registered twice")
        SECTIONS.append(Section(title, order, fn))
        SECTIONS.sort(key=lambda s: s.order)
        return fn

    return register


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _table(terminal: bool, *columns: tuple[str, str]) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD if terminal else box.ASCII2,
        show_edge=not terminal,
        header_style="bold" if terminal else "",
    )
    for title, justify in columns:
        # one line per row: long signatures (a list of baked-in scalars, say) end in "…"
        table.add_column(
            title,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            max_width=40 if justify == "left" else None,
            min_width=None if justify == "left" else len(title),
        )
    return table


def _note(text: str) -> Text:
    return Text(text, style="dim")


def _kv(rows: list[tuple[str, str]]) -> Text:
    width = max(len(k) for k, _ in rows) + 2
    text = Text()
    for i, (k, v) in enumerate(rows):
        if i:
            text.append("\n")
        text.append(k.ljust(width), style="bold")
        text.append(v)
    return text


@section("Run", order=0)
def _run(session: Any, terminal: bool) -> RenderableType:
    m = session.metadata()
    status = m.status
    if m.exit_status is not None:
        status += f" (exit status {m.exit_status})"
    if m.error:
        status += f": {m.error}"
    if m.status == "incomplete":
        status += " - the process ended without closing the run (killed?); events up to its end are kept"
    modes = session.modes()
    rows = [
        ("run", str(session.run_dir)),
        ("command", " ".join(m.argv) if m.argv else "-"),
        ("started", m.start_time),
        ("duration", format_seconds(m.duration) if m.duration is not None else "-"),
        ("status", status),
        ("platform", f"XLA {m.platform.upper()} ({m.device_kind}), {m.device_count} device(s)"),
        ("mode", ", ".join(modes) if modes else "no device ops ran"),
        (
            "versions",
            f"tpu_debug {m.tpu_debug_version}, torch {m.torch_version}, "
            f"jax {m.jax_version}, jaxlib {m.jaxlib_version}",
        ),
    ]
    return _kv(rows)


@section("Top ops by time", order=10)
def _ops(session: Any, terminal: bool) -> RenderableType:
    ops = session.ops()
    if not ops:
        return _note("no ops recorded")
    total = sum(o.seconds for o in ops) or 1.0
    table = _table(
        terminal,
        ("op", "left"),
        ("mode", "left"),
        ("calls", "right"),
        ("total", "right"),
        ("mean", "right"),
        ("% time", "right"),
        ("compiles", "right"),
    )
    for o in ops[:15]:
        table.add_row(
            Text(o.name),
            Text(o.mode),
            str(o.count),
            format_seconds(o.seconds),
            format_seconds(o.mean_seconds),
            f"{100 * o.seconds / total:.1f}",
            str(o.compiles),
        )
    parts: list[RenderableType] = [table]
    if len(ops) > 15:
        parts.append(_note(f"... and {len(ops) - 15} more ops"))
    parts.append(_note("time is host time to dispatch each executable (device work runs asynchronously)"))
    return Group(*parts)


@section("Programs compiled", order=20)
def _compiles(session: Any, terminal: bool) -> RenderableType:
    ops = session.ops()
    n = sum(o.compiles for o in ops)
    if not n:
        return _note("nothing was compiled while tracing")
    seconds = sum(o.compile_seconds for o in ops)
    by_mode: dict[str, tuple[int, float]] = {}
    for o in ops:
        c, s = by_mode.get(o.mode, (0, 0.0))
        by_mode[o.mode] = (c + o.compiles, s + o.compile_seconds)
    programs = len(session.programs())
    rows = [
        ("compiles", f"{n} ({', '.join(f'{c} {m}' for m, (c, _) in sorted(by_mode.items()))})"),
        ("compile time", format_seconds(seconds)),
        ("distinct programs", str(programs) if programs else "HLO not recorded"),
    ]
    return _kv(rows)


@section("Heaviest programs", order=30)
def _programs(session: Any, terminal: bool) -> RenderableType | None:
    programs = session.programs(limit=10)
    if not programs:
        return None
    table = _table(
        terminal,
        ("program", "right"),
        ("signature", "left"),
        ("calls", "right"),
        ("total", "right"),
        ("compile", "right"),
        ("instrs", "right"),
    )
    for p in programs:
        table.add_row(
            str(p.id),
            Text(p.signature),
            str(p.count),
            format_seconds(p.seconds),
            format_seconds(p.compile_seconds),
            str(p.instructions),
        )
    return Group(table, _note("see a program's HLO with session.hlo(<op or program id>)"))


@section("Recompiles", order=40)
def _recompiles(session: Any, terminal: bool) -> RenderableType:
    return _note("recompile analysis is not available in this version")


@section("Transfers", order=50)
def _transfers(session: Any, terminal: bool) -> RenderableType:
    transfers = session.transfers()
    if not transfers:
        return _note("no host <-> device transfers recorded")
    groups: dict[tuple[str, str, bool], list] = {}
    for t in transfers:
        groups.setdefault((t.direction, t.op, t.implicit), []).append(t)
    table = _table(
        terminal,
        ("direction", "left"),
        ("by", "left"),
        ("kind", "left"),
        ("count", "right"),
        ("bytes", "right"),
        ("time", "right"),
    )
    for (direction, op, implicit), items in sorted(
        groups.items(), key=lambda kv: (not kv[0][2], -len(kv[1]))
    ):
        table.add_row(
            direction,
            Text(op),
            "implicit" if implicit else "explicit",
            str(len(items)),
            format_bytes(sum(t.nbytes for t in items)),
            format_seconds(sum(t.seconds for t in items)),
        )
    return table


@section("Divergence", order=60)
def _divergence(session: Any, terminal: bool) -> RenderableType:
    return _note("numerical divergence against CPU was not checked in this run")


@section("CPU fallbacks", order=70)
def _fallbacks(session: Any, terminal: bool) -> RenderableType | None:
    fallbacks = session.fallbacks()
    if not fallbacks:
        return None
    counts: dict[str, list] = {}
    for f in fallbacks:
        counts.setdefault(f.name, []).append(f)
    table = _table(terminal, ("op", "left"), ("count", "right"), ("time", "right"), ("first at", "left"))
    for name, items in sorted(counts.items(), key=lambda kv: -len(kv[1])):
        loc = items[0].location
        table.add_row(
            Text(name),
            str(len(items)),
            format_seconds(sum(f.seconds for f in items)),
            Text(str(loc) if loc else "-"),
        )
    return table


@section("Tracer errors", order=90)
def _errors(session: Any, terminal: bool) -> RenderableType | None:
    errors = session.internal_errors()
    if not errors:
        return None
    table = _table(terminal, ("where", "left"), ("error", "left"))
    for e in errors[:10]:
        table.add_row(Text(e.where), Text(e.message))
    return Group(_note(f"{len(errors)} tracer error(s); the program was not affected"), table)


def _console(file: Any, terminal: bool | None, width: int | None) -> Console:
    file = file if file is not None else sys.stdout
    if terminal is None:
        terminal = bool(getattr(file, "isatty", lambda: False)())
    if terminal:
        return Console(file=file, width=width, force_terminal=True, highlight=False, emoji=False)
    return Console(
        file=file,
        width=width or 100,
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
        soft_wrap=False,
    )


def print_report(
    session: Any, *, file: Any = None, terminal: bool | None = None, width: int | None = None
) -> None:
    """Print the report of ``session``'s run to ``file`` (default stdout).

    Args:
        session: a :class:`~tpu_debug.session.Session`.
        file: where to print.
        terminal: force rich terminal output (True) or plain text (False);
            default: rich when ``file`` is a terminal.
        width: line width (plain text default 100).
    """
    console = _console(file, terminal, width)
    is_terminal = console.is_terminal
    title = session.metadata().name
    if is_terminal:
        console.rule(Text(f"tpu_debug report: {title}", style="bold"))
    else:
        console.print(Text(f"tpu_debug report: {title}"))
        console.print(Text("=" * min(console.width, 20 + len(title))))
    for sec in SECTIONS:
        body = sec.render(session, is_terminal)
        if body is None:
            continue
        console.print()
        console.print(Text(sec.title, style="bold underline" if is_terminal else ""))
        console.print(body)
