"""The report's fit section: the answers of ``tpu_debug.fit`` kept in the run."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_count, format_seconds
from tpu_debug.report.core import (
    dim_note,
    kv_text,
    location_data,
    plain_record,
    report_table,
    section,
)
from tpu_debug.tracers.reading.view import RunView

_VERDICTS = {True: "fits", False: "does not fit", None: "refused"}


def _fit_data(e: Any) -> dict[str, Any]:
    compiler = None if e.total_bytes is None else {
        "arguments": e.argument_bytes, "outputs": e.output_bytes, "aliased": e.alias_bytes,
        "temporaries": e.temp_bytes, "code": e.code_bytes, "total": e.total_bytes, "host": e.host_bytes,
    }
    breakdown = None if e.total_bytes is None else {
        "parameters": e.parameter_bytes, "optimizer_state": e.optimizer_bytes, "batch": e.batch_bytes,
        "gradients": e.gradient_bytes, "activations": e.activation_bytes, "kv_cache": e.kv_cache_bytes,
    }
    estimate = None if e.step_seconds is None else {
        k: getattr(e, k) for k in ("compute_seconds", "memory_seconds", "comm_seconds", "step_seconds",
                                   "overlapped_seconds", "tokens_per_second", "model_flops", "mfu",
                                   "mfu_overlapped", "op_by_op_seconds", "mfu_op_by_op")
    }
    return {
        "model": e.model, "target": e.target, "chips": e.chips, "device_kind": e.device_kind, "plan": e.plan,
        "job": e.job, "batch": e.batch, "seq": e.seq, "parameters": e.parameters, "fits": e.fits,
        "verdict": _VERDICTS[e.fits],
        "per_chip": {"required": e.required_bytes, "capacity": e.capacity_bytes,
                     "capacity_source": e.capacity_source, "headroom": e.headroom_bytes,
                     "compiler": compiler, "breakdown": breakdown},
        "collectives": [plain_record(c) for c in e.collectives],
        "communication": [{**plain_record(b), "ratio": b.ratio} for b in e.communication],
        "estimate": estimate, "assumptions": list(e.assumptions), "unsharded": list(e.unsharded),
        "caveats": list(e.caveats), "error": e.error, "extrapolation": e.extrapolation,
        "method": e.method, "candidate_of": getattr(e, "candidate_of", None),
        "seconds": e.seconds, "compile_seconds": e.compile_seconds, "location": location_data(e.location),
    }


def _render_one_fit(f: dict, terminal: bool) -> list[RenderableType]:
    m = f["per_chip"]
    head = (f"{f['model']} ({format_count(f['parameters'])} parameters), {f['job']}, batch {f['batch']} x seq "
            f"{f['seq']} on {f['target']} ({f['chips']} x {f['device_kind']}), plan {f['plan']}: "
            f"{f['verdict'].upper()}")
    if f.get("candidate_of"):
        head = f"candidate of the search for the {f['candidate_of']}: {head}"
    rows = [("per chip", "-" if m["required"] is None else
             f"needs {format_bytes(m['required'])} of {format_bytes(m['capacity'])} usable "
             f"({m['capacity_source']}); " + (f"{format_bytes(m['headroom'])} to spare" if m["headroom"] >= 0
                                            else f"{format_bytes(-m['headroom'])} short"))]
    if m["breakdown"] is not None:
        rows.append(("breakdown", ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}"
                                            for k, v in m["breakdown"].items() if v is not None)))
    if m["compiler"] is not None and m["compiler"]["host"]:
        rows.append(("host memory", f"{format_bytes(m['compiler']['host'])} per chip offloaded by the checkpoint "
                     "policy (not in the HBM figures)"))
    e = f["estimate"]
    if e is not None:
        rows.append(("estimate", f"step ~{format_seconds(e['step_seconds'])} (compute "
                     f"{format_seconds(e['compute_seconds'])}, memory {format_seconds(e['memory_seconds'])}, "
                     f"communication {format_seconds(e['comm_seconds'])}), ~{e['tokens_per_second']:,.0f} "
                     f"tokens/s, MFU ~{e['mfu']:.1%} (not measured)"
                     + ("" if e.get("op_by_op_seconds") is None else
                        f"; op by op ~{format_seconds(e['op_by_op_seconds'])}, MFU ~{e['mfu_op_by_op']:.1%}")))
    if f["error"] and not f["fits"]:
        rows.append(("compiler", f["error"]))
    parts: list[RenderableType] = [Text(head, style="bold" if terminal else ""), kv_text(rows)]
    if f["collectives"]:
        table = report_table(terminal, ("collective", "left"), ("count", "right"), ("data/chip", "right"),
                       ("wire/chip", "right"), ("ICI time~", "right"))
        for c in f["collectives"]:
            table.add_row(c["kind"], f"{c['count']:,}", format_bytes(c["data_bytes"]),
                          format_bytes(c["wire_bytes"]), format_seconds(c["seconds"]))
        parts.append(table)
    if f["communication"]:
        parts += _render_bounds(f["communication"], terminal)
    parts.extend(dim_note(f"caution: {c}") for c in f["caveats"])
    if f["extrapolation"]:
        parts.append(dim_note(f"extrapolated: {f['extrapolation']}"))
    if f.get("method"):
        parts.append(dim_note(f"compiled as: {f['method']}"))
    return parts


def _render_bounds(bounds: list[dict], terminal: bool) -> list[RenderableType]:
    """Each collective kind beside the plan's least bytes of it, how that bound is counted,
    and, for a kind well over it, where the bytes come from."""
    table = report_table(terminal, ("communication", "left"), ("compiled/chip", "right"),
                         ("plan's bound", "right"), ("x bound", "right"))
    for b in bounds:
        table.add_row(b["kind"], format_bytes(b["compiled_bytes"]), format_bytes(b["bound_bytes"]),
                      "none needed" if b["ratio"] is None else f"{b['ratio']:.2f}x")
    parts: list[RenderableType] = [table]
    for b in bounds:
        parts.append(dim_note(f"{b['kind']} bound: {b['basis']}"))
        if b["reasons"]:
            parts.append(dim_note(f"{b['kind']} well over its bound; measured in the compiled HLO, the bytes "
                                  "come from: " + "; ".join(b["reasons"])))
    return parts


def _render_fit(d: list | None, terminal: bool) -> RenderableType | None:
    if not d:
        return None
    parts: list[RenderableType] = []
    for f in d:
        parts += _render_one_fit(f, terminal)
    parts.append(dim_note("compiled for the slice, not run: the estimates are the compiler's counts at "
                       "published peaks"))
    return Group(*parts)


@section("Fit on a TPU slice", order=68, key="fit", render=_render_fit)
def _fit(session: RunView) -> list[dict[str, Any]] | None:
    events = session.events("fit")
    return [_fit_data(e) for e in events] if events else None


# -- the report as data, and as text ---------------------------------------------------------
