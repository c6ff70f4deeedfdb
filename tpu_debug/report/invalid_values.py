"""The report's section on argument values a TPU computes with silently: each (line, op,
argument) where an op met values PyTorch on CPU refuses (an index out of range), with the
value, the bounds, what XLA does instead and how often (``session.invalid_values()``; the
finding and its fix are the advisor's ``invalid_value`` rule)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.report.core import dim_note, full_where, location_data, report_table, section
from tpu_debug.tracers.reading.view import RunView


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _accepted(p: dict) -> str:
    low = _number(p["low"]) if p["low"] is not None else "-inf"
    high = _number(p["high"]) if p["high"] is not None else "inf"
    return f"[{low}, {high})"


def _render_invalid_values(places: list[dict], terminal: bool) -> RenderableType | None:
    if not places:
        return None
    table = report_table(terminal, ("where", "left"), ("op", "left"), ("argument", "left"), ("value", "right"),
                         ("accepted", "left"), ("a TPU", "left"), ("count", "right"), ("raised", "left"))
    for p in places:
        op = p["op"] if p["phase"] == "forward" else f"{p['op']} (backward)"
        table.add_row(Text(full_where(p["location"])), Text(op), Text(p["argument"]), _number(p["value"]),
                      _accepted(p), Text(p["silent"]), str(p["count"]), "yes" if p["raised"] else "no")
    note = ("values PyTorch on CPU refuses and XLA computes with silently (see Findings); "
            "TPU_DEBUG_DATA_CHECKS=1 raises PyTorch's error at the op in every mode")
    return Group(dim_note(note), table)


@section("Invalid values", order=72, key="invalid_values", render=_render_invalid_values)
def _invalid_values(session: RunView) -> list[dict[str, Any]]:
    out = []
    for place in session.invalid_values():
        e = place.event
        out.append({
            "op": e.op, "argument": e.argument, "value": e.value, "low": e.low, "high": e.high,
            "silent": e.silent, "error": e.error, "message": e.message, "mode": e.mode, "phase": e.phase,
            "autograd_node": e.autograd_node, "raised": e.raised, "count": place.count,
            "location": location_data(e.location),
        })
    return out
