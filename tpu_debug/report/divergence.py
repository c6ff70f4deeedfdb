"""The report's divergence section: where the device's numbers first leave the CPU reference, site by site."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.report.core import (
    dim_note,
    full_where,
    kv_text,
    location_data,
    report_table,
    section,
    where_text,
)
from tpu_debug.tracers.events import DivergenceSummaryEvent
from tpu_debug.tracers.reading.view import RunView


def _divergence_rows(d: dict) -> list[tuple[str, str]]:
    """What was compared, under which numerics and tolerances, and what stood out."""
    compared = f"{d['ops_compared']} eager ops"
    if d["ops_copied"]:
        compared += f" (+{d['ops_copied']} not compared: random ops, data loaded from the host)"
    if d["graphs_compared"]:
        compared += f", {d['graphs_compared']} graph runs / {d['nodes_compared']} nodes"
    numerics = d["numerics"]
    if numerics != "cpu":
        numerics += f", float32 product precision {d['precision']!r}"
    rows = [("compared", compared), ("numerics", numerics), ("tolerances", str(d["tolerances"]))]
    first, drifted, origin = d["first"], d["drift"], d["nan_origin"]
    if first is not None:
        rows.append(("first", _divergence_line(first)))
        if first["triage"]:
            rows.append(("verdict", first["triage"]))
    elif d["over_tolerance"] and d["sample"] > 1:
        hint = (
            "no sampled node is over tolerance itself, but results drift (below): "
            "run with divergence_sample=1 (--divergence-sample 1) to name the node"
        )
        rows.append(("first", hint))
    else:
        rows.append(("first", "every op compared is within tolerance of PyTorch on CPU (local measure)"))
    if drifted is not None:
        # the first drift's cause: a wrong op before it, or noise (through a zero crossing)
        rows.append(("drift", (f"{drifted['site']} at {full_where(drifted['location'])} ({drifted['phase']}): "
                              f"{drifted['triage']}")))
    if d.get("fused") is not None:
        rows.append(("fused", ("the compiled program's outputs leave tolerance; first node that drifts in the "
                               f"fused program: {_divergence_line(d['fused'])}")))
    if origin is not None:
        rows.append(("NaN/Inf from", (f"{origin['site']} at {full_where(origin['location'])} "
                                     "(made them from finite inputs)")))
    if d["not_compared"]:
        rows.append(("not compared", ", ".join(d["not_compared"]) + " (no CPU kernel for these calls)"))
    return rows


def _render_divergence(d: dict | None, terminal: bool) -> RenderableType:
    # what was compared and the first op over tolerance, then the sites ranked
    if d is None:
        return dim_note("numerical divergence against CPU was not checked in this run (trace with divergence=True, or --divergence)")
    parts: list[RenderableType] = [kv_text(_divergence_rows(d))]
    if d["sites"]:
        parts += _divergence_sites(d["sites"], terminal)
    return Group(*parts)


def _is_first(e: Any) -> bool:
    return e.first and e.measure == "local"


def _site_key(e: Any) -> tuple:
    """A divergence site: the same op or node, measure and phase at the same line."""
    loc = e.location
    return (e.mode, e.measure, e.phase, e.graph, e.name, loc.file if loc else None, loc.line if loc else None)


def _rank_sites(sites: dict[tuple, list]) -> list[tuple[tuple, list]]:
    """The first over tolerance on top, then local before drift, NaN origins, worst error."""
    return sorted(
        sites.items(),
        key=lambda kv: (
            not any(_is_first(e) for e in kv[1]),
            kv[0][1] != "local",
            not any(e.nan_origin for e in kv[1]),
            -max(e.ratio for e in kv[1]),
        ),
    )


def _divergence_sites(sites: list[dict], terminal: bool) -> list[RenderableType]:
    """The ten worst local sites and five worst drift sites, with a legend."""
    local = [s for s in sites if s["measure"] == "local"]
    drift = [s for s in sites if s["measure"] != "local"]
    shown = local[:10] + drift[:5]
    table = report_table(
        terminal,
        ("op / node", "left"),
        ("where", "left"),
        ("measure", "left"),
        ("count", "right"),
        ("max abs", "right"),
        ("x tol", "right"),
        ("f64", "left"),
        ("highest", "left"),
    )
    for column, words in zip(table.columns[-2:], ("noise", "vanishes")):
        column.min_width = len(words)  # verdict words: never cut, the location gives way instead
    for s in shown:
        mark = ">> " if s["first"] else ("NaN " if s["nan_origin"] else "")
        table.add_row(
            Text(mark + s["site"], style="bold" if s["first"] and terminal else ""),
            Text(where_text(s["location"])),
            s["measure"] + (" bwd" if s["phase"] == "backward" else ""),
            str(s["count"]),
            _g(s["max_abs"]),
            _g(s["ratio"]),
            s["verdict"] or "-",
            "vanishes" if s["highest"] else ("remains" if s["highest"] is False else "-"),
        )
    parts: list[RenderableType] = [table]
    hidden = len(sites) - len(shown)
    if hidden:
        parts.append(dim_note(f"... and {hidden} more sites ({len(drift) - min(len(drift), 5)} of them drift)"))
    parts.append(dim_note(
        ">> the first op over tolerance; local = the CPU op on the device's own inputs (where error "
        "enters), drift = against a CPU run of the whole computation (how it spreads); x tol = worst "
        "error in units of its tolerance; f64 = the triage verdict: noise (rounding: in float64 the device matches CPU, "
        "or every op before it does) or wrong (in float64 the device still differs, here or before); "
        "highest = at precision 'highest' (TPU numerics)"
    ))
    return parts


def _verdict_cell(items: list) -> str:
    """A site's triage verdict (the first of its events that has one); "wrong" wins."""
    verdicts = {e.verdict for e in items if e.verdict}
    if "wrong" in verdicts:
        return "wrong"
    return "noise" if verdicts else ""


def _g(value: float | None) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.2g}"


def _site_name(e: Any) -> str:
    if e.mode == "compiled":
        return f"{e.name} ({e.target}, {e.graph})"
    return e.name + (f" ({e.autograd_node})" if e.autograd_node else "")


def _divergence_line(e: dict) -> str:
    text = (
        f"{e['site']} at {full_where(e['location'])} ({e['mode']}, {e['phase']}): max abs {_g(e['max_abs'])}, "
        f"max rel {_g(e['max_rel'])}"
    )
    if e["ulp"] is not None:
        text += f", {_g(e['ulp'])} ULP ({e['dtype']})"
    text += f", {e['mismatched']}/{e['numel']} elements over tolerance (rtol {e['rtol']:g}, atol {e['atol']:g})"
    if e["dtype_mismatch"]:
        text += f"; dtype {e['device_dtype']} on tpu, {e['dtype']} on CPU"
    if e["highest"] is True:
        text += "; within tolerance at precision 'highest': a bfloat16-precision effect (torch.tpu.precision.set('highest') removes it)"
    elif e["highest"] is False:
        text += "; still over tolerance at precision 'highest': not a matmul-precision effect"
    return text


def _divergence_event_data(e: Any) -> dict[str, Any]:
    fields = ("name", "mode", "measure", "phase", "graph", "target", "autograd_node", "max_abs", "max_rel", "ulp",
              "ratio", "mismatched", "numel", "dtype", "device_dtype", "dtype_mismatch", "rtol", "atol", "highest",
              "verdict", "nan_origin", "first", "over")
    data = {f: getattr(e, f) for f in fields}
    data.update(site=_site_name(e), location=location_data(e.location), triage=e.triage_text(),
                crossings=len(e.crossings))
    return data


def _divergence_site_data(key: tuple, items: list, counts: dict) -> dict[str, Any]:
    worst = max(items, key=lambda e: (e.ratio, e.max_abs))
    return {
        "site": _site_name(worst),
        "mode": worst.mode,
        "measure": worst.measure,
        "phase": worst.phase,
        "location": location_data(worst.location),
        "count": counts.get(key, len(items)),
        "max_abs": worst.max_abs,
        "ratio": worst.ratio,
        "verdict": _verdict_cell(items),
        "highest": next((e.highest for e in items if e.highest is not None), None),
        "first": any(_is_first(e) for e in items),
        "nan_origin": any(e.nan_origin for e in items),
    }


@section("Divergence", order=60, key="divergence", render=_render_divergence)
def _divergence(session: RunView) -> dict[str, Any] | None:
    summary = session.divergences.summary()
    events = session.divergences()
    if summary is None and not events:
        return None
    if summary is None:  # the trace ended before the tracer wrote its summary

        summary = DivergenceSummaryEvent(
            0, 0.0, None, 0, None, numerics="cpu", precision="?", tolerances="default", sample=1,
            ops_compared=0, ops_copied=0, graphs_compared=0, nodes_compared=0, over_local=0, over_drift=0,
            nan_origins=0,
        )
    first = next((e for e in events if _is_first(e)), None)
    drifted = next((e for e in events if e.measure == "drift" and e.over and e.triage_text()), None)
    if drifted is not None and not (first is None or drifted.verdict != first.verdict or drifted.crossings):
        drifted = None  # the same verdict as the first op's says nothing new
    origin = next((e for e in events if e.nan_origin), None)
    fused = next((e for e in events if e.measure == "fused" and e.first), None)
    sites: dict[tuple, list] = {}
    for e in events:
        sites.setdefault(_site_key(e), []).append(e)
    # the summary counts every divergence of a site; the events kept may be fewer
    counts = {(s.mode, s.measure, s.phase, s.graph, s.name, s.file, s.line): s.count for s in summary.sites}
    return {
        "checked": True,
        "ops_compared": summary.ops_compared,
        "ops_copied": summary.ops_copied,
        "graphs_compared": summary.graphs_compared,
        "nodes_compared": summary.nodes_compared,
        "numerics": summary.numerics,
        "precision": summary.precision,
        "tolerances": summary.tolerances,
        "sample": summary.sample,
        "not_compared": sorted(u.op for u in summary.not_compared),
        "over_tolerance": any(e.over for e in events),
        "first": _divergence_event_data(first) if first is not None else None,
        "drift": _divergence_event_data(drifted) if drifted is not None else None,
        "fused": _divergence_event_data(fused) if fused is not None else None,
        "nan_origin": _divergence_event_data(origin) if origin is not None else None,
        "sites": [_divergence_site_data(k, items, counts) for k, items in _rank_sites(sites)],
    }
