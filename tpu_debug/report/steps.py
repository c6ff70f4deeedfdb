"""The report's steps section: per-step time, ops, programs and transfers, by phase."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.report.core import (
    NOT_MEASURED,
    dim_note,
    is_imported,
    kv_text,
    report_table,
    section,
)
from tpu_debug.report.findings import advice_of
from tpu_debug.tracers.events import TargetStepEvent, TargetSummaryEvent
from tpu_debug.tracers.reading.step_phases import STEADY, step_phases
from tpu_debug.tracers.reading.step_time import PARTS, goodput, split_step, verdict
from tpu_debug.tracers.reading.view import RunView


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


def _compiles_text(t: dict) -> str:
    """``3 compile(s) (1.20 s)``, and the programs read back from the compile cache, if any."""
    text = f"{t['compiles']} compile(s) ({format_seconds(t['seconds'])})"
    if t["read_backs"]:
        text += f", {t['read_backs']} read back from the compile cache ({format_seconds(t['read_back_seconds'])})"
    return text


def _steps_rows(d: dict) -> list[tuple[str, str]]:
    how = " and ".join(_DETECTED.get(x, x) for x in (d["detected"] or "").split("+"))
    rows = [("steps", f"{d['count']} ({how})")]
    c = d["compiles"]
    if d["warmup"]:
        rows.append((
            "warm-up",
            (f"step {_steps_range_text(d['warmup'])}: {_compiles_text(c['warmup'])}; first compiles, and ops "
            "compiled for several shapes at once, are expected here"),
        ))
    if c["setup"]["compiles"] or c["setup"]["read_backs"]:
        rows.append(("before steps", _compiles_text(c["setup"])))
    if d["steady"]:
        rows.append((
            "steady state",
            (f"{d['steady']} step(s), {format_seconds(d['step_seconds'])} and {d['ops_per_step']:,.0f} "
            f"op(s) per step (median); {_compiles_text(c['steady'])}"),
        ))
    if c["outside"]["compiles"] or c["outside"]["read_backs"]:
        rows.append(("outside steps", _compiles_text(c["outside"])))
    return rows


def _split_text(parts: dict[str, float] | None, seconds: float, *, least: float = 0.1) -> str:
    """A step's largest parts as shares of its time: ``input 83%, host 12%`` (parts under
    ``least`` of it left out; ``-`` for a step without a split)."""
    if parts is None:
        return "-"
    if seconds <= 0:
        return ""
    shown = sorted(((v / seconds, k) for k, v in parts.items() if v / seconds >= least), reverse=True)
    return ", ".join(f"{k} {100 * share:.0f}%" for share, k in shown[:3])


def _time_rows(d: dict) -> list[tuple[str, str]]:
    rows = []
    split = d.get("split")
    if split is not None and split["steady_seconds"]:
        whole = split["steady_seconds"]
        # in the parts' order, so the line reads the same from run to run
        parts = [(k, v / whole) for k, v in split["parts"].items() if v / whole >= 0.005]
        rows.append(("time split", "steady steps: " + ", ".join(f"{k} {100 * share:.0f}%" for k, share in parts)))
    v = d.get("verdict")
    if v is not None:
        rows.append(("bound", v["text"]))
    g = d.get("goodput")
    if g is not None and g["total_seconds"] > 0:
        bad = [b for b in g["badput"] if b["seconds"] > 0]
        rows.append((
            "goodput",
            (f"{100 * g['share']:.0f}% of {format_seconds(g['total_seconds'])} in productive steps; badput: "
             + (", ".join(f"{b['cause']} {format_seconds(b['seconds'])}" + (" (est.)" if b["estimated"] else "")
                          for b in bad) or "none")),
        ))
    return rows


def _render_steps(d: dict, terminal: bool) -> RenderableType:
    # warm-up against steady state, then the figures of a few steps
    if not d["per_step"]:
        return dim_note(
            "no steps: the run called neither optimizer.step() (with tpu parameters) nor tpu_debug.step(), "
            "and repeated no loop of ops; every compile counts as warm-up"
        )
    mfu = any(s.get("mfu") is not None for s in d["per_step"])
    columns = [("step", "right"), ("phase", "left"), ("time", "right"), ("went to", "left"), ("ops", "right"),
               ("dispatch", "right"), ("compiles", "right"), ("transfers", "right"), ("bytes", "right")]
    table = report_table(terminal, *columns, *([("MFU", "right")] if mfu else []))
    previous = None
    for s in _steps_shown(d["per_step"]):
        if previous is not None and s["index"] != previous + 1:
            table.add_row("...", *[""] * (len(columns) - 1 + mfu))
        previous = s["index"]
        table.add_row(
            str(s["index"]),
            s["phase"] if s["phase"] != STEADY or s["compiles"] == 0 else "steady (compiles)",
            format_seconds(s["seconds"]),
            _split_text(s["split"], s["seconds"]),
            "-" if s["eager_ops"] is None else f"{s['eager_ops'] + s['graph_runs']:,}",
            "-" if s["op_seconds"] is None else format_seconds(s["op_seconds"]),
            str(s["compiles"]),
            "-" if s["transfers"] is None else str(s["transfers"]),
            "-" if s["transfer_bytes"] is None else format_bytes(s["transfer_bytes"]),
            *([_mfu_text(s)] if mfu else []),
        )
    note = dim_note("time: from one step's end to the next, split into parts that add up to it (input, compile, sync, "
                    "collective, checkpoint, dispatch, host: docs/report_schema.md); went to: its largest parts "
                    "(session.steps.split() has each step's); dispatch: host time running its ops"
                    + ("; MFU: the target's flops over its estimated step time (a model estimate)" if mfu else "")
                    + ("; -: " + NOT_MEASURED if d["per_step"][0]["eager_ops"] is None else ""))
    return Group(kv_text(_steps_rows(d) + _time_rows(d)), table, note)


def _mfu_text(s: dict) -> str:
    if s.get("mfu") is None:
        return "-"
    text = f"{100 * s['mfu']:.2g}%"
    return text if s.get("mfu_measured") is None else f"{text} ({100 * s['mfu_measured']:.2g}% measured)"


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
    split = split_step(s)
    data["split"] = split.as_dict() if split is not None else None
    return data


def _add_mfu(session: RunView, per_step: list[dict[str, Any]]) -> None:
    """Each step's MFU on the run's TPU target: the target compiler's flops over the estimated
    step time (``mfu``), and on a TPU over the measured time too (``mfu_measured``)."""
    targets = {e.step: e for e in session.events(TargetStepEvent.kind) if not e.unfinished}
    summary = next(iter(session.events(TargetSummaryEvent.kind)), None)
    on_tpu = session.metadata().platform == "tpu"
    for s in per_step:
        t = targets.get(s["index"])
        s["mfu"] = t.mfu if t is not None else None
        s["mfu_measured"] = None
        if on_tpu and t is not None and summary is not None and s["seconds"] > 0:
            s["mfu_measured"] = t.flops / (s["seconds"] * summary.peak_flops)


def _time_data(session: RunView, steps: list, phases: list[str]) -> dict[str, Any]:
    """The split of the steady steps, the run's bound and its goodput (``tracers.reading.step_time``)."""
    steady = [sp for sp, p in ((split_step(s), p) for s, p in zip(steps, phases)) if sp is not None and p == "steady"]
    v = verdict(steps, phases)
    g = goodput(steps, phases, session.metadata().duration, session.steps.waits("checkpoint")) if steps else None
    return {
        "split": None if not steady else {
            "steady_seconds": sum(sp.seconds for sp in steady),
            "parts": {name: sum(sp.part(name) for sp in steady) for name in PARTS},
        },
        "verdict": None if v is None else {
            "bound": v.bound, "part": v.part, "share": v.share, "seconds": v.seconds,
            "steady_seconds": v.steady_seconds, "steps": v.steps, "warmup_only": v.warmup_only,
            "shares": dict(zip(PARTS, v.shares)), "text": v.render(),
        },
        "goodput": None if g is None else {
            "total_seconds": g.total_seconds, "goodput_seconds": g.goodput_seconds, "share": g.share,
            "ideal_step_seconds": g.ideal_step_seconds,
            "badput": [{"cause": b.cause, "seconds": b.seconds, "estimated": b.estimated, "text": b.text,
                        "share": b.seconds / g.total_seconds if g.total_seconds else 0.0} for b in g.badput],
        },
    }


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
def _steps(session: RunView) -> dict[str, Any]:
    summary = advice_of(session).steps
    steps = session.steps()
    phases = _phases(steps)

    per_step = [_step_data(s, phase, is_imported(session)) for s, phase in zip(steps, phases)]
    _add_mfu(session, per_step)

    def totals(t: Any) -> dict[str, Any]:
        return {"compiles": t.compiles, "recompiles": t.recompiles, "seconds": t.seconds,
                "read_backs": t.read_backs, "read_back_seconds": t.read_back_seconds}

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
        "per_step": per_step,
        **_time_data(session, steps, phases),
    }
