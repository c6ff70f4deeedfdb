"""The report's "Compile time" section: where the run's compile time went, by phase, by compile
and by the user's source line (``compiles.phases`` and ``compiles.lines`` in the JSON)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_seconds
from tpu_debug.report.core import dim_note, location_data, report_table, section, site_text
from tpu_debug.tracers.reading.compile_time import LINES_METHOD, CompileUnit, LineTime, Phases, compile_time
from tpu_debug.tracers.reading.view import RunView

# how each phase is named in the text
PHASE_TITLES = {
    "dynamo_trace": "dynamo: trace",
    "dynamo_guards": "dynamo: guards",
    "aot_graph": "AOTAutograd: joint graph",
    "aot_partition": "AOTAutograd: partition",
    "lowering": "lowering to XLA",
    "xla_compile": "XLA compile (this machine)",
    "target_compile": "TPU target compile",
    "cache_read": "compile cache read-back",
    "other": "other",
}
_UNITS_SHOWN = 8
_LINES_SHOWN = 10


def _phases_data(phases: Phases) -> dict[str, float]:
    return dict(phases.items())


def _unit_data(u: CompileUnit) -> dict[str, Any]:
    return {
        "kind": u.kind,
        "name": u.name,
        "mode": u.mode,
        "compile_id": u.compile_id,
        "event": u.event,
        "from_cache": u.from_cache,
        "wall": u.wall,
        "seconds": u.phases.total,
        "phases": _phases_data(u.phases),
        "location": location_data(u.location),
    }


def _line_data(line: LineTime) -> dict[str, Any]:
    return {
        "file": line.file,
        "line": line.line,
        "function": line.function,
        "seconds": line.seconds,
        "nodes": line.nodes,
        "hlo_before": line.hlo_before,
        "hlo_after": line.hlo_after,
        "programs": line.programs,
        "instances": line.instances,
        "module": line.module,
    }


def _share(part: float, total: float) -> str:
    return f"{100 * part / total:.1f}%" if total > 0 else "-"


def _phase_table(d: dict, terminal: bool) -> RenderableType:
    total = d["phases"]["total"]
    table = report_table(terminal, ("phase", "left"), ("time", "right"), ("share", "right"))
    for name, seconds in d["phases"]["run"].items():
        if seconds > 0:
            table.add_row(PHASE_TITLES[name], format_seconds(seconds), _share(seconds, total))
    table.add_row("total", format_seconds(total), _share(total, total))
    return table


def _unit_table(d: dict, terminal: bool) -> list[RenderableType]:
    units = sorted(d["phases"]["programs"], key=lambda u: -u["seconds"])
    table = report_table(terminal, ("compile", "left"), ("kind", "left"), ("time", "right"), ("mostly", "left"))
    for u in units[:_UNITS_SHOWN]:
        largest = sorted(((s, n) for n, s in u["phases"].items() if s > 0), reverse=True)[:2]
        mostly = ", ".join(f"{PHASE_TITLES[n]} {format_seconds(s)}" for s, n in largest)
        kind = _kind_text(u)
        table.add_row(Text(u["name"]), kind, format_seconds(u["seconds"]), Text(mostly))
    parts: list[RenderableType] = [table]
    if len(units) > _UNITS_SHOWN:
        parts.append(dim_note(f"... and {len(units) - _UNITS_SHOWN} more compiles (all in compiles.phases.programs)"))
    return parts


def _kind_text(u: dict) -> str:
    if u["kind"] == "frame":
        return f"dynamo {u['compile_id'] or ''}".strip()
    if u["kind"] == "backward":
        return f"AOT backward {u['compile_id'] or ''}".strip()
    if u["kind"] == "target":
        return "TPU target"
    return f"{u['mode']} program" + (" (read back)" if u["from_cache"] else "")


def _line_table(d: dict, terminal: bool) -> list[RenderableType]:
    total = d["phases"]["total"]
    table = report_table(terminal, ("line", "left"), ("nodes", "right"), ("HLO before", "right"),
                         ("HLO after", "right"), ("est. time", "right"), ("share", "right"), ("traced in", "left"))
    for line in d["lines"][:_LINES_SHOWN]:
        where = ("(no source line)" if line["file"] is None
                 else site_text({"file": line["file"], "line": line["line"], "function": line["function"]}))
        traced = f"{line['instances']} {line['module']}" if line["instances"] > 1 else ""
        table.add_row(Text(where), str(line["nodes"]), str(line["hlo_before"]), str(line["hlo_after"]),
                      format_seconds(line["seconds"]), _share(line["seconds"], total), Text(traced))
    method = d["lines_method"].removeprefix("estimated: ")
    parts: list[RenderableType] = [table, dim_note(f"time per line is an estimate ({method}); "
                                                  "HLO before: StableHLO operations XLA was handed, after: "
                                                  "optimized HLO instructions")]
    if len(d["lines"]) > _LINES_SHOWN:
        parts.append(dim_note(f"... and {len(d['lines']) - _LINES_SHOWN} more lines (all in compiles.lines)"))
    return parts


def _render_compile_time(d: dict, terminal: bool) -> RenderableType | None:
    if not d["phases"]["programs"]:
        return None
    n = len(d["phases"]["programs"])
    head = Text(f"{format_seconds(d['phases']['total'])} in {n} compile(s), measured phase by phase")
    parts: list[RenderableType] = [head, _phase_table(d, terminal), Text("")]
    parts += _unit_table(d, terminal)
    if d["lines"]:
        parts += [Text(""), *_line_table(d, terminal)]
    return Group(*parts)


@section("Compile time", order=22, key=None, into="compiles", render=_render_compile_time)
def _compile_time(session: RunView) -> dict[str, Any]:
    ct = compile_time(session)
    return {
        "phases": {
            "total": ct.total,
            "run": _phases_data(ct.phases),
            "programs": [_unit_data(u) for u in ct.units],
        },
        "lines": [_line_data(line) for line in ct.lines],
        "lines_method": LINES_METHOD,
    }
