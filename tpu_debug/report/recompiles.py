"""The report's recompiles and compiles sections: what changed between compiles of one op or graph,
guard failures, graph breaks, and the programs compiled."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_seconds
from tpu_debug.report.core import (
    dim_note,
    kv_text,
    location_data,
    report_table,
    section,
    where_text,
)
from tpu_debug.report.programs import local_programs
from tpu_debug.tracers.reading.step_phases import STEADY, StepIndex, phase_of, step_phases
from tpu_debug.tracers.reading.view import RunView


def _read_back_text(d: dict) -> str | None:
    """The programs read back from the persistent compile cache and the compile time saved."""
    if not d["read_back"]:
        return None
    return (f"{d['read_back']} program(s) read back from the compile cache, saving "
            f"{format_seconds(d['saved_seconds'])} of compiling")


def _render_compiles(d: dict, terminal: bool) -> RenderableType:
    cached = _read_back_text(d)
    if not d["count"]:
        return dim_note("nothing was compiled while tracing" + (f"; {cached}" if cached else ""))
    modes = ", ".join(f"{m['compiles']} {name}" for name, m in sorted(d["by_mode"].items()))
    rows = [
        ("compiles", f"{d['count']} ({modes})"),
        ("compile time", format_seconds(d["seconds"])),
        ("distinct programs", str(d["programs"]) if d["programs"] else "HLO not recorded"),
    ]
    if cached:
        rows.append(("compile cache", cached))
    return kv_text(rows)


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
             "grows": bool(g.changing.grows), "location": location_data(g.changing.location)}
            if g.changing is not None
            else None
        ),
        "location": location_data(g.locations[0][0]) if g.locations else None,
    }


@section("Programs compiled", order=20, key="compiles", render=_render_compiles)
def _compiles(session: RunView) -> dict[str, Any]:
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
        "programs": len(local_programs(session.programs())),
        "groups": [_group_data(g, steady) for g in session.recompiles.groups()],
    }


def _render_recompiles(d: dict, terminal: bool) -> RenderableType:
    # grouped by op / graph, split into warm-up and steady state; dynamo's side as recorded
    if not d["groups"] and not d["graph_breaks"] and not d["guard_failures"] and not d["limits"]:
        return dim_note("nothing was compiled twice: every op and graph kept one key")
    parts: list[RenderableType] = []
    if d["groups"]:
        parts += _recompile_table(d, terminal)
    if d["guard_failures"]:
        lines = ["dynamo recompiled (guard failures):"]
        lines += [
            f"  {f['name']}: {f['count']}x, latest: {f['guard']} (called at {where_text(f['location'])})"
            for f in d["guard_failures"]
        ]
        parts.append(Text("\n".join(lines)))
    if d["graph_breaks"]:
        lines = ["graph breaks:"]
        lines += [f"  {b['name']} at {where_text(b['location'])} ({b['count']}x): {b['reason']}" for b in d["graph_breaks"]]
        parts.append(Text("\n".join(lines)))
    parts += [
        Text(
            f"recompile limit: {hit['name']} at {where_text(hit['location'])}, {hit['limit_type']} {hit['limit']}, "
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
    table = report_table(
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
            Text(where_text(where)),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(groups) > 12:
        parts.append(dim_note(f"... and {len(groups) - 12} more"))
    parts.append(dim_note("steady: recompiles in steady-state steps (see Steps); the Findings say which to fix and how"))
    return parts


def _steady_recompiles(session: RunView) -> dict[tuple[str | None, str], int]:
    """Recompiles in steady-state steps, per (mode, identity)."""
    steps = session.steps()
    index = StepIndex(steps)
    phases = dict(zip((s.index for s in steps), step_phases(steps)))
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
        out.append({"name": name, "count": len(items), "guard": guard, "location": location_data(latest.location)})
    return out


def _graph_breaks_data(breaks: list) -> list[dict[str, Any]]:
    """Graph breaks by site (function, line, reason), most frequent first."""
    sites: dict[tuple, list] = {}
    for b in breaks:
        sites.setdefault((b.name, b.location, b.reason), []).append(b)
    return [
        {"name": name, "location": location_data(loc), "reason": reason, "count": len(items)}
        for (name, loc, reason), items in sorted(sites.items(), key=lambda kv: -len(kv[1]))
    ]


@section("Recompiles", order=40, key="recompiles", render=_render_recompiles)
def _recompiles(session: RunView) -> dict[str, Any]:
    groups = [g for g in session.recompiles.groups() if g.recompiles]
    steady = _steady_recompiles(session) if groups else {}
    ranked = sorted(groups, key=lambda g: (-steady.get((g.mode, g.identity), 0), -g.recompiles, g.identity))
    return {
        "count": sum(g.recompiles for g in groups),
        "steady": sum(steady.values()),
        "seconds": sum(g.seconds for g in groups),
        "groups": [_group_data(g, steady) for g in ranked],
        "guard_failures": _guard_failures_data(session.recompiles.guard_failures()),
        "graph_breaks": _graph_breaks_data(session.recompiles.graph_breaks()),
        "limits": [
            {"name": hit.name, "location": location_data(hit.location), "limit_type": hit.limit_type,
             "limit": hit.limit, "reason": hit.reason}
            for hit in session.recompiles.limits()
        ],
    }
