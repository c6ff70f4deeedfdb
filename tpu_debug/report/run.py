"""The report's run, TensorBoard and tracer-error sections: what ran, for how long, and what the
tracers could not do."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_seconds
from tpu_debug.report.core import (
    NOT_MEASURED,
    dim_note,
    kv_text,
    report_table,
    section,
)
from tpu_debug.tracers.reading.view import RunView


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
    return kv_text(rows)


@section("Run", order=0, key="run", render=_render_run)
def _run(session: RunView) -> dict[str, Any]:
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
    return Group(kv_text(rows), *[dim_note(n) for n in tb["notes"]])


@section("TensorBoard", order=85, key="tensorboard", render=_render_tensorboard)
def _tensorboard(session: RunView) -> dict[str, Any] | None:
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
        notes.append(dim_note(f"recording stopped early: {d['recording_error']}"))
    if d["dropped_events"]:
        notes.append(dim_note(f"{d['dropped_events']:,} events were not recorded (the run writer could not keep up or had stopped)"))
    if d["errors"]:
        table = report_table(terminal, ("where", "left"), ("count", "right"), ("first error", "left"))
        for e in d["errors"][:10]:
            table.add_row(Text(e["where"]), f"{e['count']:,}", Text(e["first"]))
        notes += [dim_note(f"{d['count']:,} tracer error(s); the program was not affected"), table]
    return Group(*notes) if notes else None


@section("Tracer errors", order=90, key="tracer_errors", render=_render_errors)
def _errors(session: RunView) -> dict[str, Any]:
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


def _render_damaged(d: list[dict], terminal: bool) -> RenderableType | None:
    if not d:
        return None
    table = report_table(terminal, ("table", "left"), ("event", "right"), ("kind", "left"), ("why", "left"))
    for row in d:
        table.add_row(Text(row["table"]), str(row["event_id"]), Text(row["kind"]), Text(row["detail"]))
    note = dim_note(
        f"{len(d)} recorded event(s) could not be read from run.db and are left out of every section above; "
        "the rest of the run is as recorded"
    )
    return Group(note, table)


# the last section: it names the rows that the sections before it found damaged
@section("Damaged rows", order=99, key="damaged_rows", render=_render_damaged)
def _damaged(session: RunView) -> list[dict[str, Any]]:
    return [dataclasses.asdict(d) for d in session.damaged_rows()]
