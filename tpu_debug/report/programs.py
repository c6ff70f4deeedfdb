"""The report's sections on what ran where: top ops, programs compiled, the heaviest programs, lazy graphs,
CPU fallbacks and float64 ops."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_seconds
from tpu_debug.report.core import (
    NOT_MEASURED,
    dim_note,
    full_where,
    is_imported,
    location_data,
    plain_record,
    report_table,
    section,
    site_text,
)
from tpu_debug.tracers.advisor import FLOAT64_BY_PYTORCH, RunFacts, float64_origins
from tpu_debug.tracers.reading.lazy_graphs import summarize
from tpu_debug.tracers.reading.target_findings import TARGET_MODE
from tpu_debug.tracers.reading.view import RunView


def _render_ops(ops: list[dict], terminal: bool) -> RenderableType:
    if not ops:
        return dim_note("no ops recorded")
    total = sum(o["seconds"] or 0.0 for o in ops) or 1.0
    table = report_table(
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
        parts.append(dim_note(f"... and {len(ops) - 15} more ops"))
    fell_back = sum(o.get("fallbacks") or 0 for o in ops)
    if fell_back:
        parts.append(dim_note(f"calls include {fell_back} run on the CPU for lack of a lowering, with the CPU's time "
                               "(see CPU fallbacks)"))
    parts.append(dim_note(f"calls and time: {NOT_MEASURED} (it records compiles)" if unlogged else
                       "time is host time to dispatch each executable (device work runs asynchronously)"))
    return Group(*parts)


@section("Top ops by time", order=10, key="ops", render=_render_ops)
def _ops(session: RunView) -> list[dict[str, Any]]:
    imported = is_imported(session)
    return [
        {
            "name": o.name,
            "mode": o.mode,
            "count": None if imported else o.count,
            "seconds": None if imported else o.seconds,
            "compiles": o.compiles,
            "compile_seconds": o.compile_seconds,
            "programs": o.programs,
            "fallbacks": None if imported else o.fallbacks,
        }
        for o in session.ops()
    ]


def local_programs(programs: list) -> list:
    """The programs that ran here (a run with a TPU target also stores the TPU's HLO as programs)."""
    return [p for p in programs if p.mode != TARGET_MODE]


def _render_programs(programs: list[dict], terminal: bool) -> RenderableType | None:
    if not programs:
        return None
    table = report_table(
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
    return Group(table, dim_note("see a program's HLO with session.programs.hlo(<op or program id>)"))


@section("Heaviest programs", order=30, key="programs", render=_render_programs)
def _programs(session: RunView) -> list[dict[str, Any]]:
    return [plain_record(p) for p in local_programs(session.programs())]


def _cut_data(c: Any) -> dict[str, Any]:
    return {
        "trigger": c.trigger,
        "text": c.text,
        "location": location_data(c.location),
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
    table = report_table(
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
            Text(site_text(c["location"])), Text(c["text"]), str(c["count"]), str(c["compiled"]),
            f"{c['ops']:.0f}", format_seconds(c["seconds"]),
        )
    parts.append(table)
    if len(d["cuts"]) > 15:
        parts.append(dim_note(f"... and {len(d['cuts']) - 15} more cut sites"))
    parts += [
        Text(
            f"{site_text(c['location'])}: {c['text']} cut the graph inside {c['steps']} step(s): each cut runs "
            "what was recorded so far as a program of its own and waits for it; move the read after "
            "optimizer.step() (or read every N steps) so a step is one program"
        )
        for c in d["extra_cuts"][:3]
    ]
    return Group(*parts)


@section("Lazy graphs", order=57, key="lazy_graphs", render=_render_lazy_graphs)
def _lazy_graphs(session: RunView) -> dict[str, Any] | None:
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


def _render_fallbacks(fallbacks: list[dict], terminal: bool) -> RenderableType | None:
    if not fallbacks:
        return None
    table = report_table(terminal, ("op", "left"), ("count", "right"), ("time", "right"), ("first at", "left"))
    for f in fallbacks:
        table.add_row(Text(f["name"]), str(f["count"]), format_seconds(f["seconds"]), Text(full_where(f["location"])))
    return table


@section("CPU fallbacks", order=70, key="fallbacks", render=_render_fallbacks)
def _fallbacks(session: RunView) -> list[dict[str, Any]]:
    counts: dict[str, list] = {}
    for f in session.ops.fallbacks():
        counts.setdefault(f.name, []).append(f)
    return [
        {"name": name, "count": len(items), "seconds": sum(f.seconds for f in items),
         "location": location_data(items[0].location)}
        for name, items in sorted(counts.items(), key=lambda kv: -len(kv[1]))
    ]


def _render_float64(ops: list[dict], terminal: bool) -> RenderableType | None:
    # float64 runs on this backend; a TPU has none, so these ops would not run there
    if not ops:
        return None
    table = report_table(terminal, ("op or graph", "left"), ("programs", "right"), ("executions", "right"),
                         ("made by", "left"))
    for o in ops:
        made_by = "the program" if o["origin"] == "program" else f"PyTorch: {FLOAT64_BY_PYTORCH[o['origin']]}"
        table.add_row(Text(o["name"]), str(o["programs"]), str(o["executions"]), Text(made_by))
    return Group(dim_note(_float64_note(ops)), table)


def _float64_note(ops: list[dict]) -> str:
    # the same split as the float64 finding's: only the program's own float64 is a finding
    mine = sum(o["origin"] == "program" for o in ops)
    theirs = len(ops) - mine
    parts = [f"{mine} op(s) of the program ran with float64/complex128 values (see Findings)"] if mine else []
    if theirs:
        parts.append(f"{theirs} op(s) ran with float64 values that PyTorch made, not the program; not a finding")
    return "; ".join(parts)


@section("float64", order=75, key="float64", render=_render_float64)
def _float64(session: RunView) -> list[dict[str, Any]]:
    ops = session.ops.float64()
    origins = float64_origins(RunFacts(session)) if ops else {}
    return [
        {"name": name, "programs": programs, "executions": runs, "origin": origins.get(name, "program")}
        for name, (programs, runs) in sorted(ops.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]
