"""The report's steps section: per-step time, ops, programs and transfers, by phase."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.report.findings import advice_of
from tpu_debug.report.core import (
    NOT_MEASURED,
    dim_note,
    is_imported,
    kv_text,
    report_table,
    section,
)
from tpu_debug.tracers.steps import STEADY, step_phases



def _steps_range_text(indexes: list[int]) -> str:
    ranges: list[list[int]] = []
    for i in indexes:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


_DETECTED = {
    "optimizer": "each optimizer.step()",
    "explicit": "each tpu_debug.step()",
    "loop": "the iterations of the loop the run repeated",
    "torch_trace": "the calls an imported TORCH_TRACE log shows compiling; it does not log the others",
}


def _steps_rows(d: dict) -> list[tuple[str, str]]:
    how = " and ".join(_DETECTED.get(x, x) for x in (d["detected"] or "").split("+"))
    rows = [("steps", f"{d['count']} ({how})")]
    c = d["compiles"]
    if d["warmup"]:
        rows.append((
            "warm-up",
            (f"step {_steps_range_text(d['warmup'])}: {c['warmup']['compiles']} compile(s) "
            f"({format_seconds(c['warmup']['seconds'])}); first compiles, and ops compiled for several shapes "
            "at once, are expected here"),
        ))
    if c["setup"]["compiles"]:
        rows.append(("before steps", f"{c['setup']['compiles']} compile(s) ({format_seconds(c['setup']['seconds'])})"))
    if d["steady"]:
        rows.append((
            "steady state",
            (f"{d['steady']} step(s), {format_seconds(d['step_seconds'])} and {d['ops_per_step']:,.0f} "
            f"op(s) per step (median); {c['steady']['compiles']} compile(s) ({format_seconds(c['steady']['seconds'])})"),
        ))
    if c["outside"]["compiles"]:
        rows.append(("outside steps", f"{c['outside']['compiles']} compile(s) ({format_seconds(c['outside']['seconds'])})"))
    return rows


def _render_steps(d: dict, terminal: bool) -> RenderableType:
    # warm-up against steady state, then the figures of a few steps
    if not d["per_step"]:
        return dim_note(
            "no steps: the run called neither optimizer.step() (with tpu parameters) nor tpu_debug.step(), "
            "and repeated no loop of ops; every compile counts as warm-up"
        )
    table = report_table(
        terminal,
        ("step", "right"),
        ("phase", "left"),
        ("time", "right"),
        ("ops", "right"),
        ("dispatch", "right"),
        ("compiles", "right"),
        ("compile time", "right"),
        ("transfers", "right"),
        ("bytes", "right"),
    )
    previous = None
    for s in _steps_shown(d["per_step"]):
        if previous is not None and s["index"] != previous + 1:
            table.add_row("...", "", "", "", "", "", "", "", "")
        previous = s["index"]
        table.add_row(
            str(s["index"]),
            s["phase"] if s["phase"] != STEADY or s["compiles"] == 0 else "steady (compiles)",
            format_seconds(s["seconds"]),
            "-" if s["eager_ops"] is None else f"{s['eager_ops'] + s['graph_runs']:,}",
            "-" if s["op_seconds"] is None else format_seconds(s["op_seconds"]),
            str(s["compiles"]),
            format_seconds(s["compile_seconds"]),
            "-" if s["transfers"] is None else str(s["transfers"]),
            "-" if s["transfer_bytes"] is None else format_bytes(s["transfer_bytes"]),
        )
    note = dim_note("time: from one step's end to the next; dispatch: host time running its ops (session.steps() has every step)"
                 + ("; -: " + NOT_MEASURED if d["per_step"][0]["eager_ops"] is None else ""))
    return Group(kv_text(_steps_rows(d)), table, note)


def _steps_shown(steps: list[dict], limit: int = 12) -> list[dict]:
    """The steps worth a row: warm-up ones, steady ones that compiled, the first and last
    steady ones; at most ``limit``."""
    steady = [s for s in steps if s["phase"] == STEADY]
    keep = {s["index"] for s in steps if s["phase"] != STEADY}
    keep |= {s["index"] for s in steady[:2]} | {s["index"] for s in steady[-1:]}
    keep |= {s["index"] for s in steady if s["compiles"]}
    by_index = {s["index"]: s for s in steps}
    return [by_index[i] for i in sorted(keep)[:limit]]


def _phases(steps: list) -> list[str]:
    return step_phases(steps)


# a step's figures a TORCH_TRACE log does not record (None in an imported run's data)
_UNLOGGED_STEP = ("eager_ops", "graph_runs", "op_seconds", "transfers", "transfer_bytes", "transfer_seconds",
                  "fallbacks")


def _step_data(s: Any, phase: str, imported: bool = False) -> dict[str, Any]:
    data = _step_fields(s, phase)
    if imported:
        data.update(dict.fromkeys(_UNLOGGED_STEP))
    return data


def _step_fields(s: Any, phase: str) -> dict[str, Any]:
    return {
        "index": s.index,
        "detected": s.detected,
        "phase": phase,
        "start": s.ts,
        "end": s.end,
        "seconds": s.seconds,
        "eager_ops": s.eager_ops,
        "graph_runs": s.graph_runs,
        "op_seconds": s.op_seconds,
        "compiles": s.compiles,
        "recompiles": s.recompiles,
        "compile_seconds": s.compile_seconds,
        "transfers": s.transfers,
        "transfer_bytes": s.transfer_bytes,
        "transfer_seconds": s.transfer_seconds,
        "fallbacks": s.fallbacks,
        "sequence": s.sequence,
    }


@section("Steps", order=5, key="steps", render=_render_steps)
def _steps(session: Any) -> dict[str, Any]:
    summary = advice_of(session).steps
    steps = session.steps()
    phases = _phases(steps)

    def totals(t: Any) -> dict[str, Any]:
        return {"compiles": t.compiles, "recompiles": t.recompiles, "seconds": t.seconds}

    return {
        "count": summary.steps,
        "detected": summary.detected,
        "warmup": list(summary.warmup),
        "steady": summary.steady,
        "step_seconds": summary.step_seconds,
        "ops_per_step": summary.ops_per_step,
        "op_seconds": summary.op_seconds,
        "compiles": {
            "setup": totals(summary.setup),
            "warmup": totals(summary.warm),
            "steady": totals(summary.steady_compiles),
            "outside": totals(summary.tail),
        },
        "per_step": [_step_data(s, phase, is_imported(session)) for s, phase in zip(steps, phases)],
    }
