"""The report's memory section: peak device memory, who holds it, and whether it fits the target."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_location
from tpu_debug.report.core import (
    EVENT_HEADER,
    dim_note,
    kv_text,
    plain_record,
    report_table,
    section,
    site_text,
)
from tpu_debug.tracers.memory import PHASE_TEXT, describe_fix, memory_view, need_text



def _memory_rows(m: dict) -> list[tuple[str, str]]:
    
    rows = [("peak", (f"{format_bytes(m['peak_bytes'])} held by tpu tensors, in step {m['peak_step']} of {m['steps']} "
                     f"({format_bytes(m['persistent_bytes'])} still held at that step's end, "
                     f"{format_bytes(m['activation_bytes'])} of the forward's tensors gone by then)"))]
    if m["temp_bytes"]:
        whose = "the TPU compiler's figure" if m["temp_source"] == "target" else "this machine's compiler's figure"
        rows.append(("largest program", f"{m['temp_program']}: {format_bytes(m['temp_bytes'])} of temporaries ({whose})"))
    if m["target"] is not None:
        verdict = "fits" if m["fits"] else "does NOT fit"
        rows.append(("need", (f"~{format_bytes(m['required_bytes'])} per device ({m['need']}) of "
                             f"{format_bytes(m['capacity_bytes'])} on one {m['target']} device: {verdict} (an estimate)")))
    if m["dry_run"]:
        dry = f"nothing executed; {m['programs']} program(s) compiled for {m['target']}, {m['oom_programs']} out of HBM"
        rows.append(("dry run", dry))
    if m["stopped"]:
        where = f" at {site_text(m['location'])}" if m["location"] is not None else ""
        rows.append(("stopped", f"the dry run needs a value{where} ({m['stopped']}); what ran before it is measured"))
    return rows


def _holder_where(h: dict) -> str:
    return format_location(h["file"], h["line"], h["function"]) if h["file"] else "before the trace"


def _memory_finding(f: dict, terminal: bool) -> Group:
    
    if f["finding"] == "program_oom":
        head = (f"the TPU compiler refused {f['program']} on {f['target']}: it counted {format_bytes(f['required_bytes'])} "
                f"of {format_bytes(f['capacity_bytes'])} HBM")
    else:
        head = (f"does not fit one {f['target']} device: ~{format_bytes(f['required_bytes'])} needed, "
                f"{format_bytes(f['capacity_bytes'])} there")
    if f["holders"]:
        head += "; biggest holders: " + ", ".join(
            f"{os.path.basename(h['file']) + ':' + str(h['line']) if h['file'] else 'before the trace'} "
            f"({format_bytes(h['nbytes'])})" for h in f["holders"])
    lines = [Text(head, style="bold red" if terminal else "")]
    lines += [Text(f"  fix: {fix['text']}" + ("" if fix["fits"] else " - not enough alone")) for fix in f["fixes"]]
    return Group(*lines)


def _render_memory(d: dict | None, terminal: bool) -> RenderableType | None:
    # device bytes over the run, the peak's holders, and the fit against the TPU target
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
        parts.append(kv_text(rows))
    if d["holders"]:
        table = report_table(terminal, ("held at the peak by", "left"), ("phase", "left"), ("bytes", "right"),
                       ("tensors", "right"), ("largest", "left"))
        for h in d["holders"]:
            table.add_row(Text(_holder_where(h)), Text(PHASE_TEXT.get(h["phase"], h["phase"])), format_bytes(h["nbytes"]),
                          str(h["tensors"]), Text(f"{h['dtype']}{list(h['shape'])}" if h["shape"] else "-"))
        parts.append(table)
    parts += [_memory_finding(f, terminal) for f in d["findings"]]
    if d["summary"] is None:
        parts.append(dim_note("the run has not ended: the peak and the fit are written when it does"))
    return Group(*parts) if parts else None


@section("Memory", order=65, key="memory", render=_render_memory)
def _memory(session: Any) -> dict[str, Any] | None:
    view = memory_view(session)
    if not view.recorded:
        return None
    summary = plain_record(view.summary, EVENT_HEADER + ("holders",)) if view.summary is not None else None
    if summary is not None:
        summary["need"] = need_text(view.summary)
    findings = []
    for f in view.findings:
        found = plain_record(f, EVENT_HEADER + ("location", "fixes"))
        found["fixes"] = [dict(plain_record(fix), text=describe_fix(fix)) for fix in f.fixes]
        findings.append(found)
    return {
        "summary": summary,
        "steps": [{"step": st.step, "peak_bytes": st.peak_bytes} for st in view.steps],
        "holders": plain_record(list(view.peak_holders())),
        "findings": findings,
    }
