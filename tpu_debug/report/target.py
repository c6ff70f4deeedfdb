"""The report's TPU target section: the run's programs compiled for a TPU, their memory, layouts
and roofline."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.report.core import (
    EVENT_HEADER,
    dim_note,
    kv_text,
    location_data,
    plain_record,
    report_table,
    section,
)
from tpu_debug.tracers.reading.target_findings import findings, step_summary
from tpu_debug.tracers.reading.view import RunView


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
    parts: list[RenderableType] = [kv_text(_target_rows(d))]
    if d["programs"]:
        parts += _target_programs(d["programs"], terminal)
    found = d["findings"]
    if found:
        parts.append(Text("findings:"))
        parts += [Text(f"  {f['kind']}: {f['text']}") for f in found[:8]]
        if len(found) > 8:
            parts.append(dim_note(f"... and {len(found) - 8} more findings"))
    parts.append(dim_note(
        "est. = a model estimate, not a measurement: max(flops / peak, bytes / HBM bandwidth) per program, "
        "with the target's published peaks and the TPU compiler's counts, per device; a step adds its "
        "programs back to back, without host dispatch. TPU HLO: session.programs.hlo(<id>)"
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
    table = report_table(
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
            refused = "OOM" if c["status"] == "hbm_oom" else "refused"
            code = (c.get("error_code") or "").split(":", 1)[0]
            table.add_row(Text(c["signature"]), Text(need), "-", "-", "-",
                          Text(f"{refused} {code}" if code else refused), "-", "-", hlo)
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
        parts.append(dim_note(f"... and {len(ranked) - 12} more programs (session.events('target_compile'))"))
    parts.append(dim_note(
        "per device on the target: HBM the program needs (arguments, outputs, temporaries, code), the "
        "compiler's FLOP and bytes accessed, FLOP/B against the ridge point, est. time, pad = share of "
        "its arrays' bytes that TPU tiles pad, HLO = the TPU program's id"
    ))
    return parts


def _target_compile_data(c: Any, runs: dict, ids: dict) -> dict[str, Any]:
    data = plain_record(c, EVENT_HEADER)
    data.update(
        location=location_data(c.location), ok=c.ok, memory_bytes=c.memory_bytes,
        padding_wasted_bytes=c.padding_wasted_bytes, runs=runs.get(c.program) if c.program else None,
        hlo=ids.get(c.tpu_program),
    )
    return data


@section("TPU target", order=67, key="target", render=_render_target, heading=_target_heading)
def _target(session: RunView) -> dict[str, Any] | None:
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
        "summary": plain_record(summary, EVENT_HEADER + ("location",)) if summary is not None else None,
        "step": step_summary(session.events("target_step")),
        "programs": [_target_compile_data(c, runs, ids) for c in sorted(compiles, key=weight)],
        "optimization_levels": sorted({c.optimization_level for c in compiles if c.optimization_level}),
        "findings": [
            {"kind": f.kind, "subject": f.subject, "programs": list(f.programs), "fix": f.fix, "cost": f.cost,
             "text": f.render()}
            for f in findings(compiles)
        ],
    }
