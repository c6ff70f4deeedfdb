"""The run report: the advisor's findings, the steps, what ran where, and one section per tracer.

Sections are registered with ``@section(title, order=...)``; each takes a
:class:`~tpu_debug.session.Session` and returns a rich renderable, or ``None``
to be left out. Text that comes from the run (op names, paths, HLO) is always
wrapped in ``rich.text.Text``, so it is never read as markup. What the run
should change is the advisor's (:mod:`tpu_debug.tracers.advisor`): the
"Findings" section renders its records and composes no advice of its own.

:func:`report_data` is the same report as data, under the versioned schema
:data:`REPORT_SCHEMA` (``tpu-debug report --json``; docs/report_schema.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_debug.errors import ReportSectionError

__all__ = [
    "REPORT_SCHEMA",
    "SECTIONS",
    "advice_of",
    "format_bytes",
    "format_seconds",
    "print_rank_report",
    "print_report",
    "rank_figures",
    "report_data",
    "section",
    "short_path",
]

# the version of report_data's layout: a reader checks it (docs/report_schema.md)
REPORT_SCHEMA = "tpu_debug.report/1"


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    title: str
    order: int
    render: Callable[[Any, bool], RenderableType | None]
    heading: Callable[[Any], str] | None = None


SECTIONS: list[Section] = []


def section(title: str, *, order: int, heading: Callable[[Any], str] | None = None) -> Callable:
    """Register a report section (``fn(session, terminal) -> renderable | None``).

    Args:
        title: the section's name (unique), and its heading unless ``heading`` is given.
        order: where it goes, lowest first.
        heading: ``heading(session)`` gives the printed heading from the run
            (``"TPU target (v5e)"``).

    Raises:
        ReportSectionError: a section with this title is already registered.
    """

    def register(fn: Callable[[Any, bool], RenderableType | None]) -> Callable:
        if any(s.title == title for s in SECTIONS):
            raise ReportSectionError(
                f"report section {title!r} is registered twice; give the new section another title"
            )
        SECTIONS.append(Section(title, order, fn, heading))
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


def _table(terminal: bool, *columns: tuple[str, str], left_width: int = 40) -> Table:
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
            max_width=left_width if justify == "left" else None,
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
    if m.status == "killed":
        status += " - the process ended without closing the run; what it recorded until then is kept"
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


_ADVICE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def advice_of(session: Any) -> Any:
    """The advisor's :class:`~tpu_debug.tracers.advisor.Advice` for ``session``'s run, worked
    out once per state of the run (a live run that grew is advised again)."""
    from tpu_debug.tracers.advisor import advise

    mark = session.watermark()
    known = _ADVICE.get(session)
    if known is not None and known[0] == mark:
        return known[1]
    advice = advise(session)
    _ADVICE[session] = (mark, advice)
    return advice


_SEVERITY_MARK = {"error": "ERROR", "warning": "WARN", "info": "INFO"}
_SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}


def _count_text(c: Any) -> str:
    if c.unit == "s":
        return f"{c.name} {format_seconds(c.value)}"
    if c.unit == "B":
        return f"{c.name} {format_bytes(int(c.value))}"
    value = f"{c.value:,.0f}" if float(c.value).is_integer() else f"{c.value:,.3g}"
    return f"{c.name} {value}"


def short_path(file: str, cwd: str | None) -> str:
    """``file`` relative to ``cwd`` (the run's working directory) when it lies under it."""
    if cwd and os.path.isabs(file):
        try:
            rel = os.path.relpath(file, cwd)
        except ValueError:  # another drive
            return file
        if not rel.startswith(".."):
            return rel
    return file


def finding_text(f: Any, *, terminal: bool = False, cwd: str | None = None) -> Text:
    """One finding as the report shows it: severity and title, then where, what it cost,
    the evidence and the fix (every word of it from the finding)."""
    text = Text()
    text.append(f"{_SEVERITY_MARK[f.severity]} ", style=_SEVERITY_STYLE[f.severity] if terminal else "")
    text.append(f.title, style="bold" if terminal else "")
    loc = f.evidence.location
    details = []
    if loc is not None:
        details.append(("at", f"{short_path(loc.file, cwd)}:{loc.line} in {loc.function}"))
    if f.steps is not None:
        first, last = f.steps
        details.append(("steps", f"{first}" if first == last else f"{first}-{last}"))
    if f.cost_seconds:
        details.append(("cost", format_seconds(f.cost_seconds) + (" (estimate)" if f.estimated else "")))
    if f.evidence.counts:
        details.append(("evidence", ", ".join(_count_text(c) for c in f.evidence.counts)))
    details += [("", fact) for fact in f.evidence.facts]
    details.append(("fix", f.fix))
    for key, value in details:
        text.append("\n  ")
        if key:
            text.append(f"{key}: ", style="dim" if terminal else "")
        text.append(value)
    return text


@section("Findings", order=1)
def _findings(session: Any, terminal: bool) -> RenderableType:
    # the advisor's records, most serious and most costly first; no prose is made here
    advice = advice_of(session)
    parts: list[RenderableType] = []
    if not advice.findings:
        parts.append(_note(
            "nothing to fix: no recompiles, syncs, fallbacks or uploads that repeat in steady state, "
            "no graph breaks inside the step, no float64, no divergence found"
        ))
    for f in advice.findings:
        parts.append(finding_text(f, terminal=terminal))
    parts += [_note(e) for e in advice.errors]
    return Group(*parts)


def _steps_range_text(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


_DETECTED = {
    "optimizer": "each optimizer.step()",
    "explicit": "each tpu_debug.step()",
    "loop": "the iterations of the loop the run repeated",
}


@section("Steps", order=5)
def _steps(session: Any, terminal: bool) -> RenderableType:
    # warm-up against steady state, then the figures of a few steps
    from tpu_debug.tracers.steps import STEADY

    summary = advice_of(session).steps
    steps = session.steps()
    if not steps:
        return _note(
            "no steps: the run called neither optimizer.step() (with tpu parameters) nor tpu_debug.step(), "
            "and repeated no loop of ops; every compile counts as warm-up"
        )
    how = " and ".join(_DETECTED.get(d, d) for d in (summary.detected or "").split("+"))
    rows = [("steps", f"{summary.steps} ({how})")]
    warm = summary.warm
    if summary.warmup:
        rows.append((
            "warm-up",
            f"step {_steps_range_text(summary.warmup_ranges())}: {warm.compiles} compile(s) "
            f"({format_seconds(warm.seconds)}); first compiles, and ops compiled for several shapes "
            "at once, are expected here",
        ))
    if summary.setup.compiles:
        rows.append(("before steps", f"{summary.setup.compiles} compile(s) ({format_seconds(summary.setup.seconds)})"))
    steady = summary.steady_compiles
    if summary.steady:
        rows.append((
            "steady state",
            f"{summary.steady} step(s), {format_seconds(summary.step_seconds)} and {summary.ops_per_step:,.0f} "
            f"op(s) per step (median); {steady.compiles} compile(s) ({format_seconds(steady.seconds)})",
        ))
    if summary.tail.compiles:
        rows.append(("outside steps", f"{summary.tail.compiles} compile(s) ({format_seconds(summary.tail.seconds)})"))
    phases = dict(zip((s.index for s in steps), _phases(steps)))
    table = _table(
        terminal,
        ("step", "right"),
        ("phase", "left"),
        ("time", "right"),
        ("ops", "right"),
        ("dispatch", "right"),
        ("compiles", "right"),
        ("compile time", "right"),
        ("transfers", "right"),
        ("bytes", "right"),
    )
    shown = _steps_shown(steps, phases)
    previous = None
    for s in shown:
        if previous is not None and s.index != previous + 1:
            table.add_row("...", "", "", "", "", "", "", "", "")
        previous = s.index
        table.add_row(
            str(s.index),
            phases[s.index] if phases[s.index] != STEADY or s.compiles == 0 else "steady (compiles)",
            format_seconds(s.seconds),
            f"{s.ops:,}",
            format_seconds(s.op_seconds),
            str(s.compiles),
            format_seconds(s.compile_seconds),
            str(s.transfers),
            format_bytes(s.transfer_bytes),
        )
    note = _note("time: from one step's end to the next; dispatch: host time running its ops (session.steps() has every step)")
    return Group(_kv(rows), table, note)


def _phases(steps: list) -> list[str]:
    from tpu_debug.tracers.steps import step_phases

    return step_phases(steps)


def _steps_shown(steps: list, phases: dict[int, str], limit: int = 12) -> list:
    """The steps worth a row: warm-up ones, steady ones that compiled, the first and last
    steady ones; at most ``limit``."""
    from tpu_debug.tracers.steps import STEADY

    steady = [s for s in steps if phases[s.index] == STEADY]
    keep = {s.index for s in steps if phases[s.index] != STEADY}
    keep |= {s.index for s in steady[:2]} | {s.index for s in steady[-1:]}
    keep |= {s.index for s in steady if s.compiles}
    chosen = sorted(keep)[:limit]
    by_index = {s.index: s for s in steps}
    return [by_index[i] for i in chosen]


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
    cached = _read_back_text(ops)
    if not n:
        return _note("nothing was compiled while tracing" + (f"; {cached}" if cached else ""))
    seconds = sum(o.compile_seconds for o in ops)
    by_mode: dict[str, tuple[int, float]] = {}
    for o in ops:
        c, s = by_mode.get(o.mode, (0, 0.0))
        by_mode[o.mode] = (c + o.compiles, s + o.compile_seconds)
    programs = len(_local_programs(session.programs()))
    rows = [
        ("compiles", f"{n} ({', '.join(f'{c} {m}' for m, (c, _) in sorted(by_mode.items()))})"),
        ("compile time", format_seconds(seconds)),
        ("distinct programs", str(programs) if programs else "HLO not recorded"),
    ]
    if cached:
        rows.append(("compile cache", cached))
    return _kv(rows)


def _read_back_text(ops: list) -> str | None:
    """The programs read back from the persistent compile cache and the compile time saved."""
    n = sum(o.read_back for o in ops)
    if not n:
        return None
    saved = sum(o.saved_seconds for o in ops)
    return f"{n} program(s) read back from the compile cache, saving {format_seconds(saved)} of compiling"


def _local_programs(programs: list) -> list:
    """The programs that ran here (a run with a TPU target also stores the TPU's HLO as programs)."""
    from tpu_debug.tracers.target import TARGET_MODE

    return [p for p in programs if p.mode != TARGET_MODE]


@section("Heaviest programs", order=30)
def _programs(session: Any, terminal: bool) -> RenderableType | None:
    programs = _local_programs(session.programs())[:10]
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
    # grouped by op / graph, split into warm-up and steady state; dynamo's side as recorded
    groups = [g for g in session.recompile_groups() if g.recompiles]
    breaks, failures, limits = session.graph_breaks(), session.guard_failures(), session.recompile_limits()
    if not groups and not breaks and not failures and not limits:
        return _note("nothing was compiled twice: every op and graph kept one key")
    parts: list[RenderableType] = []
    if groups:
        parts += _recompile_table(session, groups, terminal)
    if failures:
        parts.append(_guard_failures(failures))
    if breaks:
        parts.append(_graph_breaks(breaks))
    parts += [_recompile_limit_hit(hit) for hit in limits]
    return Group(*parts)


def _steady_recompiles(session: Any) -> dict[tuple[str | None, str], int]:
    """Recompiles in steady-state steps, per (mode, identity)."""
    from tpu_debug.tracers.steps import STEADY, StepIndex, phase_of

    steps = session.steps()
    index = StepIndex(steps)
    phases = dict(zip((s.index for s in steps), _phases(steps)))
    out: dict[tuple[str | None, str], int] = {}
    for c in session.recompiles():
        if phase_of(index, phases, c.ts) == STEADY:
            key = (c.mode, c.identity or c.name)
            out[key] = out.get(key, 0) + 1
    return out


def _recompile_table(session: Any, groups: list, terminal: bool) -> list[RenderableType]:
    """The headline and one row per recompiled op or graph, with its recompiles in steady state."""
    steady = _steady_recompiles(session)
    total = sum(g.recompiles for g in groups)
    in_steady = sum(steady.values())
    head = (
        f"{total} recompile(s) of {len(groups)} op(s)/graph(s), "
        f"{format_seconds(sum(g.seconds for g in groups))} compiling them; {in_steady} in steady state"
    )
    if total > in_steady:
        head += f", {total - in_steady} while warming up (an op compiled for each shape it meets)"
    table = _table(
        terminal,
        ("op / graph", "left"),
        ("compiles", "right"),
        ("recompiles", "right"),
        ("steady", "right"),
        ("what changed: values", "left"),
        ("at", "left"),
    )
    ranked = sorted(groups, key=lambda g: (-steady.get((g.mode, g.identity), 0), -g.recompiles, g.identity))
    for g in ranked[:12]:
        ch = g.changing
        where = _change_location(g)
        values = ", ".join(ch.values[:6]) + (", ..." if len(ch.values) > 6 else "") if ch else ""
        grows = " (grows)" if ch is not None and ch.grows else ""
        table.add_row(
            Text(g.identity),
            str(g.compiles),
            str(g.recompiles),
            str(steady.get((g.mode, g.identity), 0)),
            Text(f"{ch.what}{grows}: {values}" if ch else "-"),
            Text(_where(where)),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(groups) > 12:
        parts.append(_note(f"... and {len(groups) - 12} more"))
    parts.append(_note("steady: recompiles in steady-state steps (see Steps); the Findings say which to fix and how"))
    return parts


def _change_location(g: Any) -> Any:
    """Where a group's top change happened, else where it recompiled most."""
    ch = g.changing
    if ch is not None and ch.location is not None:
        return ch.location
    return g.locations[0][0] if g.locations else None


def _guard_failures(failures: list) -> Text:
    """Dynamo's recompiles by function, most frequent first, with the latest failed guard."""
    by_fn: dict[str, list] = {}
    for f in failures:
        by_fn.setdefault(f.name, []).append(f)
    lines = ["dynamo recompiled (guard failures):"]
    for name, items in sorted(by_fn.items(), key=lambda kv: -len(kv[1])):
        latest = items[-1]
        guard = latest.guards[0].split(": ", 1)[-1] if latest.guards else "?"
        lines.append(f"  {name}: {len(items)}x, latest: {guard} (called at {_where(latest.location)})")
    return Text("\n".join(lines))


def _graph_breaks(breaks: list) -> Text:
    """Graph breaks by site (function, line, reason), most frequent first."""
    sites: dict[tuple, list] = {}
    for b in breaks:
        sites.setdefault((b.name, b.location, b.reason), []).append(b)
    lines = ["graph breaks:"]
    for (name, loc, reason), items in sorted(sites.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {name} at {_where(loc)} ({len(items)}x): {reason}")
    return Text("\n".join(lines))


def _recompile_limit_hit(hit: Any) -> Text:
    return Text(
        f"recompile limit: {hit.name} at {_where(hit.location)}, {hit.limit_type} {hit.limit}, "
        f"last failed guard: {hit.reason}"
    )


@section("Transfers", order=50)
def _transfers(session: Any, terminal: bool) -> RenderableType:
    # the ledger by call site, implicit (syncs) first; which of them to fix is the Findings'
    from tpu_debug.tracers.transfers import CAUSE_TEXT

    transfers = session.transfers()
    if not transfers:
        return _note("no host <-> device transfers recorded")
    implicit = [t for t in transfers if t.implicit]
    head = (
        f"{len(transfers)} transfer(s), {format_bytes(sum(t.nbytes for t in transfers))}, "
        f"{format_seconds(sum(t.seconds for t in transfers))}: {len(implicit)} implicit (syncs nobody asked for), "
        f"{len(transfers) - len(implicit)} explicit"
    )
    sites = session.transfer_call_sites()
    table = _table(
        terminal,
        ("where", "left"),
        ("by", "left"),
        ("dir", "left"),
        ("kind", "left"),
        ("count", "right"),
        ("bytes", "right"),
        ("time", "right"),
    )
    for s in sites[:15]:
        table.add_row(
            Text(_site_text(s.location)),
            Text(CAUSE_TEXT.get(s.cause, s.cause)),
            s.direction,
            "implicit" if s.implicit else "explicit",
            str(s.count),
            format_bytes(s.nbytes),
            format_seconds(s.seconds),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(sites) > 15:
        parts.append(_note(f"... and {len(sites) - 15} more call sites"))
    return Group(*parts)


@section("Collectives", order=55)
def _collectives(session: Any, terminal: bool) -> RenderableType | None:
    # programs over several devices: what XLA inserted to move data between them, and
    # what one device holds for each program; then the same for a TPU target, if any
    from tpu_debug.tracers.collectives import program_collectives

    local = program_collectives(session)
    targets = [e for e in program_collectives(session, target=None) if e.target]
    if not local and not targets:
        return None
    parts: list[RenderableType] = []
    if local:
        parts += _collective_programs(session, local, terminal, "")
    for target in sorted({e.target for e in targets}):
        parts += _collective_programs(session, [e for e in targets if e.target == target], terminal, target)
    parts.append(_note(
        "sent = bytes each device sends per run of the program (ring-algorithm estimate: an all-reduce of "
        "S bytes over n devices sends 2(n-1)/n S); memory = per device: arguments + outputs + temporaries"
    ))
    return Group(*parts)


def _collective_programs(session: Any, events: list, terminal: bool, target: str) -> list[RenderableType]:
    from tpu_debug.tracers.collectives import collective_totals, program_calls

    totals = collective_totals(events)
    calls = program_calls(session, events) if not target else {}
    kinds = ", ".join(f"{n} {k} ({format_bytes(b)})" for k, (n, b) in sorted(totals.by_opcode.items()))
    where = f"on {target} (XLA's TPU compiler)" if target else "on this run's devices"
    head = (
        f"{totals.programs} program(s) over {totals.devices} devices {where}: {totals.collectives} "
        f"collective(s){': ' + kinds if kinds else ''}"
    )
    if totals.peak_memory is not None:
        head += f"; largest per-device memory {format_bytes(totals.peak_memory)}"
    table = _table(
        terminal,
        ("program", "left"),
        ("devices", "right"),
        ("memory/device", "right"),
        ("collectives", "right"),
        ("sent/run", "right"),
        ("runs", "right"),
        ("sent total", "right"),
    )
    for e in events[:10]:
        runs = calls.get(e.id)
        table.add_row(
            Text(e.name + (f" ({e.error})" if e.error else "")),
            str(e.devices) if e.devices else "-",
            format_bytes(e.memory_bytes) if e.memory_bytes is not None else "-",
            str(len(e.collectives)),
            format_bytes(e.collective_bytes),
            str(runs) if runs is not None else "-",
            format_bytes(e.collective_bytes * runs) if runs is not None else "-",
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(events) > 10:
        parts.append(_note(f"... and {len(events) - 10} more programs"))
    detail = _table(
        terminal, ("collective", "left"), ("groups x devices", "right"), ("sent/run", "right"), ("from", "left"),
        ("at", "left"),
    )
    shown = 0
    for e in events[:3]:
        for c in e.collectives[:8]:
            detail.add_row(
                Text(f"{c.opcode} {c.shape}"),
                f"{c.groups}x{c.group_size}",
                format_bytes(c.wire_bytes),
                Text(f"{e.name}: {c.node or c.op or '-'}"),
                Text(f"{os.path.basename(c.file)}:{c.line}" if c.file else "-"),
            )
            shown += 1
    if shown:
        parts.append(detail)
    return parts


def _where(loc: Any) -> str:
    if loc is None:
        return "-"
    return f"{os.path.basename(loc.file)}:{loc.line}"


@section("Lazy graphs", order=57)
def _lazy_graphs(session: Any, terminal: bool) -> RenderableType | None:
    # lazy mode (DEFER_AND_FUSE): how many graphs ran per optimizer step, and what cut them
    from tpu_debug.tracers.lazy_graphs import summarize

    events = session.events("materialize")
    if not events:
        return None
    lazy = summarize(events)
    head = (
        f"{lazy.graphs} graph(s) run as {lazy.programs} program(s), {lazy.compiles} compiled in this run, "
        f"{lazy.ops:.0f} ops each on average"
    )
    if lazy.empty:
        head += f"; {lazy.empty} time(s) nothing pending was still referenced and nothing ran"
    parts: list[RenderableType] = [Text(head)]
    if lazy.steps:
        per_step = lazy.graphs_per_step
        line = f"{lazy.steps} optimizer step(s): {per_step:g} graph(s) per step (median)"
        if lazy.split_steps:
            line += f"; {lazy.split_steps} step(s) run as more than one graph"
        parts.append(Text(line))
    table = _table(
        terminal,
        ("where", "left"),
        ("cut by", "left"),
        ("count", "right"),
        ("compiled", "right"),
        ("ops", "right"),
        ("time", "right"),
    )
    for c in lazy.cuts[:15]:
        table.add_row(
            Text(_site_text(c.location)), Text(c.text), str(c.count), str(c.compiled),
            f"{c.ops:.0f}", format_seconds(c.seconds),
        )
    parts.append(table)
    if len(lazy.cuts) > 15:
        parts.append(_note(f"... and {len(lazy.cuts) - 15} more cut sites"))
    for c in lazy.extra_cuts[:3]:
        parts.append(
            Text(
                f"{_site_text(c.location)}: {c.text} cut the graph inside {c.steps} step(s): each cut runs "
                "what was recorded so far as a program of its own and waits for it; move the read after "
                "optimizer.step() (or read every N steps) so a step is one program"
            )
        )
    return Group(*parts)


def _site_text(loc: Any) -> str:
    if loc is None:
        return "-"
    return f"{os.path.basename(loc.file)}:{loc.line} in {loc.function}"


@section("Divergence", order=60)
def _divergence(session: Any, terminal: bool) -> RenderableType:
    # what was compared and the first op over tolerance, then the sites ranked
    summary = session.divergence_summary()
    events = session.divergences()
    if summary is None and not events:
        return _note("numerical divergence against CPU was not checked in this run (trace with divergence=True, or --divergence)")
    summary = summary or {}
    parts: list[RenderableType] = [_kv(_divergence_rows(summary, events))]
    sites: dict[tuple, list] = {}
    for e in events:
        sites.setdefault(_site_key(e), []).append(e)
    if sites:
        parts += _divergence_sites(summary, sites, terminal)
    return Group(*parts)


def _divergence_rows(summary: dict, events: list) -> list[tuple[str, str]]:
    """What was compared, under which numerics and tolerances, and what stood out."""
    compared = f"{summary.get('ops_compared', 0)} eager ops"
    if summary.get("ops_copied"):
        compared += f" (+{summary['ops_copied']} not compared: random ops, data loaded from the host)"
    if summary.get("graphs_compared"):
        compared += f", {summary['graphs_compared']} graph runs / {summary.get('nodes_compared', 0)} nodes"
    numerics = summary.get("numerics", "cpu")
    if numerics != "cpu":
        numerics += f", float32 product precision {summary.get('precision', '?')!r}"
    rows = [
        ("compared", compared),
        ("numerics", numerics),
        ("tolerances", str(summary.get("tolerances", "default"))),
    ]
    first = next((e for e in events if _is_first(e)), None)
    origin = next((e for e in events if e.nan_origin), None)
    if first is not None:
        rows.append(("first", _divergence_line(first)))
        if first.triage_text():
            rows.append(("verdict", first.triage_text()))
    elif any(e.over for e in events) and summary.get("sample", 1) > 1:
        hint = (
            "no sampled node is over tolerance itself, but results drift (below): "
            "run with divergence_sample=1 (--divergence-sample 1) to name the node"
        )
        rows.append(("first", hint))
    else:
        rows.append(("first", "every op compared is within tolerance of PyTorch on CPU (local measure)"))
    drifted = next((e for e in events if e.measure == "drift" and e.over and e.triage_text()), None)
    if drifted is not None and (first is None or drifted.verdict != first.verdict or drifted.crossings):
        # the first drift's cause: a wrong op before it, or noise (through a zero crossing)
        rows.append((
            "drift",
            f"{_site_name(drifted)} at {drifted.location or '-'} ({drifted.phase}): {drifted.triage_text()}",
        ))
    if origin is not None:
        where = origin.location or "-"
        rows.append(("NaN/Inf from", f"{_site_name(origin)} at {where} (made them from finite inputs)"))
    not_compared = summary.get("not_compared") or {}
    if not_compared:
        rows.append(("not compared", ", ".join(sorted(not_compared)) + " (no CPU kernel for these calls)"))
    return rows


def _is_first(e: Any) -> bool:
    return e.first and e.measure == "local"


def _site_key(e: Any) -> tuple:
    """A divergence site: the same op or node, measure and phase at the same line."""
    loc = e.location
    return (e.mode, e.measure, e.phase, e.graph, e.name, loc.file if loc else None, loc.line if loc else None)


def _rank_sites(sites: dict[tuple, list]) -> list[tuple[tuple, list]]:
    """The first over tolerance on top, then local before drift, NaN origins, worst error."""
    return sorted(
        sites.items(),
        key=lambda kv: (
            not any(_is_first(e) for e in kv[1]),
            kv[0][1] != "local",
            not any(e.nan_origin for e in kv[1]),
            -max(e.ratio for e in kv[1]),
        ),
    )


def _divergence_sites(summary: dict, sites: dict[tuple, list], terminal: bool) -> list[RenderableType]:
    """The ten worst local sites and five worst drift sites, with a legend."""
    # the summary counts every divergence of a site; the events kept may be fewer
    counts = {
        (s["mode"], s["measure"], s["phase"], s["graph"], s["name"], s["file"], s["line"]): s["count"]
        for s in summary.get("sites", [])
    }
    ranked = _rank_sites(sites)
    local = [kv for kv in ranked if kv[0][1] == "local"]
    drift = [kv for kv in ranked if kv[0][1] != "local"]
    shown = local[:10] + drift[:5]
    table = _table(
        terminal,
        ("op / node", "left"),
        ("where", "left"),
        ("measure", "left"),
        ("count", "right"),
        ("max abs", "right"),
        ("x tol", "right"),
        ("f64", "left"),
        ("highest", "left"),
    )
    for column, words in zip(table.columns[-2:], ("noise", "vanishes")):
        column.min_width = len(words)  # verdict words: never cut, the location gives way instead
    for key, items in shown:
        worst = max(items, key=lambda e: (e.ratio, e.max_abs))
        is_first = any(_is_first(e) for e in items)
        highest = next((e.highest for e in items if e.highest is not None), None)
        mark = ">> " if is_first else ("NaN " if any(e.nan_origin for e in items) else "")
        table.add_row(
            Text(mark + _site_name(worst), style="bold" if is_first and terminal else ""),
            Text(_where(worst.location)),
            worst.measure + (" bwd" if worst.phase == "backward" else ""),
            str(counts.get(key, len(items))),
            _g(worst.max_abs),
            _g(worst.ratio),
            _verdict_cell(items),
            "vanishes" if highest else ("remains" if highest is False else "-"),
        )
    parts: list[RenderableType] = [table]
    hidden = len(ranked) - len(shown)
    if hidden:
        parts.append(_note(f"... and {hidden} more sites ({len(drift) - min(len(drift), 5)} of them drift)"))
    parts.append(_note(
        ">> the first op over tolerance; local = the CPU op on the device's own inputs (where error "
        "enters), drift = against a CPU run of the whole computation (how it spreads); x tol = worst "
        "error in units of its tolerance; f64 = the triage verdict: noise (rounding: in float64 the device matches CPU, "
        "or every op before it does) or wrong (in float64 the device still differs, here or before); "
        "highest = at precision 'highest' (TPU numerics)"
    ))
    return parts


def _verdict_cell(items: list) -> str:
    """A site's triage verdict (the first of its events that has one); "wrong" wins."""
    verdicts = {e.verdict for e in items if e.verdict}
    if "wrong" in verdicts:
        return "wrong"
    return "noise" if verdicts else "-"


def _g(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.2g}"


def _site_name(e: Any) -> str:
    if e.mode == "compiled":
        return f"{e.name} ({e.target}, {e.graph})"
    return e.name + (f" ({e.autograd_node})" if e.autograd_node else "")


def _divergence_line(e: Any) -> str:
    text = (
        f"{_site_name(e)} at {e.location or '-'} ({e.mode}, {e.phase}): max abs {_g(e.max_abs)}, "
        f"max rel {_g(e.max_rel)}"
    )
    if e.ulp is not None:
        text += f", {_g(e.ulp)} ULP ({e.dtype})"
    text += f", {e.mismatched}/{e.numel} elements over tolerance (rtol {e.rtol:g}, atol {e.atol:g})"
    if e.dtype_mismatch:
        text += f"; dtype {e.device_dtype} on tpu, {e.dtype} on CPU"
    if e.highest is True:
        text += "; within tolerance at precision 'highest': a bfloat16-precision effect (torch.tpu.precision.set('highest') removes it)"
    elif e.highest is False:
        text += "; still over tolerance at precision 'highest': not a matmul-precision effect"
    return text


@section("Memory", order=65)
def _memory(session: Any, terminal: bool) -> RenderableType | None:
    # device bytes over the run, the peak's holders, and the fit against the TPU target
    from tpu_debug.tracers.memory import PHASE_TEXT, describe_fix, memory_view, size

    view = memory_view(session)
    if not view.recorded:
        return None
    m = view.summary
    parts: list[RenderableType] = []
    rows = []
    if m is not None:
        rows.append(("peak", f"{size(m.peak_bytes)} held by tpu tensors, in step {m.peak_step} of {m.steps} "
                             f"({size(m.persistent_bytes)} still held at that step's end, "
                             f"{size(m.activation_bytes)} of the forward's tensors gone by then)"))
        if m.temp_bytes:
            whose = "the TPU compiler's figure" if m.temp_source == "target" else "this machine's compiler's figure"
            rows.append(("largest program", f"{m.temp_program}: {size(m.temp_bytes)} of temporaries ({whose})"))
        if m.target is not None:
            verdict = "fits" if m.fits else "does NOT fit"
            rows.append(("need", f"~{size(m.required_bytes)} per device (peak + temporaries) of "
                                 f"{size(m.capacity_bytes)} on one {m.target} device: {verdict} (an estimate)"))
        if m.dry_run:
            dry = f"nothing executed; {m.programs} program(s) compiled for {m.target}, {m.oom_programs} out of HBM"
            rows.append(("dry run", dry))
        if m.stopped:
            where = f" at {_site_text(m.location)}" if m.location is not None else ""
            rows.append(("stopped", f"the dry run needs a value{where} ({m.stopped}); what ran before it is measured"))
    steps = view.steps
    if len(steps) > 1:
        top = max(st.peak_bytes for st in steps) or 1
        shown = steps[-60:]
        bars = "".join(" ▁▂▃▄▅▆▇█"[max(1, round(8 * st.peak_bytes / top))] if st.peak_bytes else " " for st in shown)
        rows.append(("peak per step", f"{bars}  (steps {shown[0].step}-{shown[-1].step})"))
    if rows:
        parts.append(_kv(rows))
    holders = view.peak_holders()
    if holders:
        table = _table(terminal, ("held at the peak by", "left"), ("phase", "left"), ("bytes", "right"),
                       ("tensors", "right"), ("largest", "left"))
        for h in holders:
            where = f"{os.path.basename(h.file)}:{h.line} in {h.function}" if h.file else "before the trace"
            table.add_row(Text(where), Text(PHASE_TEXT.get(h.phase, h.phase)), size(h.nbytes), str(h.tensors),
                          Text(f"{h.dtype}{list(h.shape)}" if h.shape else "-"))
        parts.append(table)
    for f in view.findings:
        if f.finding == "program_oom":
            head = (f"the TPU compiler refused {f.program} on {f.target}: it counted {size(f.required_bytes)} "
                    f"of {size(f.capacity_bytes)} HBM")
        else:
            head = (f"does not fit one {f.target} device: ~{size(f.required_bytes)} needed, "
                    f"{size(f.capacity_bytes)} there")
        if f.holders:
            head += "; biggest holders: " + ", ".join(
                f"{os.path.basename(h.file) + ':' + str(h.line) if h.file else 'before the trace'} "
                f"({size(h.nbytes)})" for h in f.holders)
        lines = [Text(head, style="bold red" if terminal else "")]
        lines += [Text(f"  fix: {describe_fix(fix)}" + ("" if fix.fits else " - not enough alone"))
                  for fix in f.fixes]
        parts.append(Group(*lines))
    if m is None:
        parts.append(_note("the run has not ended: the peak and the fit are written when it does"))
    return Group(*parts) if parts else None


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


@section("float64", order=75)
def _float64(session: Any, terminal: bool) -> RenderableType | None:
    # float64 runs on this backend; a TPU has none, so these ops would not run there
    ops = session.float64_ops()
    if not ops:
        return None
    table = _table(terminal, ("op or graph", "left"), ("programs", "right"), ("executions", "right"))
    for name, (programs, runs) in sorted(ops.items(), key=lambda kv: (-kv[1][1], kv[0])):
        table.add_row(Text(name), str(programs), str(runs))
    return Group(_note(f"{len(ops)} op(s) ran with float64/complex128 values (see Findings)"), table)


def _target_heading(session: Any) -> str:
    summary = session.events("target_summary")
    if summary:
        return f"TPU target ({summary[-1].target})"
    compiles = session.events("target_compile", limit=1)
    return f"TPU target ({compiles[0].target})" if compiles else "TPU target"


@section("TPU target", order=67, heading=_target_heading)
def _target(session: Any, terminal: bool) -> RenderableType | None:
    # each program compiled for a real TPU: memory, cost, roofline, padding; steps; findings
    from tpu_debug.tracers.target import findings

    summaries = session.events("target_summary")
    compiles = session.events("target_compile")
    if not summaries and not compiles:
        return None
    summary = summaries[-1] if summaries else None
    programs = session.programs()
    runs = {p.hash: p.count for p in programs if p.count}
    ids = {p.hash: p.id for p in programs}
    parts: list[RenderableType] = [_kv(_target_rows(summary, compiles, session.events("target_step")))]
    if compiles:
        parts += _target_programs(compiles, runs, ids, terminal)
    found = findings(compiles)
    if found:
        parts.append(Text("findings:"))
        parts += [Text(f"  {f.kind}: {f.render()}") for f in found[:8]]
        if len(found) > 8:
            parts.append(_note(f"... and {len(found) - 8} more findings"))
    parts.append(_note(
        "est. = a model estimate, not a measurement: max(flops / peak, bytes / HBM bandwidth) per program, "
        "with the target's published peaks and the TPU compiler's counts, per device; a step adds its "
        "programs back to back, without host dispatch. TPU HLO: session.hlo(<id>)"
    ))
    return Group(*parts)


def _target_rows(summary: Any, compiles: list, steps: list) -> list[tuple[str, str]]:
    from tpu_debug.tracers.target import step_summary

    rows = []
    if summary is not None:
        rows.append((
            "target",
            (
                f"{summary.target} ({summary.topology}, {summary.chips} chip(s)); per device "
                f"{format_bytes(summary.hbm_bytes)} HBM, {summary.peak_flops / 1e12:.0f} TFLOP/s bf16, "
                f"{summary.hbm_bandwidth / 1e9:.0f} GB/s; libtpu {summary.libtpu}"
            ),
        ))
        refused = [c for c in compiles if not c.ok]
        ooms = sum(1 for c in refused if c.status == "hbm_oom")
        line = f"{summary.programs} distinct, {summary.compiled} compiled ({summary.cached} from the cache)"
        if summary.refused:
            line += f", {summary.refused} refused ({ooms} out of HBM)"
        if summary.failed:
            line += f", {summary.failed} failed (see Tracer errors)"
        rows.append(("programs", line))
        if summary.unfinished:
            rows.append((
                "not finished",
                (
                    f"{summary.unfinished} program(s) still compiling when the trace stopped waiting "
                    f"({format_seconds(summary.waited_seconds)}, target_wait={summary.wait_limit:g}): no "
                    "estimate for them; raise target_wait (--target-wait, TPU_DEBUG_TARGET_WAIT) to wait longer"
                ),
            ))
        rows.append(("compile time", f"{format_seconds(summary.compile_seconds)} of TPU compiles, beside the program"))
    step = step_summary(steps)
    if step is not None:
        what = "the whole run (no step marks)" if step["whole_run"] else f"{step['steps']} step(s), median"
        text = f"est. {format_seconds(step['median_seconds'])} on the target for {what}"
        if not step["whole_run"] and step["min_seconds"] != step["max_seconds"]:
            text += f" ({format_seconds(step['min_seconds'])} - {format_seconds(step['max_seconds'])})"
        if step["median_mfu"] is not None:
            text += f", MFU est. {100 * step['median_mfu']:.2g} % of the bf16 peak"
        if step["estimated"] < step["executions"]:
            text += f"; {step['executions'] - step['estimated']} of {step['executions']} program runs have no estimate"
        rows.append(("step", text))
    largest = max((c for c in compiles if c.memory_bytes is not None), key=lambda c: c.memory_bytes, default=None)
    if largest is not None and summary is not None:
        rows.append((
            "memory",
            (
                f"largest program {format_bytes(largest.memory_bytes)} of {format_bytes(summary.hbm_bytes)} "
                f"per device ({largest.name})"
            ),
        ))
    return rows


def _si(value: float | None) -> str:
    """``3.28M``: three significant digits and a decimal prefix."""
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}"
    return f"{value:.3g}"


def _target_programs(compiles: list, runs: dict, ids: dict, terminal: bool) -> list[RenderableType]:
    """Programs by estimated time over the run (estimate x runs here), refused ones first."""

    def weight(c: Any) -> tuple:
        n = runs.get(c.program, 1) if c.program else 1
        return (c.ok, -(c.estimated_seconds or 0.0) * n, -(c.memory_bytes or 0))

    ranked = sorted(compiles, key=weight)
    table = _table(
        terminal,
        ("program", "left"),
        ("HBM", "right"),
        ("FLOP", "right"),
        ("bytes", "right"),
        ("FLOP/B", "right"),
        ("bound", "left"),
        ("est.", "right"),
        ("pad", "right"),
        ("HLO", "right"),
        left_width=24,
    )
    for c in ranked[:12]:
        hlo = str(ids[c.tpu_program]) if c.tpu_program in ids else "-"
        if not c.ok:
            need = f"needs {format_bytes(c.required_bytes)}" if c.required_bytes is not None else "-"
            table.add_row(Text(c.signature), Text(need), "-", "-", "-",
                          Text("OOM" if c.status == "hbm_oom" else "refused"), "-", "-", hlo)
            continue
        padding = "-"
        if c.padding_padded_bytes:
            padding = f"{100 * c.padding_wasted_bytes / c.padding_padded_bytes:.0f}%"
        table.add_row(
            Text(c.signature),
            format_bytes(c.memory_bytes) if c.memory_bytes is not None else "-",
            _si(c.flops),
            _si(c.bytes_accessed),
            f"{c.intensity:.2g}" if c.intensity is not None else "-",
            c.bound or "-",
            format_seconds(c.estimated_seconds),
            padding,
            hlo,
        )
    parts: list[RenderableType] = [table]
    if len(ranked) > 12:
        parts.append(_note(f"... and {len(ranked) - 12} more programs (session.events('target_compile'))"))
    parts.append(_note(
        "per device on the target: HBM the program needs (arguments, outputs, temporaries, code), the "
        "compiler's FLOP and bytes accessed, FLOP/B against the ridge point, est. time, pad = share of "
        "its arrays' bytes that TPU tiles pad, HLO = the TPU program's id"
    ))
    return parts


@section("TensorBoard", order=85)
def _tensorboard(session: Any, terminal: bool) -> RenderableType | None:
    # where the profile is, how much it holds, and whether the cap cut it short
    tb = session.metadata().tensorboard
    if not tb:
        return None
    rows = [("directory", str(session.run_dir / "tensorboard"))]
    files = tb.get("profile") or []
    rows.append(("profile", ", ".join(files) if files else "none written"))
    spans = f"{tb.get('spans', 0)} spans (max {tb.get('max_events', '-')}), {tb.get('steps', 0)} step mark(s)"
    if tb.get("capped"):
        spans += f"; CAPPED after {tb.get('capped_after_seconds', 0):.2f} s, {tb.get('dropped_spans', 0)} spans dropped"
    rows.append(("captured", spans))
    rows.append(("open with", f"tpu-debug tensorboard {session.run_dir.name}"))
    notes = [_kv(rows)] + [_note(str(n)) for n in tb.get("notes") or []]
    return Group(*notes)


@section("Tracer errors", order=90)
def _errors(session: Any, terminal: bool) -> RenderableType | None:
    errors = session.internal_errors()
    meta = session.metadata()
    notes = []
    if meta.recording_error:
        notes.append(_note(f"recording stopped early: {meta.recording_error}"))
    if meta.dropped_events:
        notes.append(_note(f"{meta.dropped_events:,} events were not recorded (the run writer could not keep up or had stopped)"))
    if errors:
        # the run keeps the first errors of each kind; the meta counts them all
        capped = session.capped_counts("internal_error")
        total: dict[str, int] = {}
        first: dict[str, str] = {}
        for e in errors:
            total[e.where] = capped.get(e.where, total.get(e.where, 0) + 1)
            first.setdefault(e.where, e.message)
        table = _table(terminal, ("where", "left"), ("count", "right"), ("first error", "left"))
        for where, message in list(first.items())[:10]:
            table.add_row(Text(where), f"{total[where]:,}", Text(message))
        notes += [_note(f"{sum(total.values()):,} tracer error(s); the program was not affected"), table]
    return Group(*notes) if notes else None


# -- the report as data ----------------------------------------------------------------------


def _location_data(loc: Any) -> dict[str, Any] | None:
    return {"file": loc.file, "line": loc.line, "function": loc.function} if loc is not None else None


def _finite(value: float | None) -> float | None:
    # JSON has no NaN or Infinity
    return value if value is None or math.isfinite(value) else None


def report_data(session: Any) -> dict[str, Any]:
    """The report of ``session``'s run as data: run metadata, per-step figures, the advisor's
    findings, op, compile, transfer and divergence summaries, under :data:`REPORT_SCHEMA`
    (docs/report_schema.md describes every field).

    Returns:
        A dict of JSON values (``json.dumps`` takes it as it is).

    Example:
        >>> data = report_data(tpu_debug.open_run())
        >>> data["schema"], [f["kind"] for f in data["findings"]]
        ('tpu_debug.report/1', ['implicit_sync'])
    """
    from tpu_debug.tracers.advisor import FINDINGS_SCHEMA
    from tpu_debug.tracers.steps import STEADY

    m = session.metadata()
    advice = advice_of(session)
    steps = session.steps()
    phases = dict(zip((s.index for s in steps), _phases(steps)))
    summary = advice.steps
    steady = _steady_recompiles(session) if steps else {}
    ops = session.ops()
    transfers = session.transfers()
    divergence = session.divergence_summary()
    first = session.first_divergence() if divergence is not None else None

    def totals(t: Any) -> dict[str, Any]:
        return {"compiles": t.compiles, "recompiles": t.recompiles, "seconds": t.seconds}

    return {
        "schema": REPORT_SCHEMA,
        "run": {
            "name": m.name,
            "dir": str(session.run_dir),
            "status": m.status,
            "exit_status": m.exit_status,
            "error": m.error,
            "start_time": m.start_time,
            "end_time": m.end_time,
            "duration": m.duration,
            "argv": list(m.argv),
            "cwd": m.cwd,
            "hostname": m.hostname,
            "platform": m.platform,
            "device_kind": m.device_kind,
            "device_count": m.device_count,
            "modes": session.modes(),
            "versions": {
                "tpu_debug": m.tpu_debug_version,
                "torch": m.torch_version,
                "jax": m.jax_version,
                "jaxlib": m.jaxlib_version,
                "python": m.python_version,
            },
            "store_schema": m.schema_version,
            "options": m.options,
        },
        "steps": {
            "count": summary.steps,
            "detected": summary.detected,
            "warmup": list(summary.warmup),
            "steady": summary.steady,
            "step_seconds": summary.step_seconds,
            "ops_per_step": summary.ops_per_step,
            "op_seconds": summary.op_seconds,
            "compiles": {
                "setup": totals(summary.setup),
                "warmup": totals(summary.warm),
                "steady": totals(summary.steady_compiles),
                "outside": totals(summary.tail),
            },
            "per_step": [
                {
                    "index": s.index,
                    "detected": s.detected,
                    "phase": phases[s.index],
                    "start": s.ts,
                    "end": s.end,
                    "seconds": s.seconds,
                    "eager_ops": s.eager_ops,
                    "graph_runs": s.graph_runs,
                    "op_seconds": s.op_seconds,
                    "compiles": s.compiles,
                    "recompiles": s.recompiles,
                    "compile_seconds": s.compile_seconds,
                    "transfers": s.transfers,
                    "transfer_bytes": s.transfer_bytes,
                    "transfer_seconds": s.transfer_seconds,
                    "fallbacks": s.fallbacks,
                    "sequence": s.sequence,
                }
                for s in steps
            ],
        },
        "findings_schema": FINDINGS_SCHEMA,
        "findings": [f.to_dict() for f in advice.findings],
        "advisor_errors": list(advice.errors),
        "ops": [
            {
                "name": o.name,
                "mode": o.mode,
                "count": o.count,
                "seconds": o.seconds,
                "compiles": o.compiles,
                "compile_seconds": o.compile_seconds,
                "programs": o.programs,
            }
            for o in ops
        ],
        "compiles": {
            "count": sum(o.compiles for o in ops),
            "seconds": sum(o.compile_seconds for o in ops),
            "groups": [
                {
                    "identity": g.identity,
                    "mode": g.mode,
                    "compiles": g.compiles,
                    "recompiles": g.recompiles,
                    "steady_recompiles": steady.get((g.mode, g.identity), 0),
                    "seconds": g.seconds,
                    "changing": (
                        {"what": g.changing.what, "kind": g.changing.kind, "values": list(g.changing.values)}
                        if g.changing is not None
                        else None
                    ),
                    "location": _location_data(g.locations[0][0]) if g.locations else None,
                }
                for g in session.recompile_groups()
            ],
        },
        "transfers": {
            "count": len(transfers),
            "bytes": sum(t.nbytes for t in transfers),
            "seconds": sum(t.seconds for t in transfers),
            "implicit": sum(1 for t in transfers if t.implicit),
            "sites": [
                {
                    "location": _location_data(c.location),
                    "direction": c.direction,
                    "cause": c.cause,
                    "implicit": c.implicit,
                    "count": c.count,
                    "bytes": c.nbytes,
                    "seconds": c.seconds,
                }
                for c in session.transfer_call_sites()
            ],
        },
        "divergence": (
            None
            if divergence is None
            else {
                "checked": True,
                "ops_compared": divergence.get("ops_compared", 0),
                "graphs_compared": divergence.get("graphs_compared", 0),
                "numerics": divergence.get("numerics", "cpu"),
                "first": (
                    None
                    if first is None
                    else {
                        "name": first.name,
                        "mode": first.mode,
                        "phase": first.phase,
                        "location": _location_data(first.location),
                        "max_abs": _finite(first.max_abs),
                        "max_rel": _finite(first.max_rel),
                        "ratio": _finite(first.ratio),
                        "mismatched": first.mismatched,
                        "numel": first.numel,
                        "highest": first.highest,
                    }
                ),
            }
        ),
    }


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
        title = sec.heading(session) if sec.heading is not None else sec.title
        console.print(Text(title, style="bold underline" if is_terminal else ""))
        console.print(body)


# -- multi-process runs ----------------------------------------------------------------------


def rank_figures(session: Any) -> dict[str, str]:
    """One column of the per-rank table."""
    from tpu_debug.tracers.collectives import collective_totals, program_calls, program_collectives

    m = session.metadata()
    status = m.status + (f" ({m.exit_status})" if m.exit_status not in (None, 0) else "")
    ops = session.ops()
    programs = program_collectives(session)
    calls = program_calls(session, programs)
    totals = collective_totals(programs)
    return {
        "status": status,
        "duration": format_seconds(m.duration) if m.duration is not None else "-",
        "devices": str(m.device_count),
        "device ops run": str(sum(o.count for o in ops)),
        "compiles": str(sum(o.compiles for o in ops)),
        "multi-device programs": str(totals.programs),
        "collectives (distinct)": str(totals.collectives),
        "sent per device": format_bytes(sum(e.collective_bytes * calls.get(e.id, 0) for e in programs)),
        "largest memory/device": format_bytes(totals.peak_memory) if totals.peak_memory is not None else "-",
        "transfers": str(len(session.transfers())),
        "tracer errors": str(len(session.internal_errors())),
    }


def print_rank_report(
    group: Any, *, file: Any = None, terminal: bool | None = None, width: int | None = None
) -> None:
    """Print the report of a multi-process run: the ranks side by side, whether they agreed,
    and where they first differed.

    Args:
        group: a :class:`~tpu_debug.ranks.RankGroup`.
        file, terminal, width: as for :func:`print_report`.
    """
    from tpu_debug.tracers.collectives import compare_ranks

    console = _console(file, terminal, width)
    is_terminal = console.is_terminal
    info = group.info
    sessions = group.sessions()
    title = f"tpu_debug report: {group.name} ({info.get('nproc', len(sessions))} ranks)"
    if is_terminal:
        console.rule(Text(title, style="bold"))
    else:
        console.print(Text(title))
        console.print(Text("=" * min(console.width, len(title))))

    def heading(text: str) -> None:
        console.print()
        console.print(Text(text, style="bold underline" if is_terminal else ""))

    heading("Ranks")
    rows = [
        ("run", str(group.path)),
        ("command", " ".join(info.get("command") or []) or "-"),
        ("status", f"{info.get('status', '?')}" + (f", exit statuses {info['exit_status']}"
                                                  if info.get("exit_status") else "")),
    ]
    console.print(_kv(rows))
    missing = [r for r in range(int(info.get("nproc", 0))) if r not in dict(sessions)]
    if missing:
        console.print(_note(f"rank(s) {', '.join(map(str, missing))} recorded nothing (they ended before tracing began)"))
    if sessions:
        figures = [(rank, rank_figures(s)) for rank, s in sessions]
        table = _table(is_terminal, ("", "left"), *[(f"rank {r}", "right") for r, _ in figures])
        for key in figures[0][1]:
            table.add_row(Text(key), *[Text(f[key]) for _, f in figures])
        console.print(table)

    heading("Rank agreement")
    stopped = False
    for rank, s in sessions:
        error = s.metadata().error or ""
        if error.startswith(("RankDivergenceError", "RankTimeoutError")):
            # the first rank that stopped in full; the others say the same from their side
            console.print(Text(f"rank {rank} stopped: {error if not stopped else error.splitlines()[0]}"))
            stopped = True
    diff = compare_ranks([(rank, s.events("collectives")) for rank, s in sessions])
    if diff is not None:
        console.print(Text(f"compiled programs: {diff.render()}"))
    elif len(sessions) > 1:
        n = len([e for e in sessions[0][1].events("collectives") if not e.target])
        console.print(Text(
            f"every rank compiled the same {n} multi-device program(s), with the same collectives, in the same order"
            + ("" if not stopped else " (up to where they stopped)")
        ))
    for rank, s in sessions:
        error = s.metadata().error
        if error and not error.startswith(("RankDivergenceError", "RankTimeoutError")):
            console.print(Text(f"rank {rank} failed: {error.splitlines()[0]}"))

    if sessions:
        rank, first = sessions[0]
        body = _collectives(first, is_terminal)
        if body is not None:
            heading(f"Collectives (rank {rank})")
            console.print(body)
    console.print()
    console.print(_note(
        "each rank's full report: tpu-debug report " + " | ".join(str(s.run_dir) for _, s in sessions[:1])
        + (" (and the other rank directories beside it)" if len(sessions) > 1 else "")
    ))
