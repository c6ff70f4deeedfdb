"""The run report: the advisor's findings, the steps, what ran where, and one section per tracer.

A section is declared once, with ``@section(title, order=..., key=..., render=...)`` on
its data function: ``data(session)`` gives the section as plain JSON values
(dicts, lists, strings, numbers, None), and ``render(data, terminal)`` turns that
data, and nothing else, into a rich renderable (``None``: the section is left
out of the text). :func:`report_data` (``tpu-debug report --json``, under the
versioned schema :data:`REPORT_SCHEMA`, docs/report_schema.md) and
:func:`print_report` read the same data, so the JSON holds every section.

Text that comes from the run (op names, paths, HLO) is always wrapped in
``rich.text.Text``, so it is never read as markup. What the run should change is
the advisor's (:mod:`tpu_debug.tracers.advisor`): the "Findings" section renders
its records and composes no advice of its own.

Plain text (a file, a pipe) never cuts a cell: cells wrap, and the width is
``width``, else ``$COLUMNS``, else :data:`PLAIN_WIDTH`.
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

from tpu_debug.core.errors import ReportSectionError

__all__ = [
    "PLAIN_WIDTH",
    "RANKS_SCHEMA",
    "REPORT_SCHEMA",
    "SECTIONS",
    "advice_of",
    "format_bytes",
    "format_seconds",
    "plain_width",
    "print_rank_report",
    "print_report",
    "rank_data",
    "rank_figures",
    "report_data",
    "section",
    "short_path",
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
    data: Callable[[Any], Any]
    render: Callable[[Any, bool], RenderableType | None]
    heading: Callable[[Any], str] | None = None


SECTIONS: list[Section] = []


def section(
    title: str,
    *,
    order: int,
    key: str | None,
    render: Callable[[Any, bool], RenderableType | None],
    heading: Callable[[Any], str] | None = None,
) -> Callable:
    """Register a report section on its data function ``fn(session) -> JSON value``.

    Args:
        title: the section's name (unique), and its heading unless ``heading`` is given.
        order: where it goes, lowest first.
        key: the field of :func:`report_data` that holds the section's data; ``None``:
            the data is a dict whose fields are top-level fields of the report.
        render: ``render(data, terminal)`` gives the text from the data (``None``: left out).
        heading: ``heading(data)`` gives the printed heading (``"TPU target (v5e)"``).

    Raises:
        ReportSectionError: a section with this title or key is already registered.
    """

    def register(fn: Callable[[Any], Any]) -> Callable:
        if any(s.title == title or (key is not None and s.key == key) for s in SECTIONS):
            raise ReportSectionError(
                f"report section {title!r} (key {key!r}) is registered twice; give the new section "
                "another title and key"
            )
        SECTIONS.append(Section(title, order, key, fn, render, heading))
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


def _plain(value: Any, skip: tuple[str, ...] = ("thread",)) -> Any:
    """A record as JSON values: a dataclass as a dict of its fields (but ``skip``), tuples
    as lists, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), skip) for f in dataclasses.fields(value) if f.name not in skip}
    if isinstance(value, (list, tuple)):
        return [_plain(v, skip) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, skip) for k, v in value.items()}
    return value


def _location_data(loc: Any) -> dict[str, Any] | None:
    return {"file": loc.file, "line": loc.line, "function": loc.function} if loc is not None else None


def _where(loc: dict | None) -> str:
    """``train.py:12`` of a location's data."""
    if loc is None:
        return "-"
    return f"{os.path.basename(loc['file'])}:{loc['line']}"


def _site_text(loc: dict | None) -> str:
    """``train.py:12 in step`` of a location's data."""
    if loc is None:
        return "-"
    return f"{os.path.basename(loc['file'])}:{loc['line']} in {loc['function']}"


def _full_where(loc: dict | None) -> str:
    """The whole path, line and function of a location's data."""
    if loc is None:
        return "-"
    return f"{loc['file']}:{loc['line']} in {loc['function']}"


def _render_run(d: dict, terminal: bool) -> RenderableType:
    status = d["status"]
    if d["exit_status"] is not None:
        status += f" (exit status {d['exit_status']})"
    if d["error"]:
        status += f": {d['error']}"
    if d["status"] == "killed":
        status += " - the process ended without closing the run; what it recorded until then is kept"
    v = d["versions"]
    rows = [
        ("run", d["dir"]),
        ("command", " ".join(d["argv"]) if d["argv"] else "-"),
        ("started", str(d["start_time"])),
        ("duration", format_seconds(d["duration"]) if d["duration"] is not None else "-"),
        ("status", status),
        ("platform", f"XLA {d['platform'].upper()} ({d['device_kind']}), {d['device_count']} device(s)"),
        ("mode", ", ".join(d["modes"]) if d["modes"] else "no device ops ran"),
        ("versions", f"tpu_debug {v['tpu_debug']}, torch {v['torch']}, jax {v['jax']}, jaxlib {v['jaxlib']}"),
    ]
    if d.get("imported_from"):
        versions = f"torch {v['torch']}" if v["torch"] else NOT_MEASURED
        rows[5:] = [("imported from", d["imported_from"]),
                    ("platform", NOT_MEASURED), ("mode", ", ".join(d["modes"]) or "-"), ("versions", versions)]
    return _kv(rows)


# what an imported TORCH_TRACE log cannot say (it records compiles, guards and graph breaks)
NOT_MEASURED = "not in an imported TORCH_TRACE log"


def _imported(session: Any) -> bool:
    return bool(getattr(session.metadata(), "imported_from", None))


@section("Run", order=0, key="run", render=_render_run)
def _run(session: Any) -> dict[str, Any]:
    m = session.metadata()
    return {
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
        "imported_from": m.imported_from,
        "versions": {
            "tpu_debug": m.tpu_debug_version,
            "torch": m.torch_version,
            "jax": m.jax_version,
            "jaxlib": m.jaxlib_version,
            "python": m.python_version,
        },
        "store_schema": m.schema_version,
        "options": m.options,
    }


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


def _render_findings(d: dict, terminal: bool) -> RenderableType:
    # the advisor's records, most serious and most costly first; no prose is made here
    from tpu_debug.tracers.advisor import Finding

    parts: list[RenderableType] = []
    if not d["findings"]:
        parts.append(_note(
            "nothing to fix: no recompiles, syncs, fallbacks or uploads that repeat in steady state, "
            "no graph breaks inside the step, no float64, no divergence found"
        ))
    parts += [finding_text(Finding.from_dict(f), terminal=terminal) for f in d["findings"]]
    parts += [_note(e) for e in d["advisor_errors"]]
    return Group(*parts)


@section("Findings", order=1, key=None, render=_render_findings)
def _findings(session: Any) -> dict[str, Any]:
    from tpu_debug.tracers.advisor import FINDINGS_SCHEMA

    advice = advice_of(session)
    return {
        "findings_schema": FINDINGS_SCHEMA,
        "findings": [f.to_dict() for f in advice.findings],
        "advisor_errors": list(advice.errors),
    }


def _steps_range_text(indexes: list[int]) -> str:
    ranges: list[list[int]] = []
    for i in indexes:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


_DETECTED = {
    "optimizer": "each optimizer.step()",
    "explicit": "each tpu_debug.step()",
    "loop": "the iterations of the loop the run repeated",
    "torch_trace": "the calls an imported TORCH_TRACE log shows compiling; it does not log the others",
}


def _steps_rows(d: dict) -> list[tuple[str, str]]:
    how = " and ".join(_DETECTED.get(x, x) for x in (d["detected"] or "").split("+"))
    rows = [("steps", f"{d['count']} ({how})")]
    c = d["compiles"]
    if d["warmup"]:
        rows.append((
            "warm-up",
            (f"step {_steps_range_text(d['warmup'])}: {c['warmup']['compiles']} compile(s) "
            f"({format_seconds(c['warmup']['seconds'])}); first compiles, and ops compiled for several shapes "
            "at once, are expected here"),
        ))
    if c["setup"]["compiles"]:
        rows.append(("before steps", f"{c['setup']['compiles']} compile(s) ({format_seconds(c['setup']['seconds'])})"))
    if d["steady"]:
        rows.append((
            "steady state",
            (f"{d['steady']} step(s), {format_seconds(d['step_seconds'])} and {d['ops_per_step']:,.0f} "
            f"op(s) per step (median); {c['steady']['compiles']} compile(s) ({format_seconds(c['steady']['seconds'])})"),
        ))
    if c["outside"]["compiles"]:
        rows.append(("outside steps", f"{c['outside']['compiles']} compile(s) ({format_seconds(c['outside']['seconds'])})"))
    return rows


def _render_steps(d: dict, terminal: bool) -> RenderableType:
    # warm-up against steady state, then the figures of a few steps
    from tpu_debug.tracers.steps import STEADY

    if not d["per_step"]:
        return _note(
            "no steps: the run called neither optimizer.step() (with tpu parameters) nor tpu_debug.step(), "
            "and repeated no loop of ops; every compile counts as warm-up"
        )
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
    previous = None
    for s in _steps_shown(d["per_step"]):
        if previous is not None and s["index"] != previous + 1:
            table.add_row("...", "", "", "", "", "", "", "", "")
        previous = s["index"]
        table.add_row(
            str(s["index"]),
            s["phase"] if s["phase"] != STEADY or s["compiles"] == 0 else "steady (compiles)",
            format_seconds(s["seconds"]),
            "-" if s["eager_ops"] is None else f"{s['eager_ops'] + s['graph_runs']:,}",
            "-" if s["op_seconds"] is None else format_seconds(s["op_seconds"]),
            str(s["compiles"]),
            format_seconds(s["compile_seconds"]),
            "-" if s["transfers"] is None else str(s["transfers"]),
            "-" if s["transfer_bytes"] is None else format_bytes(s["transfer_bytes"]),
        )
    note = _note("time: from one step's end to the next; dispatch: host time running its ops (session.steps() has every step)"
                 + ("; -: " + NOT_MEASURED if d["per_step"][0]["eager_ops"] is None else ""))
    return Group(_kv(_steps_rows(d)), table, note)


def _steps_shown(steps: list[dict], limit: int = 12) -> list[dict]:
    """The steps worth a row: warm-up ones, steady ones that compiled, the first and last
    steady ones; at most ``limit``."""
    from tpu_debug.tracers.steps import STEADY

    steady = [s for s in steps if s["phase"] == STEADY]
    keep = {s["index"] for s in steps if s["phase"] != STEADY}
    keep |= {s["index"] for s in steady[:2]} | {s["index"] for s in steady[-1:]}
    keep |= {s["index"] for s in steady if s["compiles"]}
    by_index = {s["index"]: s for s in steps}
    return [by_index[i] for i in sorted(keep)[:limit]]


def _phases(steps: list) -> list[str]:
    from tpu_debug.tracers.steps import step_phases

    return step_phases(steps)


# a step's figures a TORCH_TRACE log does not record (None in an imported run's data)
_UNLOGGED_STEP = ("eager_ops", "graph_runs", "op_seconds", "transfers", "transfer_bytes", "transfer_seconds",
                  "fallbacks")


def _step_data(s: Any, phase: str, imported: bool = False) -> dict[str, Any]:
    data = _step_fields(s, phase)
    if imported:
        data.update(dict.fromkeys(_UNLOGGED_STEP))
    return data


def _step_fields(s: Any, phase: str) -> dict[str, Any]:
    return {
        "index": s.index,
        "detected": s.detected,
        "phase": phase,
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


@section("Steps", order=5, key="steps", render=_render_steps)
def _steps(session: Any) -> dict[str, Any]:
    summary = advice_of(session).steps
    steps = session.steps()
    phases = _phases(steps)

    def totals(t: Any) -> dict[str, Any]:
        return {"compiles": t.compiles, "recompiles": t.recompiles, "seconds": t.seconds}

    return {
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
        "per_step": [_step_data(s, phase, _imported(session)) for s, phase in zip(steps, phases)],
    }


def _render_ops(ops: list[dict], terminal: bool) -> RenderableType:
    if not ops:
        return _note("no ops recorded")
    total = sum(o["seconds"] or 0.0 for o in ops) or 1.0
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
    unlogged = ops[0]["count"] is None
    for o in ops[:15]:
        timed = o["count"] is not None
        table.add_row(
            Text(o["name"]),
            Text(o["mode"]),
            str(o["count"]) if timed else "-",
            format_seconds(o["seconds"]) if timed else "-",
            (format_seconds(o["seconds"] / o["count"] if o["count"] else 0.0)) if timed else "-",
            f"{100 * o['seconds'] / total:.1f}" if timed else "-",
            str(o["compiles"]),
        )
    parts: list[RenderableType] = [table]
    if len(ops) > 15:
        parts.append(_note(f"... and {len(ops) - 15} more ops"))
    parts.append(_note(f"calls and time: {NOT_MEASURED} (it records compiles)" if unlogged else
                       "time is host time to dispatch each executable (device work runs asynchronously)"))
    return Group(*parts)


@section("Top ops by time", order=10, key="ops", render=_render_ops)
def _ops(session: Any) -> list[dict[str, Any]]:
    imported = _imported(session)
    return [
        {
            "name": o.name,
            "mode": o.mode,
            "count": None if imported else o.count,
            "seconds": None if imported else o.seconds,
            "compiles": o.compiles,
            "compile_seconds": o.compile_seconds,
            "programs": o.programs,
        }
        for o in session.ops()
    ]


def _read_back_text(d: dict) -> str | None:
    """The programs read back from the persistent compile cache and the compile time saved."""
    if not d["read_back"]:
        return None
    return (f"{d['read_back']} program(s) read back from the compile cache, saving "
            f"{format_seconds(d['saved_seconds'])} of compiling")


def _render_compiles(d: dict, terminal: bool) -> RenderableType:
    cached = _read_back_text(d)
    if not d["count"]:
        return _note("nothing was compiled while tracing" + (f"; {cached}" if cached else ""))
    modes = ", ".join(f"{m['compiles']} {name}" for name, m in sorted(d["by_mode"].items()))
    rows = [
        ("compiles", f"{d['count']} ({modes})"),
        ("compile time", format_seconds(d["seconds"])),
        ("distinct programs", str(d["programs"]) if d["programs"] else "HLO not recorded"),
    ]
    if cached:
        rows.append(("compile cache", cached))
    return _kv(rows)


def _group_data(g: Any, steady: dict) -> dict[str, Any]:
    return {
        "identity": g.identity,
        "mode": g.mode,
        "compiles": g.compiles,
        "recompiles": g.recompiles,
        "steady_recompiles": steady.get((g.mode, g.identity), 0),
        "seconds": g.seconds,
        "changing": (
            {"what": g.changing.what, "kind": g.changing.kind, "values": list(g.changing.values),
             "grows": bool(g.changing.grows), "location": _location_data(g.changing.location)}
            if g.changing is not None
            else None
        ),
        "location": _location_data(g.locations[0][0]) if g.locations else None,
    }


@section("Programs compiled", order=20, key="compiles", render=_render_compiles)
def _compiles(session: Any) -> dict[str, Any]:
    ops = session.ops()
    by_mode: dict[str, dict[str, Any]] = {}
    for o in ops:
        m = by_mode.setdefault(o.mode, {"compiles": 0, "seconds": 0.0})
        m["compiles"] += o.compiles
        m["seconds"] += o.compile_seconds
    steady = _steady_recompiles(session) if session.steps() else {}
    return {
        "count": sum(o.compiles for o in ops),
        "seconds": sum(o.compile_seconds for o in ops),
        # programs the persistent compile cache gave back instead of a compile, and the time saved
        "read_back": sum(o.read_back for o in ops),
        "saved_seconds": sum(o.saved_seconds for o in ops),
        "by_mode": by_mode,
        "programs": len(_local_programs(session.programs())),
        "groups": [_group_data(g, steady) for g in session.recompile_groups()],
    }


def _local_programs(programs: list) -> list:
    """The programs that ran here (a run with a TPU target also stores the TPU's HLO as programs)."""
    from tpu_debug.tracers.target import TARGET_MODE

    return [p for p in programs if p.mode != TARGET_MODE]


def _render_programs(programs: list[dict], terminal: bool) -> RenderableType | None:
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
    for p in programs[:10]:
        table.add_row(
            str(p["id"]),
            Text(p["signature"]),
            str(p["count"]),
            format_seconds(p["seconds"]),
            format_seconds(p["compile_seconds"]),
            str(p["instructions"]),
        )
    return Group(table, _note("see a program's HLO with session.hlo(<op or program id>)"))


@section("Heaviest programs", order=30, key="programs", render=_render_programs)
def _programs(session: Any) -> list[dict[str, Any]]:
    return [_plain(p) for p in _local_programs(session.programs())]


def _render_recompiles(d: dict, terminal: bool) -> RenderableType:
    # grouped by op / graph, split into warm-up and steady state; dynamo's side as recorded
    if not d["groups"] and not d["graph_breaks"] and not d["guard_failures"] and not d["limits"]:
        return _note("nothing was compiled twice: every op and graph kept one key")
    parts: list[RenderableType] = []
    if d["groups"]:
        parts += _recompile_table(d, terminal)
    if d["guard_failures"]:
        lines = ["dynamo recompiled (guard failures):"]
        lines += [
            f"  {f['name']}: {f['count']}x, latest: {f['guard']} (called at {_where(f['location'])})"
            for f in d["guard_failures"]
        ]
        parts.append(Text("\n".join(lines)))
    if d["graph_breaks"]:
        lines = ["graph breaks:"]
        lines += [f"  {b['name']} at {_where(b['location'])} ({b['count']}x): {b['reason']}" for b in d["graph_breaks"]]
        parts.append(Text("\n".join(lines)))
    parts += [
        Text(
            f"recompile limit: {hit['name']} at {_where(hit['location'])}, {hit['limit_type']} {hit['limit']}, "
            f"last failed guard: {hit['reason']}"
        )
        for hit in d["limits"]
    ]
    return Group(*parts)


def _recompile_table(d: dict, terminal: bool) -> list[RenderableType]:
    """The headline and one row per recompiled op or graph, with its recompiles in steady state."""
    groups = d["groups"]
    head = (
        f"{d['count']} recompile(s) of {len(groups)} op(s)/graph(s), "
        f"{format_seconds(d['seconds'])} compiling them; {d['steady']} in steady state"
    )
    if d["count"] > d["steady"]:
        head += f", {d['count'] - d['steady']} while warming up (an op compiled for each shape it meets)"
    table = _table(
        terminal,
        ("op / graph", "left"),
        ("compiles", "right"),
        ("recompiles", "right"),
        ("steady", "right"),
        ("what changed: values", "left"),
        ("at", "left"),
    )
    for g in groups[:12]:
        ch = g["changing"]
        values = ", ".join(ch["values"][:6]) + (", ..." if len(ch["values"]) > 6 else "") if ch else ""
        grows = " (grows)" if ch is not None and ch["grows"] else ""
        where = ch["location"] if ch is not None and ch["location"] is not None else g["location"]
        table.add_row(
            Text(g["identity"]),
            str(g["compiles"]),
            str(g["recompiles"]),
            str(g["steady_recompiles"]),
            Text(f"{ch['what']}{grows}: {values}" if ch else "-"),
            Text(_where(where)),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(groups) > 12:
        parts.append(_note(f"... and {len(groups) - 12} more"))
    parts.append(_note("steady: recompiles in steady-state steps (see Steps); the Findings say which to fix and how"))
    return parts


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


def _guard_failures_data(failures: list) -> list[dict[str, Any]]:
    """Dynamo's recompiles by function, most frequent first, with the latest failed guard."""
    by_fn: dict[str, list] = {}
    for f in failures:
        by_fn.setdefault(f.name, []).append(f)
    out = []
    for name, items in sorted(by_fn.items(), key=lambda kv: -len(kv[1])):
        latest = items[-1]
        guard = latest.guards[0].split(": ", 1)[-1] if latest.guards else "?"
        out.append({"name": name, "count": len(items), "guard": guard, "location": _location_data(latest.location)})
    return out


def _graph_breaks_data(breaks: list) -> list[dict[str, Any]]:
    """Graph breaks by site (function, line, reason), most frequent first."""
    sites: dict[tuple, list] = {}
    for b in breaks:
        sites.setdefault((b.name, b.location, b.reason), []).append(b)
    return [
        {"name": name, "location": _location_data(loc), "reason": reason, "count": len(items)}
        for (name, loc, reason), items in sorted(sites.items(), key=lambda kv: -len(kv[1]))
    ]


@section("Recompiles", order=40, key="recompiles", render=_render_recompiles)
def _recompiles(session: Any) -> dict[str, Any]:
    groups = [g for g in session.recompile_groups() if g.recompiles]
    steady = _steady_recompiles(session) if groups else {}
    ranked = sorted(groups, key=lambda g: (-steady.get((g.mode, g.identity), 0), -g.recompiles, g.identity))
    return {
        "count": sum(g.recompiles for g in groups),
        "steady": sum(steady.values()),
        "seconds": sum(g.seconds for g in groups),
        "groups": [_group_data(g, steady) for g in ranked],
        "guard_failures": _guard_failures_data(session.guard_failures()),
        "graph_breaks": _graph_breaks_data(session.graph_breaks()),
        "limits": [
            {"name": hit.name, "location": _location_data(hit.location), "limit_type": hit.limit_type,
             "limit": hit.limit, "reason": hit.reason}
            for hit in session.recompile_limits()
        ],
    }


def _render_transfers(d: dict, terminal: bool) -> RenderableType:
    # the ledger by call site, implicit (syncs) first; which of them to fix is the Findings'
    from tpu_debug.tracers.transfers import CAUSE_TEXT

    if d.get("imported"):
        return _note(f"transfers: {NOT_MEASURED}")
    if not d["count"]:
        return _note("no host <-> device transfers recorded")
    head = (
        f"{d['count']} transfer(s), {format_bytes(d['bytes'])}, "
        f"{format_seconds(d['seconds'])}: {d['implicit']} implicit (syncs nobody asked for), "
        f"{d['count'] - d['implicit']} explicit"
    )
    sites = d["sites"]
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
            Text(_site_text(s["location"])),
            Text(CAUSE_TEXT.get(s["cause"], s["cause"])),
            s["direction"],
            "implicit" if s["implicit"] else "explicit",
            str(s["count"]),
            format_bytes(s["bytes"]),
            format_seconds(s["seconds"]),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(sites) > 15:
        parts.append(_note(f"... and {len(sites) - 15} more call sites"))
    return Group(*parts)


@section("Transfers", order=50, key="transfers", render=_render_transfers)
def _transfers(session: Any) -> dict[str, Any]:
    if _imported(session):
        return {"imported": True, "count": None, "bytes": None, "seconds": None, "implicit": None, "sites": []}
    transfers = session.transfers()
    return {
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
    }


def _render_collectives(d: dict | None, terminal: bool) -> RenderableType | None:
    # programs over several devices: what XLA inserted to move data between them, and
    # what one device holds for each program; then the same for a TPU target, if any
    if d is None:
        return None
    parts: list[RenderableType] = []
    for block in ([d["local"]] if d["local"] is not None else []) + d["targets"]:
        parts += _collective_programs(block, terminal)
    parts.append(_note(
        "sent = bytes each device sends per run of the program (ring-algorithm estimate: an all-reduce of "
        "S bytes over n devices sends 2(n-1)/n S); memory = per device: arguments + outputs + temporaries"
    ))
    return Group(*parts)


def _collective_programs(block: dict, terminal: bool) -> list[RenderableType]:
    programs, target = block["programs"], block["target"]
    kinds = ", ".join(f"{n['count']} {k} ({format_bytes(n['bytes'])})" for k, n in sorted(block["by_opcode"].items()))
    where = f"on {target} (XLA's TPU compiler)" if target else "on this run's devices"
    head = (
        f"{len(programs)} program(s) over {block['devices']} devices {where}: {block['collectives']} "
        f"collective(s){': ' + kinds if kinds else ''}"
    )
    if block["peak_memory"] is not None:
        head += f"; largest per-device memory {format_bytes(block['peak_memory'])}"
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
    for e in programs[:10]:
        runs = e["runs"]
        table.add_row(
            Text(e["name"] + (f" ({e['error']})" if e["error"] else "")),
            str(e["devices"]) if e["devices"] else "-",
            format_bytes(e["memory_bytes"]) if e["memory_bytes"] is not None else "-",
            str(len(e["collectives"])),
            format_bytes(e["collective_bytes"]),
            str(runs) if runs is not None else "-",
            format_bytes(e["collective_bytes"] * runs) if runs is not None else "-",
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(programs) > 10:
        parts.append(_note(f"... and {len(programs) - 10} more programs"))
    detail = _table(
        terminal, ("collective", "left"), ("groups x devices", "right"), ("sent/run", "right"), ("from", "left"),
        ("at", "left"),
    )
    for e in programs[:3]:
        for c in e["collectives"][:8]:
            detail.add_row(
                Text(f"{c['opcode']} {c['shape']}"),
                f"{c['groups']}x{c['group_size']}",
                format_bytes(c["wire_bytes"]),
                Text(f"{e['name']}: {c['node'] or c['op'] or '-'}"),
                Text(f"{os.path.basename(c['file'])}:{c['line']}" if c["file"] else "-"),
            )
    if detail.row_count:
        parts.append(detail)
    return parts


def _collectives_block(session: Any, events: list, target: str | None) -> dict[str, Any]:
    from tpu_debug.tracers.collectives import collective_totals, program_calls

    totals = collective_totals(events)
    calls = program_calls(session, events) if not target else {}
    return {
        "target": target,
        "devices": totals.devices,
        "collectives": totals.collectives,
        "wire_bytes": totals.wire_bytes,
        "by_opcode": {k: {"count": n, "bytes": b} for k, (n, b) in totals.by_opcode.items()},
        "peak_memory": totals.peak_memory,
        "programs": [
            {
                "name": e.name,
                "program": e.program,
                "error": e.error,
                "devices": e.devices,
                "memory_bytes": e.memory_bytes,
                "collective_bytes": e.collective_bytes,
                "runs": calls.get(e.id),
                "collectives": [_plain(c) for c in e.collectives],
            }
            for e in events
        ],
    }


@section("Collectives", order=55, key="collectives", render=_render_collectives)
def _collectives(session: Any) -> dict[str, Any] | None:
    from tpu_debug.tracers.collectives import program_collectives

    local = program_collectives(session)
    targets = [e for e in program_collectives(session, target=None) if e.target]
    if not local and not targets:
        return None
    return {
        "local": _collectives_block(session, local, None) if local else None,
        "targets": [
            _collectives_block(session, [e for e in targets if e.target == t], t)
            for t in sorted({e.target for e in targets})
        ],
    }


def _cut_data(c: Any) -> dict[str, Any]:
    return {
        "trigger": c.trigger,
        "text": c.text,
        "location": _location_data(c.location),
        "count": c.count,
        "compiled": c.compiled,
        "ops": c.ops,
        "seconds": c.seconds,
        "steps": c.steps,
    }


def _render_lazy_graphs(d: dict | None, terminal: bool) -> RenderableType | None:
    # lazy mode (DEFER_AND_FUSE): how many graphs ran per optimizer step, and what cut them
    if d is None:
        return None
    head = (
        f"{d['graphs']} graph(s) run as {d['programs']} program(s), {d['compiles']} compiled in this run, "
        f"{d['ops']:.0f} ops each on average"
    )
    if d["empty"]:
        head += f"; {d['empty']} time(s) nothing pending was still referenced and nothing ran"
    parts: list[RenderableType] = [Text(head)]
    if d["steps"]:
        line = f"{d['steps']} optimizer step(s): {d['graphs_per_step']:g} graph(s) per step (median)"
        if d["split_steps"]:
            line += f"; {d['split_steps']} step(s) run as more than one graph"
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
    for c in d["cuts"][:15]:
        table.add_row(
            Text(_site_text(c["location"])), Text(c["text"]), str(c["count"]), str(c["compiled"]),
            f"{c['ops']:.0f}", format_seconds(c["seconds"]),
        )
    parts.append(table)
    if len(d["cuts"]) > 15:
        parts.append(_note(f"... and {len(d['cuts']) - 15} more cut sites"))
    parts += [
        Text(
            f"{_site_text(c['location'])}: {c['text']} cut the graph inside {c['steps']} step(s): each cut runs "
            "what was recorded so far as a program of its own and waits for it; move the read after "
            "optimizer.step() (or read every N steps) so a step is one program"
        )
        for c in d["extra_cuts"][:3]
    ]
    return Group(*parts)


@section("Lazy graphs", order=57, key="lazy_graphs", render=_render_lazy_graphs)
def _lazy_graphs(session: Any) -> dict[str, Any] | None:
    from tpu_debug.tracers.lazy_graphs import summarize

    events = session.events("materialize")
    if not events:
        return None
    lazy = summarize(events)
    return {
        "graphs": lazy.graphs,
        "empty": lazy.empty,
        "programs": lazy.programs,
        "compiles": lazy.compiles,
        "ops": lazy.ops,
        "steps": lazy.steps,
        "per_step": list(lazy.per_step),
        "graphs_per_step": lazy.graphs_per_step,
        "split_steps": lazy.split_steps,
        "cuts": [_cut_data(c) for c in lazy.cuts],
        "extra_cuts": [_cut_data(c) for c in lazy.extra_cuts],
    }


def _divergence_rows(d: dict) -> list[tuple[str, str]]:
    """What was compared, under which numerics and tolerances, and what stood out."""
    compared = f"{d['ops_compared']} eager ops"
    if d["ops_copied"]:
        compared += f" (+{d['ops_copied']} not compared: random ops, data loaded from the host)"
    if d["graphs_compared"]:
        compared += f", {d['graphs_compared']} graph runs / {d['nodes_compared']} nodes"
    numerics = d["numerics"]
    if numerics != "cpu":
        numerics += f", float32 product precision {d['precision']!r}"
    rows = [("compared", compared), ("numerics", numerics), ("tolerances", str(d["tolerances"]))]
    first, drifted, origin = d["first"], d["drift"], d["nan_origin"]
    if first is not None:
        rows.append(("first", _divergence_line(first)))
        if first["triage"]:
            rows.append(("verdict", first["triage"]))
    elif d["over_tolerance"] and d["sample"] > 1:
        hint = (
            "no sampled node is over tolerance itself, but results drift (below): "
            "run with divergence_sample=1 (--divergence-sample 1) to name the node"
        )
        rows.append(("first", hint))
    else:
        rows.append(("first", "every op compared is within tolerance of PyTorch on CPU (local measure)"))
    if drifted is not None:
        # the first drift's cause: a wrong op before it, or noise (through a zero crossing)
        rows.append(("drift", (f"{drifted['site']} at {_full_where(drifted['location'])} ({drifted['phase']}): "
                              f"{drifted['triage']}")))
    if d.get("fused") is not None:
        rows.append(("fused", ("the compiled program's outputs leave tolerance; first node that drifts in the "
                               f"fused program: {_divergence_line(d['fused'])}")))
    if origin is not None:
        rows.append(("NaN/Inf from", (f"{origin['site']} at {_full_where(origin['location'])} "
                                     "(made them from finite inputs)")))
    if d["not_compared"]:
        rows.append(("not compared", ", ".join(d["not_compared"]) + " (no CPU kernel for these calls)"))
    return rows


def _render_divergence(d: dict | None, terminal: bool) -> RenderableType:
    # what was compared and the first op over tolerance, then the sites ranked
    if d is None:
        return _note("numerical divergence against CPU was not checked in this run (trace with divergence=True, or --divergence)")
    parts: list[RenderableType] = [_kv(_divergence_rows(d))]
    if d["sites"]:
        parts += _divergence_sites(d["sites"], terminal)
    return Group(*parts)


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


def _divergence_sites(sites: list[dict], terminal: bool) -> list[RenderableType]:
    """The ten worst local sites and five worst drift sites, with a legend."""
    local = [s for s in sites if s["measure"] == "local"]
    drift = [s for s in sites if s["measure"] != "local"]
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
    for s in shown:
        mark = ">> " if s["first"] else ("NaN " if s["nan_origin"] else "")
        table.add_row(
            Text(mark + s["site"], style="bold" if s["first"] and terminal else ""),
            Text(_where(s["location"])),
            s["measure"] + (" bwd" if s["phase"] == "backward" else ""),
            str(s["count"]),
            _g(s["max_abs"]),
            _g(s["ratio"]),
            s["verdict"] or "-",
            "vanishes" if s["highest"] else ("remains" if s["highest"] is False else "-"),
        )
    parts: list[RenderableType] = [table]
    hidden = len(sites) - len(shown)
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
    return "noise" if verdicts else ""


def _g(value: float | None) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.2g}"


def _site_name(e: Any) -> str:
    if e.mode == "compiled":
        return f"{e.name} ({e.target}, {e.graph})"
    return e.name + (f" ({e.autograd_node})" if e.autograd_node else "")


def _divergence_line(e: dict) -> str:
    text = (
        f"{e['site']} at {_full_where(e['location'])} ({e['mode']}, {e['phase']}): max abs {_g(e['max_abs'])}, "
        f"max rel {_g(e['max_rel'])}"
    )
    if e["ulp"] is not None:
        text += f", {_g(e['ulp'])} ULP ({e['dtype']})"
    text += f", {e['mismatched']}/{e['numel']} elements over tolerance (rtol {e['rtol']:g}, atol {e['atol']:g})"
    if e["dtype_mismatch"]:
        text += f"; dtype {e['device_dtype']} on tpu, {e['dtype']} on CPU"
    if e["highest"] is True:
        text += "; within tolerance at precision 'highest': a bfloat16-precision effect (torch.tpu.precision.set('highest') removes it)"
    elif e["highest"] is False:
        text += "; still over tolerance at precision 'highest': not a matmul-precision effect"
    return text


def _divergence_event_data(e: Any) -> dict[str, Any]:
    fields = ("name", "mode", "measure", "phase", "graph", "target", "autograd_node", "max_abs", "max_rel", "ulp",
              "ratio", "mismatched", "numel", "dtype", "device_dtype", "dtype_mismatch", "rtol", "atol", "highest",
              "verdict", "nan_origin", "first", "over")
    data = {f: getattr(e, f) for f in fields}
    data.update(site=_site_name(e), location=_location_data(e.location), triage=e.triage_text(),
                crossings=len(e.crossings))
    return data


def _divergence_site_data(key: tuple, items: list, counts: dict) -> dict[str, Any]:
    worst = max(items, key=lambda e: (e.ratio, e.max_abs))
    return {
        "site": _site_name(worst),
        "mode": worst.mode,
        "measure": worst.measure,
        "phase": worst.phase,
        "location": _location_data(worst.location),
        "count": counts.get(key, len(items)),
        "max_abs": worst.max_abs,
        "ratio": worst.ratio,
        "verdict": _verdict_cell(items),
        "highest": next((e.highest for e in items if e.highest is not None), None),
        "first": any(_is_first(e) for e in items),
        "nan_origin": any(e.nan_origin for e in items),
    }


@section("Divergence", order=60, key="divergence", render=_render_divergence)
def _divergence(session: Any) -> dict[str, Any] | None:
    summary = session.divergence_summary()
    events = session.divergences()
    if summary is None and not events:
        return None
    if summary is None:  # the trace ended before the tracer wrote its summary
        from tpu_debug.tracers.events import DivergenceSummaryEvent

        summary = DivergenceSummaryEvent(
            0, 0.0, None, 0, None, numerics="cpu", precision="?", tolerances="default", sample=1,
            ops_compared=0, ops_copied=0, graphs_compared=0, nodes_compared=0, over_local=0, over_drift=0,
            nan_origins=0,
        )
    first = next((e for e in events if _is_first(e)), None)
    drifted = next((e for e in events if e.measure == "drift" and e.over and e.triage_text()), None)
    if drifted is not None and not (first is None or drifted.verdict != first.verdict or drifted.crossings):
        drifted = None  # the same verdict as the first op's says nothing new
    origin = next((e for e in events if e.nan_origin), None)
    fused = next((e for e in events if e.measure == "fused" and e.first), None)
    sites: dict[tuple, list] = {}
    for e in events:
        sites.setdefault(_site_key(e), []).append(e)
    # the summary counts every divergence of a site; the events kept may be fewer
    counts = {(s.mode, s.measure, s.phase, s.graph, s.name, s.file, s.line): s.count for s in summary.sites}
    return {
        "checked": True,
        "ops_compared": summary.ops_compared,
        "ops_copied": summary.ops_copied,
        "graphs_compared": summary.graphs_compared,
        "nodes_compared": summary.nodes_compared,
        "numerics": summary.numerics,
        "precision": summary.precision,
        "tolerances": summary.tolerances,
        "sample": summary.sample,
        "not_compared": sorted(u.op for u in summary.not_compared),
        "over_tolerance": any(e.over for e in events),
        "first": _divergence_event_data(first) if first is not None else None,
        "drift": _divergence_event_data(drifted) if drifted is not None else None,
        "fused": _divergence_event_data(fused) if fused is not None else None,
        "nan_origin": _divergence_event_data(origin) if origin is not None else None,
        "sites": [_divergence_site_data(k, items, counts) for k, items in _rank_sites(sites)],
    }


def _memory_rows(m: dict) -> list[tuple[str, str]]:
    from tpu_debug.tracers.memory import size

    rows = [("peak", (f"{size(m['peak_bytes'])} held by tpu tensors, in step {m['peak_step']} of {m['steps']} "
                     f"({size(m['persistent_bytes'])} still held at that step's end, "
                     f"{size(m['activation_bytes'])} of the forward's tensors gone by then)"))]
    if m["temp_bytes"]:
        whose = "the TPU compiler's figure" if m["temp_source"] == "target" else "this machine's compiler's figure"
        rows.append(("largest program", f"{m['temp_program']}: {size(m['temp_bytes'])} of temporaries ({whose})"))
    if m["target"] is not None:
        verdict = "fits" if m["fits"] else "does NOT fit"
        rows.append(("need", (f"~{size(m['required_bytes'])} per device ({m['need']}) of "
                             f"{size(m['capacity_bytes'])} on one {m['target']} device: {verdict} (an estimate)")))
    if m["dry_run"]:
        dry = f"nothing executed; {m['programs']} program(s) compiled for {m['target']}, {m['oom_programs']} out of HBM"
        rows.append(("dry run", dry))
    if m["stopped"]:
        where = f" at {_site_text(m['location'])}" if m["location"] is not None else ""
        rows.append(("stopped", f"the dry run needs a value{where} ({m['stopped']}); what ran before it is measured"))
    return rows


def _holder_where(h: dict) -> str:
    return f"{os.path.basename(h['file'])}:{h['line']} in {h['function']}" if h["file"] else "before the trace"


def _memory_finding(f: dict, terminal: bool) -> Group:
    from tpu_debug.tracers.memory import size

    if f["finding"] == "program_oom":
        head = (f"the TPU compiler refused {f['program']} on {f['target']}: it counted {size(f['required_bytes'])} "
                f"of {size(f['capacity_bytes'])} HBM")
    else:
        head = (f"does not fit one {f['target']} device: ~{size(f['required_bytes'])} needed, "
                f"{size(f['capacity_bytes'])} there")
    if f["holders"]:
        head += "; biggest holders: " + ", ".join(
            f"{os.path.basename(h['file']) + ':' + str(h['line']) if h['file'] else 'before the trace'} "
            f"({size(h['nbytes'])})" for h in f["holders"])
    lines = [Text(head, style="bold red" if terminal else "")]
    lines += [Text(f"  fix: {fix['text']}" + ("" if fix["fits"] else " - not enough alone")) for fix in f["fixes"]]
    return Group(*lines)


def _render_memory(d: dict | None, terminal: bool) -> RenderableType | None:
    # device bytes over the run, the peak's holders, and the fit against the TPU target
    from tpu_debug.tracers.memory import PHASE_TEXT, size

    if d is None:
        return None
    parts: list[RenderableType] = []
    rows = _memory_rows(d["summary"]) if d["summary"] is not None else []
    steps = d["steps"]
    if len(steps) > 1:
        top = max(st["peak_bytes"] for st in steps) or 1
        shown = steps[-60:]
        bars = "".join(" ▁▂▃▄▅▆▇█"[max(1, round(8 * st["peak_bytes"] / top))] if st["peak_bytes"] else " "
                       for st in shown)
        rows.append(("peak per step", f"{bars}  (steps {shown[0]['step']}-{shown[-1]['step']})"))
    if rows:
        parts.append(_kv(rows))
    if d["holders"]:
        table = _table(terminal, ("held at the peak by", "left"), ("phase", "left"), ("bytes", "right"),
                       ("tensors", "right"), ("largest", "left"))
        for h in d["holders"]:
            table.add_row(Text(_holder_where(h)), Text(PHASE_TEXT.get(h["phase"], h["phase"])), size(h["nbytes"]),
                          str(h["tensors"]), Text(f"{h['dtype']}{list(h['shape'])}" if h["shape"] else "-"))
        parts.append(table)
    parts += [_memory_finding(f, terminal) for f in d["findings"]]
    if d["summary"] is None:
        parts.append(_note("the run has not ended: the peak and the fit are written when it does"))
    return Group(*parts) if parts else None


_EVENT_HEADER = ("id", "ts", "mode", "thread")


@section("Memory", order=65, key="memory", render=_render_memory)
def _memory(session: Any) -> dict[str, Any] | None:
    from tpu_debug.tracers.memory import describe_fix, memory_view, need_text

    view = memory_view(session)
    if not view.recorded:
        return None
    summary = _plain(view.summary, _EVENT_HEADER + ("holders",)) if view.summary is not None else None
    if summary is not None:
        summary["need"] = need_text(view.summary)
    findings = []
    for f in view.findings:
        found = _plain(f, _EVENT_HEADER + ("location", "fixes"))
        found["fixes"] = [dict(_plain(fix), text=describe_fix(fix)) for fix in f.fixes]
        findings.append(found)
    return {
        "summary": summary,
        "steps": [{"step": st.step, "peak_bytes": st.peak_bytes} for st in view.steps],
        "holders": _plain(list(view.peak_holders())),
        "findings": findings,
    }


def _render_fallbacks(fallbacks: list[dict], terminal: bool) -> RenderableType | None:
    if not fallbacks:
        return None
    table = _table(terminal, ("op", "left"), ("count", "right"), ("time", "right"), ("first at", "left"))
    for f in fallbacks:
        table.add_row(Text(f["name"]), str(f["count"]), format_seconds(f["seconds"]), Text(_full_where(f["location"])))
    return table


@section("CPU fallbacks", order=70, key="fallbacks", render=_render_fallbacks)
def _fallbacks(session: Any) -> list[dict[str, Any]]:
    counts: dict[str, list] = {}
    for f in session.fallbacks():
        counts.setdefault(f.name, []).append(f)
    return [
        {"name": name, "count": len(items), "seconds": sum(f.seconds for f in items),
         "location": _location_data(items[0].location)}
        for name, items in sorted(counts.items(), key=lambda kv: -len(kv[1]))
    ]


def _render_float64(ops: list[dict], terminal: bool) -> RenderableType | None:
    # float64 runs on this backend; a TPU has none, so these ops would not run there
    if not ops:
        return None
    table = _table(terminal, ("op or graph", "left"), ("programs", "right"), ("executions", "right"))
    for o in ops:
        table.add_row(Text(o["name"]), str(o["programs"]), str(o["executions"]))
    return Group(_note(f"{len(ops)} op(s) ran with float64/complex128 values (see Findings)"), table)


@section("float64", order=75, key="float64", render=_render_float64)
def _float64(session: Any) -> list[dict[str, Any]]:
    ops = session.float64_ops()
    return [
        {"name": name, "programs": programs, "executions": runs}
        for name, (programs, runs) in sorted(ops.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def _target_heading(d: dict) -> str:
    return f"TPU target ({d['target']})" if d["target"] else "TPU target"


def _target_rows(d: dict) -> list[tuple[str, str]]:
    summary, programs, rows = d["summary"], d["programs"], []
    if summary is not None:
        rows.append((
            "target",
            (f"{summary['target']} ({summary['topology']}, {summary['chips']} chip(s)); per device "
            f"{format_bytes(summary['hbm_bytes'])} HBM, {summary['peak_flops'] / 1e12:.0f} TFLOP/s bf16, "
            f"{summary['hbm_bandwidth'] / 1e9:.0f} GB/s; libtpu {summary['libtpu']}"),
        ))
        ooms = sum(1 for c in programs if not c["ok"] and c["status"] == "hbm_oom")
        line = f"{summary['programs']} distinct, {summary['compiled']} compiled ({summary['cached']} from the cache)"
        if summary["refused"]:
            line += f", {summary['refused']} refused ({ooms} out of HBM)"
        if summary["failed"]:
            line += f", {summary['failed']} failed (see Tracer errors)"
        rows.append(("programs", line))
        if summary["unfinished"]:
            rows.append((
                "not finished",
                (f"{summary['unfinished']} program(s) still compiling when the trace stopped waiting "
                f"({format_seconds(summary['waited_seconds'])}, target_wait={summary['wait_limit']:g}): no "
                "estimate for them; raise target_wait (--target-wait, TPU_DEBUG_TARGET_WAIT) to wait longer"),
            ))
        rows.append(("compile time", f"{format_seconds(summary['compile_seconds'])} of TPU compiles, beside the program"))
    levels = d.get("optimization_levels") or []
    if levels:
        rows.append((
            "effort",
            (f"compiled at XLA's {', '.join(levels)}, the dry run's effort level (fast to compile; FLOP, "
             "argument and output bytes as at the default level; temporaries and bytes accessed, and so "
             "est. times, are those of the program at this level: trace with --target and no --dry-run "
             "for the default's)"),
        ))
    step = d["step"]
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
    largest = max((c for c in programs if c["memory_bytes"] is not None), key=lambda c: c["memory_bytes"], default=None)
    if largest is not None and summary is not None:
        rows.append((
            "memory",
            (f"largest program {format_bytes(largest['memory_bytes'])} of {format_bytes(summary['hbm_bytes'])} "
            f"per device ({largest['name']})"),
        ))
    return rows


def _render_target(d: dict | None, terminal: bool) -> RenderableType | None:
    # each program compiled for a real TPU: memory, cost, roofline, padding; steps; findings
    if d is None:
        return None
    parts: list[RenderableType] = [_kv(_target_rows(d))]
    if d["programs"]:
        parts += _target_programs(d["programs"], terminal)
    found = d["findings"]
    if found:
        parts.append(Text("findings:"))
        parts += [Text(f"  {f['kind']}: {f['text']}") for f in found[:8]]
        if len(found) > 8:
            parts.append(_note(f"... and {len(found) - 8} more findings"))
    parts.append(_note(
        "est. = a model estimate, not a measurement: max(flops / peak, bytes / HBM bandwidth) per program, "
        "with the target's published peaks and the TPU compiler's counts, per device; a step adds its "
        "programs back to back, without host dispatch. TPU HLO: session.hlo(<id>)"
    ))
    return Group(*parts)


def _si(value: float | None) -> str:
    """``3.28M``: three significant digits and a decimal prefix."""
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}"
    return f"{value:.3g}"


def _target_programs(ranked: list[dict], terminal: bool) -> list[RenderableType]:
    """Programs by estimated time over the run (estimate x runs here), refused ones first."""
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
        hlo = str(c["hlo"]) if c["hlo"] is not None else "-"
        if not c["ok"]:
            need = f"needs {format_bytes(c['required_bytes'])}" if c["required_bytes"] is not None else "-"
            table.add_row(Text(c["signature"]), Text(need), "-", "-", "-",
                          Text("OOM" if c["status"] == "hbm_oom" else "refused"), "-", "-", hlo)
            continue
        padding = "-"
        if c["padding_padded_bytes"]:
            padding = f"{100 * c['padding_wasted_bytes'] / c['padding_padded_bytes']:.0f}%"
        table.add_row(
            Text(c["signature"]),
            format_bytes(c["memory_bytes"]) if c["memory_bytes"] is not None else "-",
            _si(c["flops"]),
            _si(c["bytes_accessed"]),
            f"{c['intensity']:.2g}" if c["intensity"] is not None else "-",
            c["bound"] or "-",
            format_seconds(c["estimated_seconds"]),
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


def _target_compile_data(c: Any, runs: dict, ids: dict) -> dict[str, Any]:
    data = _plain(c, _EVENT_HEADER)
    data.update(
        location=_location_data(c.location), ok=c.ok, memory_bytes=c.memory_bytes,
        padding_wasted_bytes=c.padding_wasted_bytes, runs=runs.get(c.program) if c.program else None,
        hlo=ids.get(c.tpu_program),
    )
    return data


@section("TPU target", order=67, key="target", render=_render_target, heading=_target_heading)
def _target(session: Any) -> dict[str, Any] | None:
    from tpu_debug.tracers.target import findings, step_summary

    summaries = session.events("target_summary")
    compiles = session.events("target_compile")
    if not summaries and not compiles:
        return None
    summary = summaries[-1] if summaries else None
    programs = session.programs()
    runs = {p.hash: p.count for p in programs if p.count}
    ids = {p.hash: p.id for p in programs}

    def weight(c: Any) -> tuple:
        n = runs.get(c.program, 1) if c.program else 1
        return (c.ok, -(c.estimated_seconds or 0.0) * n, -(c.memory_bytes or 0))

    return {
        "target": summary.target if summary is not None else compiles[0].target,
        "summary": _plain(summary, _EVENT_HEADER + ("location",)) if summary is not None else None,
        "step": step_summary(session.events("target_step")),
        "programs": [_target_compile_data(c, runs, ids) for c in sorted(compiles, key=weight)],
        "optimization_levels": sorted({c.optimization_level for c in compiles if c.optimization_level}),
        "findings": [
            {"kind": f.kind, "subject": f.subject, "programs": list(f.programs), "fix": f.fix, "cost": f.cost,
             "text": f.render()}
            for f in findings(compiles)
        ],
    }


def _render_tensorboard(tb: dict | None, terminal: bool) -> RenderableType | None:
    # where the profile is, how much it holds, and whether the cap cut it short
    if tb is None:
        return None
    rows = [("directory", tb["directory"])]
    rows.append(("profile", ", ".join(tb["profile"]) if tb["profile"] else "none written"))
    spans = f"{tb['spans']} spans (max {tb['max_events'] if tb['max_events'] is not None else '-'}), {tb['steps']} step mark(s)"
    if tb["capped"]:
        spans += f"; CAPPED after {tb['capped_after_seconds']:.2f} s, {tb['dropped_spans']} spans dropped"
    rows.append(("captured", spans))
    rows.append(("open with", tb["open_with"]))
    return Group(_kv(rows), *[_note(n) for n in tb["notes"]])


@section("TensorBoard", order=85, key="tensorboard", render=_render_tensorboard)
def _tensorboard(session: Any) -> dict[str, Any] | None:
    tb = session.tensorboard_summary()
    if tb is None:
        return None
    return {
        "directory": str(session.run_dir / "tensorboard"),
        "profile": list(tb.profile),
        "spans": tb.spans,
        "max_events": tb.max_events,
        "steps": tb.steps,
        "capped": tb.capped,
        "capped_after_seconds": tb.capped_after_seconds,
        "dropped_spans": tb.dropped_spans,
        "notes": list(tb.notes),
        "open_with": f"tpu-debug tensorboard {session.run_dir.name}",
    }


def _render_errors(d: dict, terminal: bool) -> RenderableType | None:
    notes: list[RenderableType] = []
    if d["recording_error"]:
        notes.append(_note(f"recording stopped early: {d['recording_error']}"))
    if d["dropped_events"]:
        notes.append(_note(f"{d['dropped_events']:,} events were not recorded (the run writer could not keep up or had stopped)"))
    if d["errors"]:
        table = _table(terminal, ("where", "left"), ("count", "right"), ("first error", "left"))
        for e in d["errors"][:10]:
            table.add_row(Text(e["where"]), f"{e['count']:,}", Text(e["first"]))
        notes += [_note(f"{d['count']:,} tracer error(s); the program was not affected"), table]
    return Group(*notes) if notes else None


@section("Tracer errors", order=90, key="tracer_errors", render=_render_errors)
def _errors(session: Any) -> dict[str, Any]:
    meta = session.metadata()
    # the run keeps the first errors of each kind; the meta counts them all
    capped = session.capped_counts("internal_error")
    total: dict[str, int] = {}
    first: dict[str, str] = {}
    for e in session.internal_errors():
        total[e.where] = capped.get(e.where, total.get(e.where, 0) + 1)
        first.setdefault(e.where, e.message)
    return {
        "recording_error": meta.recording_error,
        "dropped_events": meta.dropped_events,
        "count": sum(total.values()),
        "errors": [{"where": w, "count": total[w], "first": message} for w, message in first.items()],
    }



_VERDICTS = {True: "fits", False: "does not fit", None: "refused"}


def _fit_data(e: Any) -> dict[str, Any]:
    compiler = None if e.total_bytes is None else {
        "arguments": e.argument_bytes, "outputs": e.output_bytes, "aliased": e.alias_bytes,
        "temporaries": e.temp_bytes, "code": e.code_bytes, "total": e.total_bytes,
    }
    breakdown = None if e.total_bytes is None else {
        "parameters": e.parameter_bytes, "optimizer_state": e.optimizer_bytes, "batch": e.batch_bytes,
        "gradients": e.gradient_bytes, "activations": e.activation_bytes, "kv_cache": e.kv_cache_bytes,
    }
    estimate = None if e.step_seconds is None else {
        k: getattr(e, k) for k in ("compute_seconds", "memory_seconds", "comm_seconds", "step_seconds",
                                   "overlapped_seconds", "tokens_per_second", "model_flops", "mfu",
                                   "mfu_overlapped")
    }
    return {
        "model": e.model, "target": e.target, "chips": e.chips, "device_kind": e.device_kind, "plan": e.plan,
        "job": e.job, "batch": e.batch, "seq": e.seq, "parameters": e.parameters, "fits": e.fits,
        "verdict": _VERDICTS[e.fits],
        "per_chip": {"required": e.required_bytes, "capacity": e.capacity_bytes,
                     "capacity_source": e.capacity_source, "headroom": e.headroom_bytes,
                     "compiler": compiler, "breakdown": breakdown},
        "collectives": [_plain(c) for c in e.collectives],
        "estimate": estimate, "assumptions": list(e.assumptions), "unsharded": list(e.unsharded),
        "caveats": list(e.caveats), "error": e.error, "extrapolation": e.extrapolation,
        "method": e.method, "candidate_of": getattr(e, "candidate_of", None),
        "seconds": e.seconds, "compile_seconds": e.compile_seconds, "location": _location_data(e.location),
    }


def _render_one_fit(f: dict, terminal: bool) -> list[RenderableType]:
    m = f["per_chip"]
    head = (f"{f['model']} ({f['parameters'] / 1e9:.3g} B parameters), {f['job']}, batch {f['batch']} x seq "
            f"{f['seq']} on {f['target']} ({f['chips']} x {f['device_kind']}), plan {f['plan']}: "
            f"{f['verdict'].upper()}")
    if f.get("candidate_of"):
        head = f"candidate of the search for the {f['candidate_of']}: {head}"
    rows = [("per chip", "-" if m["required"] is None else
             f"needs {format_bytes(m['required'])} of {format_bytes(m['capacity'])} usable "
             f"({m['capacity_source']}); " + (f"{format_bytes(m['headroom'])} to spare" if m["headroom"] >= 0
                                            else f"{format_bytes(-m['headroom'])} short"))]
    if m["breakdown"] is not None:
        rows.append(("breakdown", ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}"
                                            for k, v in m["breakdown"].items() if v is not None)))
    e = f["estimate"]
    if e is not None:
        rows.append(("estimate", f"step ~{format_seconds(e['step_seconds'])} (compute "
                     f"{format_seconds(e['compute_seconds'])}, memory {format_seconds(e['memory_seconds'])}, "
                     f"communication {format_seconds(e['comm_seconds'])}), ~{e['tokens_per_second']:,.0f} "
                     f"tokens/s, MFU ~{e['mfu']:.1%} (not measured)"))
    if f["error"] and not f["fits"]:
        rows.append(("compiler", f["error"]))
    parts: list[RenderableType] = [Text(head, style="bold" if terminal else ""), _kv(rows)]
    if f["collectives"]:
        table = _table(terminal, ("collective", "left"), ("count", "right"), ("data/chip", "right"),
                       ("wire/chip", "right"), ("ICI time~", "right"))
        for c in f["collectives"]:
            table.add_row(c["kind"], f"{c['count']:,}", format_bytes(c["data_bytes"]),
                          format_bytes(c["wire_bytes"]), format_seconds(c["seconds"]))
        parts.append(table)
    parts.extend(_note(f"caution: {c}") for c in f["caveats"])
    if f["extrapolation"]:
        parts.append(_note(f"extrapolated: {f['extrapolation']}"))
    if f.get("method"):
        parts.append(_note(f"compiled as: {f['method']}"))
    return parts


def _render_fit(d: list | None, terminal: bool) -> RenderableType | None:
    if not d:
        return None
    parts: list[RenderableType] = []
    for f in d:
        parts += _render_one_fit(f, terminal)
    parts.append(_note("compiled for the slice, not run: the estimates are the compiler's counts at "
                       "published peaks"))
    return Group(*parts)


@section("Fit on a TPU slice", order=68, key="fit", render=_render_fit)
def _fit(session: Any) -> list[dict[str, Any]] | None:
    events = session.events("fit")
    return [_fit_data(e) for e in events] if events else None


# -- the report as data, and as text ---------------------------------------------------------


def _json_safe(value: Any) -> Any:
    # JSON has no NaN or Infinity: they are written as null
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _section_data(session: Any) -> list[tuple[Section, Any]]:
    return [(sec, sec.data(session)) for sec in SECTIONS]


def _assemble(parts: list[tuple[Section, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {"schema": REPORT_SCHEMA}
    for sec, part in parts:
        if sec.key is None:
            data.update(part)
        else:
            data[sec.key] = part
    return _json_safe(data)


def report_data(session: Any) -> dict[str, Any]:
    """The report of ``session``'s run as data, every section of it, under :data:`REPORT_SCHEMA`
    (docs/report_schema.md describes every field): the data the text report is printed from.

    Returns:
        A dict of JSON values (``json.dumps`` takes it as it is).

    Example:
        >>> data = report_data(tpu_debug.open_run())
        >>> data["schema"], [f["kind"] for f in data["findings"]]
        ('tpu_debug.report/1', ['implicit_sync'])
    """
    return _assemble(_section_data(session))


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit with status 1; the command line ends quietly with 0 instead
        self.quiet = True
        raise BrokenPipeError


def _console(file: Any, terminal: bool | None, width: int | None) -> Console:
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


def _print_title(console: Console, title: str) -> None:
    if console.is_terminal:
        console.rule(Text(title, style="bold"))
    else:
        console.print(Text(title))
        console.print(Text("=" * min(console.width, len(title))))


def _print_heading(console: Console, text: str) -> None:
    console.print()
    console.print(Text(text, style="bold underline" if console.is_terminal else ""))


def print_report(
    session: Any, *, file: Any = None, terminal: bool | None = None, width: int | None = None
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
    console = _console(file, terminal, width)
    _print_title(console, f"tpu_debug report: {session.metadata().name}")
    for sec, data in _section_data(session):
        body = sec.render(data, console.is_terminal)
        if body is None:
            continue
        _print_heading(console, sec.heading(data) if sec.heading is not None else sec.title)
        console.print(body)


# -- multi-process runs ----------------------------------------------------------------------


def _rank_figure_data(session: Any) -> dict[str, Any]:
    """One rank's figures as data (one column of the per-rank table)."""
    from tpu_debug.tracers.collectives import collective_totals, program_calls, program_collectives

    m = session.metadata()
    ops = session.ops()
    programs = program_collectives(session)
    calls = program_calls(session, programs)
    totals = collective_totals(programs)
    return {
        "status": m.status,
        "exit_status": m.exit_status,
        "duration": m.duration,
        "devices": m.device_count,
        "device_ops": sum(o.count for o in ops),
        "compiles": sum(o.compiles for o in ops),
        "multi_device_programs": totals.programs,
        "collectives": totals.collectives,
        "sent_bytes": sum(e.collective_bytes * calls.get(e.id, 0) for e in programs),
        "peak_memory": totals.peak_memory,
        "transfers": len(session.transfers()),
        "tracer_errors": len(session.internal_errors()),
    }


def _rank_figure_text(f: dict) -> dict[str, str]:
    return {
        "status": f["status"] + (f" ({f['exit_status']})" if f["exit_status"] not in (None, 0) else ""),
        "duration": format_seconds(f["duration"]) if f["duration"] is not None else "-",
        "devices": str(f["devices"]),
        "device ops run": str(f["device_ops"]),
        "compiles": str(f["compiles"]),
        "multi-device programs": str(f["multi_device_programs"]),
        "collectives (distinct)": str(f["collectives"]),
        "sent per device": format_bytes(f["sent_bytes"]),
        "largest memory/device": format_bytes(f["peak_memory"]) if f["peak_memory"] is not None else "-",
        "transfers": str(f["transfers"]),
        "tracer errors": str(f["tracer_errors"]),
    }


def rank_figures(session: Any) -> dict[str, str]:
    """One column of the per-rank table."""
    return _rank_figure_text(_rank_figure_data(session))


_RANK_STOPS = ("RankDivergenceError", "RankTimeoutError")


def _agreement_data(sessions: list) -> dict[str, Any]:
    """Whether the ranks compiled the same multi-device programs, and which stopped or failed."""
    from tpu_debug.tracers.collectives import compare_ranks

    errors = [(rank, s.metadata().error or "") for rank, s in sessions]
    diff = compare_ranks([(rank, s.events("collectives")) for rank, s in sessions])
    same = None
    if diff is None and len(sessions) > 1:
        same = len([e for e in sessions[0][1].events("collectives") if not e.target])
    return {
        "stopped": [{"rank": r, "error": e} for r, e in errors if e.startswith(_RANK_STOPS)],
        "difference": diff.render() if diff is not None else None,
        "same_programs": same,
        "failed": [{"rank": r, "error": e} for r, e in errors if e and not e.startswith(_RANK_STOPS)],
    }


def rank_data(group: Any) -> dict[str, Any]:
    """The report of a multi-process run as data, under :data:`RANKS_SCHEMA`: the run, each
    rank's figures, whether the ranks agreed, and each rank's full report (:func:`report_data`).

    Args:
        group: a :class:`~tpu_debug.ranks.RankGroup`.
    """
    info = group.info
    sessions = group.sessions()
    nproc = info.nproc
    reports = [(rank, _section_data(s)) for rank, s in sessions]
    return _json_safe({
        "schema": RANKS_SCHEMA,
        "name": group.name,
        "dir": str(group.path),
        "nproc": nproc,
        "command": list(info.command),
        "status": info.status,
        "exit_status": list(info.exit_status) if info.exit_status else None,
        "missing": [r for r in range(nproc) if r not in dict(sessions)],
        "agreement": _agreement_data(sessions),
        "ranks": [
            {"rank": rank, "figures": _rank_figure_data(s), "report": _assemble(parts)}
            for (rank, s), (_, parts) in zip(sessions, reports)
        ],
    })


def _print_agreement(console: Console, agreement: dict) -> None:
    for i, stop in enumerate(agreement["stopped"]):
        # the first rank that stopped in full; the others say the same from their side
        error = stop["error"] if i == 0 else stop["error"].splitlines()[0]
        console.print(Text(f"rank {stop['rank']} stopped: {error}"))
    if agreement["difference"] is not None:
        console.print(Text(f"compiled programs: {agreement['difference']}"))
    elif agreement["same_programs"] is not None:
        console.print(Text(
            f"every rank compiled the same {agreement['same_programs']} multi-device program(s), with the same "
            "collectives, in the same order" + ("" if not agreement["stopped"] else " (up to where they stopped)")
        ))
    for fail in agreement["failed"]:
        console.print(Text(f"rank {fail['rank']} failed: {fail['error'].splitlines()[0]}"))


def print_rank_report(
    group: Any, *, file: Any = None, terminal: bool | None = None, width: int | None = None
) -> None:
    """Print the report of a multi-process run: the ranks side by side, whether they agreed,
    and where they first differed (the text of :func:`rank_data`).

    Args:
        group: a :class:`~tpu_debug.ranks.RankGroup`.
        file, terminal, width: as for :func:`print_report`.
    """
    console = _console(file, terminal, width)
    data = rank_data(group)
    _print_title(console, f"tpu_debug report: {data['name']} ({data['nproc']} ranks)")
    _print_heading(console, "Ranks")
    status = data["status"] + (f", exit statuses {data['exit_status']}" if data["exit_status"] else "")
    console.print(_kv([("run", data["dir"]), ("command", " ".join(data["command"]) or "-"), ("status", status)]))
    if data["missing"]:
        missing = ", ".join(map(str, data["missing"]))
        console.print(_note(f"rank(s) {missing} recorded nothing (they ended before tracing began)"))
    ranks = data["ranks"]
    if ranks:
        figures = [(r["rank"], _rank_figure_text(r["figures"])) for r in ranks]
        table = _table(console.is_terminal, ("", "left"), *[(f"rank {r}", "right") for r, _ in figures])
        for key in figures[0][1]:
            table.add_row(Text(key), *[Text(f[key]) for _, f in figures])
        console.print(table)
    _print_heading(console, "Rank agreement")
    _print_agreement(console, data["agreement"])
    if ranks:
        body = _render_collectives(ranks[0]["report"]["collectives"], console.is_terminal)
        if body is not None:
            _print_heading(console, f"Collectives (rank {ranks[0]['rank']})")
            console.print(body)
    console.print()
    console.print(_note(
        "each rank's full report: tpu-debug report " + " | ".join(r["report"]["run"]["dir"] for r in ranks[:1])
        + (" (and the other rank directories beside it)" if len(ranks) > 1 else "")
    ))
