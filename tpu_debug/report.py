"""The run report: what ran where, the heaviest ops and programs, and one section per tracer.

Sections are registered with ``@section(title, order=...)``; each takes a
:class:`~tpu_debug.session.Session` and returns a rich renderable, or ``None``
to be left out. Text that comes from the run (op names, paths, HLO) is always
wrapped in ``rich.text.Text``, so it is never read as markup.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_debug.errors import ReportSectionError

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
        ReportSectionError: a section with this title is already registered.
    """

    def register(fn: Callable[[Any, bool], RenderableType | None]) -> Callable:
        if any(s.title == title for s in SECTIONS):
            raise ReportSectionError(
                f"report section {title!r} is registered twice; give the new section another title"
            )
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
    # grouped by op / graph, what keeps changing, storms with advice, then dynamo's side
    groups = [g for g in session.recompile_groups() if g.recompiles]
    breaks, failures, limits = session.graph_breaks(), session.guard_failures(), session.recompile_limits()
    if not groups and not breaks and not failures and not limits:
        return _note("nothing was compiled twice: every op and graph kept one key")
    threshold = int(session.metadata().options.get("storm_threshold", 5))
    storms = [g for g in groups if g.storm]
    parts: list[RenderableType] = []
    if groups:
        parts += _recompile_table(groups, storms, threshold, terminal)
    parts += _shared_storm_sizes(storms)
    parts += _storm_advice(storms)
    parts += _other_recompiles(groups)
    if failures:
        parts.append(_guard_failures(failures))
    if breaks:
        parts.append(_graph_breaks(breaks))
    parts += [_recompile_limit_hit(hit) for hit in limits]
    return Group(*parts)


def _recompile_table(groups: list, storms: list, threshold: int, terminal: bool) -> list[RenderableType]:
    """The headline and one row per recompiled op or graph, storms marked."""
    total = sum(g.recompiles for g in groups)
    head = (
        f"{total} recompile(s) of {len(groups)} op(s)/graph(s), "
        f"{format_seconds(sum(g.seconds for g in groups))} compiling them"
    )
    if storms:
        head += f"; {len(storms)} storm(s) (more than {threshold} recompiles at one line)"
    table = _table(
        terminal,
        ("op / graph", "left"),
        ("compiles", "right"),
        ("recompiles", "right"),
        ("what keeps changing: values", "left"),
        ("at", "left"),
    )
    for g in groups[:12]:
        ch = g.changing
        where = _change_location(g)
        values = ", ".join(ch.values[:6]) + (", ..." if len(ch.values) > 6 else "") if ch else ""
        grows = " (grows)" if ch is not None and ch.grows else ""
        table.add_row(
            Text(("STORM " if g.storm else "") + g.identity),
            str(g.compiles),
            str(g.recompiles),
            Text(f"{ch.what}{grows}: {values}" if ch else "-"),
            Text(_where(where)),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(groups) > 12:
        parts.append(_note(f"... and {len(groups) - 12} more"))
    return parts


def _change_location(g: Any) -> Any:
    """Where a group's top change happened, else where it recompiled most."""
    ch = g.changing
    if ch is not None and ch.location is not None:
        return ch.location
    return g.locations[0][0] if g.locations else None


def _shared_storm_sizes(storms: list) -> list[RenderableType]:
    """Storms whose changing shape took the same values are one problem: say so once."""
    shared: dict[tuple[str, ...], list] = {}
    for g in storms:
        if g.changing is not None and g.changing.kind == "shape":
            shared.setdefault(tuple(sorted(g.changing.values, key=_num)), []).append(g)
    return [
        Text(
            f"one size drives {len(items)} storms: it took {len(values)} values "
            f"({', '.join(values[:8])}{', ...' if len(values) > 8 else ''}) in "
            f"{', '.join(g.identity for g in items[:4])}{', ...' if len(items) > 4 else ''}; "
            + (
                # a sequence extended step by step (a KV cache) is fixed where it is allocated
                "it grows one step at a time: fix it once, where that sequence is allocated"
                if any(g.changing.grows for g in items)
                else "fix it once, where the data is batched"
            )
        )
        for values, items in shared.items()
        if len(items) > 1
    ]


def _storm_advice(storms: list) -> list[RenderableType]:
    """The worst storms, each with example diffs and what to do."""
    from tpu_debug.tracers.recompiles import describe

    parts: list[RenderableType] = []
    for g in storms[:3]:
        lines = [f"{g.identity} ({g.mode}) recompiled {g.recompiles} times"]
        if g.changing is not None:
            lines[0] += f": {g.changing.what} took {len(g.changing.values)} values"
        where = _change_location(g)
        if where is not None:
            lines[0] += f", at {where}"
        lines += [f"  e.g. {describe(d)}" for d in g.last_diffs[:4]]
        lines += [f"  fix: {a}" for a in g.advice]
        parts.append(Text("\n".join(lines)))
    if len(storms) > 3:
        parts.append(_note(f"... and {len(storms) - 3} more storms (session.recompile_groups() has them all)"))
    return parts


def _other_recompiles(groups: list) -> list[RenderableType]:
    """The latest diffs of the first few recompiled ops that are not storms."""
    from tpu_debug.tracers.recompiles import describe

    return [
        _note(f"{g.identity}: " + "; ".join(describe(d) for d in g.last_diffs[:3]))
        for g in [g for g in groups if not g.storm][:3]
    ]


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
        f"{hit.name} hit dynamo's {hit.limit_type} ({hit.limit}) at {_where(hit.location)} and "
        f"now runs uncompiled; last reason: {hit.reason}"
    )


def _num(text: str) -> tuple:
    try:
        return (0, float(text))
    except ValueError:
        return (1, text)


@section("Transfers", order=50)
def _transfers(session: Any, terminal: bool) -> RenderableType:
    # the ledger by call site, implicit (syncs) first, loops called out with advice
    from tpu_debug.tracers.transfers import CAUSE_TEXT, advice_for

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
            str(s.count) + (" (loop)" if s.loop else ""),
            format_bytes(s.nbytes),
            format_seconds(s.seconds),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(sites) > 15:
        parts.append(_note(f"... and {len(sites) - 15} more call sites"))
    for s in [s for s in sites if s.loop][:5]:
        calls = f" in {s.calls} calls" if s.calls != s.count else ""
        parts.append(
            Text(
                f"{_site_text(s.location)}: {CAUSE_TEXT.get(s.cause, s.cause)} moved data {s.count} times{calls} "
                f"({format_seconds(s.seconds)}): {advice_for(s)}"
            )
        )
    return Group(*parts)


def _where(loc: Any) -> str:
    if loc is None:
        return "-"
    return f"{os.path.basename(loc.file)}:{loc.line}"


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
    elif any(e.over for e in events) and summary.get("sample", 1) > 1:
        hint = (
            "no sampled node is over tolerance itself, but results drift (below): "
            "run with divergence_sample=1 (--divergence-sample 1) to name the node"
        )
        rows.append(("first", hint))
    else:
        rows.append(("first", "every op compared is within tolerance of PyTorch on CPU (local measure)"))
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
        ("highest", "left"),
    )
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
            "vanishes" if highest else ("remains" if highest is False else "-"),
        )
    parts: list[RenderableType] = [table]
    hidden = len(ranked) - len(shown)
    if hidden:
        parts.append(_note(f"... and {hidden} more sites ({len(drift) - min(len(drift), 5)} of them drift)"))
    parts.append(_note(
        ">> the first op over tolerance; local = the CPU op on the device's own inputs (where error "
        "enters), drift = against a CPU run of the whole computation (how it spreads); x tol = worst "
        "error in units of its tolerance; highest = at precision 'highest' (TPU numerics)"
    ))
    return parts


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
    note = Text(
        f"{len(ops)} op(s) ran with float64/complex128 values. A TPU has no float64: there they "
        "fail or must be rewritten in float32 (look for .double(), dtype=torch.float64, "
        "torch.from_numpy of float64 arrays, Python floats made into tensors with the default dtype set to float64)."
    )
    return Group(note, table)


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
