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
from tpu_debug.tracers.reading.memory_view import PHASE_TEXT, describe_fix, memory_view, need_text
from tpu_debug.tracers.reading.peak_buffers import (
    KIND_TEXT,
    made_by,
    made_where,
    peak_headline,
    shape_text,
    sharing_text,
    sum_text,
)
from tpu_debug.tracers.reading.view import RunView


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
    if not h["file"]:
        return "before the trace"
    where = format_location(h["file"], h["line"], h["function"])
    if h.get("call_file"):
        where += f" (called at {format_location(h['call_file'], h['call_line'], None)})"
    return where


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
        table = report_table(terminal, ("held at the peak by", "left"), ("phase", "left"), ("kind", "left"),
                             ("bytes", "right"), ("tensors", "right"), ("largest", "left"))
        for h in d["holders"]:
            table.add_row(Text(_holder_where(h)), Text(PHASE_TEXT.get(h["phase"], h["phase"])),
                          Text(KIND_TEXT.get(h.get("kind") or "", h.get("kind") or "-")), format_bytes(h["nbytes"]),
                          str(h["tensors"]), Text(f"{h['dtype']}{list(h['shape'])}" if h["shape"] else "-"))
        parts.append(table)
    parts += [_memory_finding(f, terminal) for f in d["findings"]]
    if d["summary"] is None:
        parts.append(dim_note("the run has not ended: the peak and the fit are written when it does"))
    return Group(*parts) if parts else None


@section("Memory", order=65, key="memory", render=_render_memory)
def _memory(session: RunView) -> dict[str, Any] | None:
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


# -- each program at its peak, buffer by buffer ------------------------------------------------

# programs the section shows (the one the run's answer is about first), and buffers per program
_PEAK_PROGRAMS = 3
_PEAK_ROWS = 10


def _peak_program_data(e: Any) -> dict[str, Any]:
    data = plain_record(e, EVENT_HEADER + ("buffers", "timeline_positions", "timeline_bytes", "kinds",
                                           "kind_bytes"))
    data["by_kind"] = e.by_kind()
    data["headline"] = peak_headline(e)
    data["sum"] = sum_text(e)
    data["timeline"] = [[p, b] for p, b in zip(e.timeline_positions, e.timeline_bytes)]
    data["buffers"] = [dict(plain_record(b), shape_text=shape_text(b), where=made_where(b), made_by=made_by(b),
                            sharing=sharing_text(b)) for b in e.buffers]
    return data


# a buffer this large gets a row of its own in the text whatever its rank (rows of one kind, line
# and shape together): each is a line to look at
_LARGE = 16 << 20


def _peak_rows(buffers: list[dict]) -> list[dict]:
    """The largest buffers one by one, then the other large ones by (kind, line, shape), then the
    rest folded into one row per kind, then the heap's unused bytes: the rows still add up to
    the program's total."""
    single = [b for b in buffers if b["count"] == 1 and b["kind"] != "unused"]
    rows = single[:_PEAK_ROWS]
    grouped: dict[tuple, dict] = {}
    folded: dict[str, dict] = {}
    for b in single[_PEAK_ROWS:] + [b for b in buffers if b["count"] > 1]:
        if b["count"] == 1 and b["nbytes"] >= _LARGE:
            key = (b["kind"], b["where"], b["shape_text"], b["made_by"])
            row = grouped.get(key)
            if row is None:
                grouped[key] = dict(b, sharing="")
            else:
                row.update(nbytes=row["nbytes"] + b["nbytes"], padding_bytes=row["padding_bytes"] + b["padding_bytes"],
                           count=row["count"] + 1, grouped=True)
            continue
        row = folded.setdefault(b["kind"], {"kind": b["kind"], "nbytes": 0, "padding_bytes": 0, "count": 0,
                                            "shape_text": "-", "made_by": "", "file": None, "start": -1,
                                            "end": -1, "folded": True, "reserved": False, "sharing": ""})
        row["nbytes"] += b["nbytes"]
        row["padding_bytes"] += b["padding_bytes"]
        row["count"] += b["count"]
    for row in grouped.values():
        if row["count"] > 1:
            row["where"] = f"{row['where']} ({row['count']} buffers)"
        rows.append(row)
    for row in sorted(folded.values(), key=lambda r: -r["nbytes"]):
        row["where"] = f"{row['count']} smaller buffer{'s' if row['count'] > 1 else ''}"
        rows.append(row)
    return rows + [b for b in buffers if b["kind"] == "unused"]


def _render_peak_buffers(d: list | None, terminal: bool) -> RenderableType | None:
    if not d:
        return None
    parts: list[RenderableType] = []
    for p in d:
        parts.append(Text(p["headline"], style="bold" if terminal else ""))
        kinds = ", ".join(f"{KIND_TEXT.get(k, k)} {format_bytes(v)}" for k, v in p["by_kind"].items())
        parts.append(kv_text([("by kind", kinds)]))
        table = report_table(terminal, ("kind", "left"), ("bytes", "right"), ("padding", "right"),
                             ("shape", "left"), ("made by", "left"), ("line", "left"), ("live", "left"))
        notes = []
        for b in _peak_rows(p["buffers"]):
            one = not b.get("folded") and not b.get("grouped") and b["count"] == 1 and b["kind"] != "unused"
            live = (f"{b['start']}-{b['end']}" if b["start"] >= 0 else "whole program") if one else ""
            padding = format_bytes(b["padding_bytes"]) if b["padding_bytes"] else ""
            if b["sharing"]:
                notes.append(b["sharing"])
                live = f"{live} [{len(notes)}]"
            table.add_row(Text(KIND_TEXT.get(b["kind"], b["kind"])), format_bytes(b["nbytes"]), padding, Text(b["shape_text"]),
                          Text(b["made_by"]), Text(b["where"]), live)
        parts.append(table)
        parts += [dim_note(f"[{i}] {n}") for i, n in enumerate(notes, 1)]
        parts.append(dim_note(p["sum"]))
    return Group(*parts)


@section("Peak buffers", order=66, key="peak_buffers", render=_render_peak_buffers)
def _peak_buffers(session: RunView) -> list[dict[str, Any]] | None:
    programs = session.memory()
    if not programs:
        return None
    first = session.memory.peak()
    ordered = [first] + [e for e in programs if e.id != first.id]
    return [_peak_program_data(e) for e in ordered[:_PEAK_PROGRAMS]]
