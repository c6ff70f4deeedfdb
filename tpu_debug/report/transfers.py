"""The report's transfers and collectives sections: host<->device copies and the collectives in
each program."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_location, format_seconds
from tpu_debug.report.core import (
    NOT_MEASURED,
    dim_note,
    is_imported,
    location_data,
    plain_record,
    report_table,
    section,
    site_text,
)
from tpu_debug.tracers.reading.program_collectives import (
    collective_totals,
    program_calls,
    program_collectives,
)
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT
from tpu_debug.tracers.reading.view import RunView


def _render_transfers(d: dict, terminal: bool) -> RenderableType:
    # the ledger by call site, implicit (syncs) first; which of them to fix is the Findings'
    if d.get("imported"):
        return dim_note(f"transfers: {NOT_MEASURED}")
    if not d["count"]:
        return dim_note("no host <-> device transfers recorded")
    head = (
        f"{d['count']} transfer(s), {format_bytes(d['bytes'])}, "
        f"{format_seconds(d['seconds'])}: {d['implicit']} implicit (syncs nobody asked for), "
        f"{d['count'] - d['implicit']} explicit"
    )
    sites = d["sites"]
    table = report_table(
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
            Text(site_text(s["location"])),
            Text(CAUSE_TEXT.get(s["cause"], s["cause"])),
            s["direction"],
            "implicit" if s["implicit"] else "explicit",
            str(s["count"]),
            format_bytes(s["bytes"]),
            format_seconds(s["seconds"]),
        )
    parts: list[RenderableType] = [Text(head), table]
    if len(sites) > 15:
        parts.append(dim_note(f"... and {len(sites) - 15} more call sites"))
    return Group(*parts)


@section("Transfers", order=50, key="transfers", render=_render_transfers)
def _transfers(session: RunView) -> dict[str, Any]:
    if is_imported(session):
        return {"imported": True, "count": None, "bytes": None, "seconds": None, "implicit": None, "sites": []}
    transfers = session.transfers()
    return {
        "count": len(transfers),
        "bytes": sum(t.nbytes for t in transfers),
        "seconds": sum(t.seconds for t in transfers),
        "implicit": sum(1 for t in transfers if t.implicit),
        "sites": [
            {
                "location": location_data(c.location),
                "direction": c.direction,
                "cause": c.cause,
                "implicit": c.implicit,
                "count": c.count,
                "bytes": c.nbytes,
                "seconds": c.seconds,
            }
            for c in session.transfers.call_sites()
        ],
    }


def render_collectives(d: dict | None, terminal: bool) -> RenderableType | None:
    # programs over several devices: what XLA inserted to move data between them, and
    # what one device holds for each program; then the same for a TPU target, if any
    if d is None:
        return None
    parts: list[RenderableType] = []
    for block in ([d["local"]] if d["local"] is not None else []) + d["targets"]:
        parts += _collective_programs(block, terminal)
    parts.append(dim_note(
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
    table = report_table(
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
        parts.append(dim_note(f"... and {len(programs) - 10} more programs"))
    detail = report_table(
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
                Text(format_location(c["file"], c["line"])),
            )
    if detail.row_count:
        parts.append(detail)
    return parts


def _collectives_block(session: RunView, events: list, target: str | None) -> dict[str, Any]:
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
                "collectives": [plain_record(c) for c in e.collectives],
            }
            for e in events
        ],
    }


@section("Collectives", order=55, key="collectives", render=render_collectives)
def _collectives(session: RunView) -> dict[str, Any] | None:
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
