"""A multi-process run's report: per-rank figures side by side, and whether the ranks agreed."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpu_debug.core.collective_kinds import P2P_OPS, ROOTED
from tpu_debug.core.desync import shape_texts
from tpu_debug.core.format import format_bytes, format_seconds
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
from tpu_debug.report.transfers import render_collectives
from tpu_debug.tracers.reading.collective_calls import group_desyncs, read_rank, stragglers, warm_up_calls
from tpu_debug.tracers.reading.program_collectives import (
    collective_totals,
    compare_ranks,
    program_calls,
    program_collectives,
)
from tpu_debug.tracers.reading.rank_programs import compiled_programs, first_program_difference
from tpu_debug.tracers.reading.view import RunView
from tpu_debug.tracers.xplane import RankSpan


def _rank_figure_data(session: RunView) -> dict[str, Any]:
    """One rank's figures as data (one column of the per-rank table)."""

    m = session.metadata()
    ops = session.ops()
    programs = program_collectives(session)
    calls = program_calls(session, programs)
    totals = collective_totals(programs)
    c10d = read_rank(0, session).calls
    return {
        "status": m.status,
        "exit_status": m.exit_status,
        "duration": m.duration,
        "devices": m.device_count,
        "device_ops": sum(o.executed().count for o in ops),
        "compiles": sum(o.compiles for o in ops),
        "multi_device_programs": totals.programs,
        "collectives": totals.collectives,
        "sent_bytes": sum(e.collective_bytes * calls.get(e.id, 0) for e in programs),
        "peak_memory": totals.peak_memory,
        "c10d_calls": len(c10d),
        "c10d_bytes": sum(c.nbytes for c in c10d),
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
        "c10d collectives": f"{f['c10d_calls']} ({format_bytes(f['c10d_bytes'])})",
        "transfers": str(f["transfers"]),
        "tracer errors": str(f["tracer_errors"]),
    }


def rank_figures(session: RunView) -> dict[str, str]:
    """One column of the per-rank table."""
    return _rank_figure_text(_rank_figure_data(session))


_RANK_STOPS = ("RankDivergenceError", "RankTimeoutError")


def _agreement_data(sessions: list) -> dict[str, Any]:
    """Whether the ranks compiled the same multi-device programs and the same graphs, and which
    stopped or failed."""

    errors = [(rank, s.metadata().error or "") for rank, s in sessions]
    diff = compare_ranks([(rank, s.events("collectives")) for rank, s in sessions])
    same = None
    if diff is None and len(sessions) > 1:
        same = len([e for e in sessions[0][1].events("collectives") if not e.target])
    compiled = first_program_difference({rank: compiled_programs(s) for rank, s in sessions})
    return {
        "stopped": [{"rank": r, "error": e} for r, e in errors if e.startswith(_RANK_STOPS)],
        "difference": diff.render() if diff is not None else None,
        "compiled_difference": compiled.render() if compiled is not None else None,
        "same_programs": same,
        "failed": [{"rank": r, "error": e} for r, e in errors if e and not e.startswith(_RANK_STOPS)],
    }


#: rows of the collectives-in-order table shown per group before the first place the ranks differ
SEQUENCE_ROWS = 12


def _done_key(op: str, group: str, seq: int) -> tuple[str, bool, int]:
    # a group's sends and receives count their own sequence, so one seq can name two calls
    return group, op in P2P_OPS, seq


def _durations(record: Any) -> dict[tuple[str, bool, int], float] | None:
    """The rank's returns from its c10d collectives: seconds in each, by :func:`_done_key`;
    None for a run recorded before returns were (its calls' times are unknown, not missing)."""
    if record.dones is None:
        return None
    return {_done_key(d.op, d.group, d.seq): d.seconds for d in record.dones}


def _call_data(call: Any, seconds: dict[tuple[str, bool, int], float] | None,
               arrived: float | None = None) -> dict[str, Any] | None:
    if call is None:
        return None
    loc = call.location
    return {
        "op": call.op,
        "seconds": None if seconds is None else seconds.get(_done_key(call.op, call.group, call.seq)),
        "timed": seconds is not None,
        "arrived": arrived,
        "shapes": list(shape_texts(call.shapes)),
        "dtype": call.dtype,
        "nbytes": call.nbytes,
        "reduce_op": call.reduce_op,
        "peer": call.peer,
        "location": {"file": loc.file, "line": loc.line, "function": loc.function} if loc is not None else None,
    }


def _records(sessions: list, exit_status: dict[int, int] | None = None) -> dict[int, Any]:
    """Each rank's collectives (:class:`~tpu_debug.tracers.reading.collective_calls.RankRecord`), with the
    calls its journal kept past the run store's last commit."""

    return {rank: read_rank(rank, s, exit_status=(exit_status or {}).get(rank)) for rank, s in sessions}


def _starts(sessions: list) -> dict[int, float | None]:
    """Each rank's time 0 on a clock the ranks share (None if unknown): the monotonic clock
    when every rank ran on one machine and recorded where time 0 was on it (exact), else the
    runs' start times (wall clocks, to a millisecond)."""
    import datetime as _dt

    metas = {rank: s.metadata() for rank, s in sessions}
    if len({m.hostname for m in metas.values()}) == 1 and all(m.clock_origin is not None for m in metas.values()):
        return {rank: float(m.clock_origin) for rank, m in metas.items()}
    out: dict[int, float | None] = {}
    for rank, m in metas.items():
        try:
            out[rank] = _dt.datetime.fromisoformat(m.start_time).timestamp()
        except (TypeError, ValueError):
            out[rank] = None
    return out


def _entries(calls: dict[int, list], starts: dict[int, float | None]) -> dict[tuple[str, int], dict[int, float]]:
    """(group, seq) -> rank -> when the rank entered that collective, on one clock; sends and
    receives count apart and pair with no other rank's, so they are left out."""
    entered: dict[tuple[str, int], dict[int, float]] = {}
    for rank, events in calls.items():
        start = starts.get(rank)
        if start is None:
            continue
        for c in events:
            if c.op not in P2P_OPS:
                entered.setdefault((c.group, c.seq), {})[rank] = start + c.ts
    return entered


def _warm_up(calls: dict[int, list]) -> set[tuple[str, int]]:
    """Each call site's first collective per group, on any rank (see :func:`warm_up_calls`)."""
    return warm_up_calls(((c.group, c.seq), (rank, c.location)) for rank, events in calls.items() for c in events)


def collective_spans(sessions: list) -> dict[int, list[Any]]:
    """Each rank's c10d collectives as timeline spans (:class:`RankSpan`): from the rank's
    entry to its return, or, for a call it never returned from, to the last rank's entry
    (a sole rank's: 1 µs), one lane per group."""

    records = _records(sessions)
    calls = {rank: list(r.calls) for rank, r in records.items()}
    durations = {rank: _durations(r) for rank, r in records.items()}
    starts = _starts(sessions)
    entered = _entries(calls, starts)
    out: dict[int, list[Any]] = {}
    for rank, events in calls.items():
        if starts[rank] is None:
            continue
        spans = out.setdefault(rank, [])
        for c in events:
            begin = starts[rank] + c.ts
            timed = durations[rank] is not None
            seconds = durations[rank].get(_done_key(c.op, c.group, c.seq)) if timed else None
            if seconds is None:
                at = entered.get((c.group, c.seq), {})
                length = max(max(at.values()) - begin, 1e-6) if at else 1e-6
            else:
                length = max(seconds, 1e-6)
            spans.append(RankSpan(
                begin, length, f"group {c.group}", c.op,
                (("seq", str(c.seq)), ("shapes", ", ".join(shape_texts(c.shapes))), ("dtype", c.dtype),
                 ("bytes", str(c.nbytes)), ("line", str(c.location) if c.location is not None else ""),
                 ("returned", "yes" if seconds is not None else "no (stuck, raised or killed in it)" if timed
                  else "not recorded (a run of a version that did not record returns)")),
            ))
    return out


def _per_rank(calls: dict[int, list], durations: dict, entered: dict) -> list[dict[str, Any]]:
    per_rank = []
    for rank, events in calls.items():
        groups: dict[str, dict[str, Any]] = {}
        for c in events:
            g = groups.setdefault(c.group, {"group": c.group, "ranks": list(c.ranks), "count": 0, "bytes": 0,
                                            "waited": 0.0, "seconds": 0.0, "not_returned": 0, "ops": {}})
            g["count"] += 1
            g["bytes"] += c.nbytes
            op = g["ops"].setdefault(c.op, {"op": c.op, "count": 0, "bytes": 0, "seconds": 0.0})
            op["count"] += 1
            op["bytes"] += c.nbytes
            if durations[rank] is None:  # a run that did not record returns: times unknown
                g["seconds"] = op["seconds"] = None
            elif (seconds := durations[rank].get(_done_key(c.op, c.group, c.seq))) is None:
                g["not_returned"] += 1
            else:
                g["seconds"] += seconds
                op["seconds"] += seconds
            at = entered.get((c.group, c.seq), {})
            if rank in at and len(at) > 1:
                g["waited"] += max(at.values()) - at[rank]
        for g in groups.values():
            g["ops"] = list(g["ops"].values())
        per_rank.append({"rank": rank, "calls": len(events), "groups": list(groups.values())})
    return per_rank


def _sequence(calls: dict[int, list], durations: dict, entered: dict, first_diff: dict[str, int],
              rows: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    by_group: dict[str, dict[int, dict[int, Any]]] = {}
    members: dict[str, list[int]] = {}
    for rank, events in calls.items():
        for c in events:
            if c.op in P2P_OPS:
                continue
            members.setdefault(c.group, list(c.ranks))
            by_group.setdefault(c.group, {}).setdefault(c.seq, {})[rank] = c
    sequence = []
    for group in sorted(by_group, key=lambda g: (len(g), g)):
        seqs = by_group[group]
        ranks = [r for r in members[group] if r in calls]
        total = max(seqs)
        diff = first_diff.get(group)
        shown = [n for n in range(1, total + 1) if n <= rows or (diff is not None and diff <= n < diff + rows)]
        rows_data = []
        for n in shown:
            at = entered.get((group, n), {})
            first = min(at.values()) if len(at) > 1 else None
            rows_data.append({"seq": n, "calls": [
                {"rank": r, "call": _call_data(seqs.get(n, {}).get(r), durations[r],
                                               None if first is None or r not in at else at[r] - first)}
                for r in ranks]})
        sequence.append({"group": group, "ranks": ranks, "total": total, "first_difference": diff, "rows": rows_data})
    return sequence, members


def c10d_data(sessions: list, *, rows: int = SEQUENCE_ROWS, exit_status: dict[int, int] | None = None) -> dict[str, Any]:
    """The c10d collectives each rank entered, side by side, as data.

    Read from each rank's ``collective_call`` events and, for a rank whose process was
    killed, the calls its journal kept past the run store's last commit. ``per_rank``: per
    rank and group, the collectives' count, bytes and ``waited`` (seconds the rank waited
    at the group's collectives for the last rank to enter them: entry times on the
    machine's monotonic clock, or aligned by the runs' start times to a millisecond across
    machines), ``seconds`` (the rank's time in them, entry to return, from its
    ``collective_done`` events; None for a run recorded before returns were) and
    ``not_returned`` (calls it never returned from: stuck, raised or killed), by op.
    ``sequence``: per group, its collectives in order with each rank's call (its
    ``seconds``, None when it never returned, and ``arrived``: seconds after the first rank
    entered), the first ``rows`` and, when the ranks differ later, the rows from there on
    (``rows`` of ``total``). ``desyncs``: per group, where its ranks first differ, with the
    live error's text when a rank raised one. ``stragglers``: per group, the rank that
    entered last most often, when it stands out.

    Args:
        sessions: (rank, session) pairs of a multi-process run.
        rows: rows of each group's sequence shown before the first difference.
        exit_status: each rank's exit status, when the launcher recorded them.
    """

    records = _records(sessions, exit_status)
    calls = {rank: list(r.calls) for rank, r in records.items()}
    durations = {rank: _durations(r) for rank, r in records.items()}
    entered = _entries(calls, _starts(sessions))
    desyncs = group_desyncs(records)
    sequence, members = _sequence(calls, durations, entered,
                                  {d.group: d.desync.seq for d in desyncs if d.desync is not None}, rows)
    return {
        "per_rank": _per_rank(calls, durations, entered),
        "sequence": sequence,
        "desyncs": [
            {
                "group": d.group,
                "seq": d.seq,
                "reason": d.reason,
                "cause": d.cause,
                "live": d.live,
                "text": d.text,
                "calls": [] if d.desync is None else [
                    {"rank": r, "call": _call_data(c, durations.get(r))} for r, c in d.desync.calls],
            }
            for d in desyncs
        ],
        "stragglers": [
            {"group": st.group, "rank": st.rank, "last": st.last, "of": st.of, "late": st.late, "waited": st.waited}
            for st in stragglers(entered, members, _warm_up(calls))
        ],
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
        "status": group.status(),
        "launcher": info.launcher,
        "exit_status": list(info.exit_status) if info.exit_status else None,
        "missing": [r for r in range(nproc) if r not in dict(sessions)],
        "agreement": _agreement_data(sessions),
        "c10d": c10d_data(sessions, exit_status=dict(enumerate(info.exit_status)) if info.exit_status else None),
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
    if agreement.get("compiled_difference") is not None:
        console.print(Text(agreement["compiled_difference"]))
    if agreement["difference"] is not None:
        console.print(Text(f"compiled programs: {agreement['difference']}"))
    elif agreement["same_programs"]:
        console.print(Text(
            f"every rank compiled the same {agreement['same_programs']} multi-device program(s), with the same "
            "collectives, in the same order" + ("" if not agreement["stopped"] else " (up to where they stopped)")
        ))
    for fail in agreement["failed"]:
        console.print(Text(f"rank {fail['rank']} failed: {fail['error'].splitlines()[0]}"))


def _where(loc: dict | None) -> str:
    if loc is None:
        return ""
    return f" at {loc['file'].rsplit('/', 1)[-1]}:{loc['line']}"


def call_text(call: dict | None) -> str:
    """One rank's call at one collective: ``allreduce([4]; float32, AVG) 1.2 ms at train.py:12``
    (``never returned`` in place of its time when the rank did not come back from it; ``+52 ms``
    when it entered that much after the first rank), or ``-``."""
    if call is None:
        return "-"
    if not call.get("timed", True):
        took = ""
    else:
        took = " never returned" if call["seconds"] is None else " " + format_seconds(call["seconds"])
    arrived = call.get("arrived")
    late = f" (entered +{format_seconds(arrived)})" if arrived is not None and arrived >= 0.0005 else ""
    extra = f", {call['reduce_op']}" if call.get("reduce_op") else ""
    if call["op"] in ROOTED and call.get("peer") is not None:
        extra += f", root {call['peer']}"
    return (f"{call['op']}({', '.join(call['shapes']) or 'no tensors'}; {call['dtype'] or '-'}{extra}){took}{late}"
            f"{_where(call['location'])}")


def straggler_lines(c10d: dict) -> list[str]:
    """One line per group whose collectives one rank entered last most often."""
    return [
        f"straggler: rank {st['rank']} entered last at {st['last']} of {st['of']} collectives of group "
        f"{st['group']}, {format_seconds(st['late'])} after the rank before it on average "
        f"({format_seconds(st['waited'])} the others waited for it in all)"
        for st in c10d.get("stragglers", ())
    ]


def in_collectives_text(group: dict) -> str:
    """A rank's time in a group's collectives: ``4.1 ms``, with ``+1 never returned`` when
    it entered some it did not come back from."""
    if group["seconds"] is None:  # a run that did not record returns
        return "-"
    text = format_seconds(group["seconds"])
    return text + (f" +{group['not_returned']} never returned" if group["not_returned"] else "")


def ops_text(ops: list[dict]) -> str:
    """``allreduce 3 (48 B), barrier 1``: a group's collectives by op."""
    return ", ".join(
        f"{o['op']} {o['count']}" + (f" ({format_bytes(o['bytes'])})" if o["bytes"] else "") for o in ops
    )


def _print_c10d(console: Console, c10d: dict) -> None:
    if not any(r["calls"] for r in c10d["per_rank"]):
        return
    for d in c10d["desyncs"]:
        console.print(Text(f"collective desync: {d['text']}", style="bold red" if console.is_terminal else ""))
    for line in straggler_lines(c10d):
        console.print(Text(line))
    print_heading(console, "c10d collectives by rank")
    table = report_table(
        console.is_terminal, ("rank", "right"), ("group (ranks)", "left"), ("calls", "right"), ("bytes", "right"),
        ("waited", "right"), ("in them", "right"), ("by op", "left"), left_width=60,
    )
    for r in c10d["per_rank"]:
        for g in r["groups"]:
            table.add_row(
                Text(str(r["rank"])), Text(f"{g['group']} ({', '.join(map(str, g['ranks']))})"),
                Text(str(g["count"])), Text(format_bytes(g["bytes"])), Text(format_seconds(g["waited"])),
                Text(in_collectives_text(g)), Text(ops_text(g["ops"])),
            )
    console.print(table)
    console.print(dim_note(
        "waited: time at the group's collectives until the last rank entered them (entry times); in them: "
        "the rank's time from entering them to returning, waiting included"
    ))
    for seq in c10d["sequence"]:
        print_heading(console, f"c10d collectives in order, group {seq['group']}")
        # each cell whole, wrapped: the line at its end is what a reader looks for
        table = Table(box=box.SIMPLE_HEAD if console.is_terminal else box.ASCII2, show_edge=not console.is_terminal,
                      header_style="bold" if console.is_terminal else "")
        table.add_column("#", justify="right", no_wrap=True, min_width=len(str(seq["total"])))
        table.add_column("", no_wrap=True, min_width=1)
        for r in seq["ranks"]:
            table.add_column(f"rank {r}", overflow="fold")
        last = 0
        for row in seq["rows"]:
            if row["seq"] > last + 1:
                table.add_row(Text("…"), Text(""), *[Text("") for _ in seq["ranks"]])
            last = row["seq"]
            differ = row["seq"] == seq["first_difference"]
            table.add_row(
                Text(str(row["seq"])), Text("≠" if differ else "", style="bold red" if differ else ""),
                *[Text(call_text(c["call"])) for c in row["calls"]],
            )
        console.print(table)
        if len(seq["rows"]) < seq["total"]:
            console.print(dim_note(
                f"{len(seq['rows'])} of {seq['total']} collectives shown (the first ones"
                + (", and from where the ranks differ)" if seq["first_difference"] else ")") + "; all: report --json"
            ))


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
    _print_c10d(console, data["c10d"])
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
