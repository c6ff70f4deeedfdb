"""A multi-process run's report: per-rank figures side by side, and whether the ranks agreed."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.report.transfers import render_collectives
from tpu_debug.report.core import (
    RANKS_SCHEMA,
    assemble,
    dim_note,
    json_safe,
    kv_text,
    make_console,
    print_heading,
    print_title,
    report_table,
    section_data,
)



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
    reports = [(rank, section_data(s)) for rank, s in sessions]
    return json_safe({
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
            {"rank": rank, "figures": _rank_figure_data(s), "report": assemble(parts)}
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
    console = make_console(file, terminal, width)
    data = rank_data(group)
    print_title(console, f"tpu_debug report: {data['name']} ({data['nproc']} ranks)")
    print_heading(console, "Ranks")
    status = data["status"] + (f", exit statuses {data['exit_status']}" if data["exit_status"] else "")
    console.print(kv_text([("run", data["dir"]), ("command", " ".join(data["command"]) or "-"), ("status", status)]))
    if data["missing"]:
        missing = ", ".join(map(str, data["missing"]))
        console.print(dim_note(f"rank(s) {missing} recorded nothing (they ended before tracing began)"))
    ranks = data["ranks"]
    if ranks:
        figures = [(r["rank"], _rank_figure_text(r["figures"])) for r in ranks]
        table = report_table(console.is_terminal, ("", "left"), *[(f"rank {r}", "right") for r, _ in figures])
        for key in figures[0][1]:
            table.add_row(Text(key), *[Text(f[key]) for _, f in figures])
        console.print(table)
    print_heading(console, "Rank agreement")
    _print_agreement(console, data["agreement"])
    if ranks:
        body = render_collectives(ranks[0]["report"]["collectives"], console.is_terminal)
        if body is not None:
            print_heading(console, f"Collectives (rank {ranks[0]['rank']})")
            console.print(body)
    console.print()
    console.print(dim_note(
        "each rank's full report: tpu-debug report " + " | ".join(r["report"]["run"]["dir"] for r in ranks[:1])
        + (" (and the other rank directories beside it)" if len(ranks) > 1 else "")
    ))
