"""What changed between two runs: per-step time, compiles, transfers, divergence, and findings.

``tpu-debug diff RUN_A RUN_B`` checks that a fix worked: record the program
before (A) and after (B), and the diff says what the change bought (steady-state
step time, recompiles, syncs per step) and which of the advisor's findings it
fixed or introduced. Findings are matched by :attr:`Finding.key` (the rule and
what it is about: an op or graph and the line, stable across runs of the same
program). :func:`diff_data` is the diff as data under :data:`DIFF_SCHEMA`
(``--json``; docs/report_schema.md), :func:`print_diff` the same in the
report's style. Both read the runs only: neither imports torch nor jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_seconds
from tpu_debug.report import advice_of, finding_text
from tpu_debug.report.core import dim_note, kv_text, make_console, report_table
from tpu_debug.tracers.advisor import FINDINGS_SCHEMA
from tpu_debug.tracers.reading.peak_buffers import KIND_TEXT, made_where
from tpu_debug.tracers.reading.step_phases import STEADY, StepIndex, step_phases
from tpu_debug.tracers.reading.view import RunView

__all__ = ["DIFF_SCHEMA", "FIGURES", "Figure", "diff_data", "print_diff", "run_figures"]

# the version of diff_data's layout: a reader checks it (docs/report_schema.md)
DIFF_SCHEMA = "tpu_debug.diff/1"


@dataclasses.dataclass(frozen=True, slots=True)
class Figure:
    """One figure compared between runs: its key in the JSON, its label, its unit
    (``""``, ``"s"``, ``"B"``); for every figure, less is better."""

    key: str
    label: str
    unit: str = ""


FIGURES = (
    Figure("steps", "steps"),
    Figure("steady_steps", "steady-state steps"),
    Figure("step_seconds", "step time (steady median)", "s"),
    Figure("ops_per_step", "ops per step (steady median)"),
    Figure("compiles", "compiles"),
    Figure("compile_seconds", "compile time", "s"),
    Figure("steady_compiles", "compiles in steady state"),
    Figure("steady_recompiles", "recompiles in steady state"),
    Figure("transfers", "transfers"),
    Figure("transfer_bytes", "bytes transferred", "B"),
    Figure("implicit_syncs", "implicit syncs"),
    Figure("transfers_per_step", "transfers per steady step"),
    Figure("transfer_bytes_per_step", "bytes per steady step", "B"),
    Figure("implicit_syncs_per_step", "implicit syncs per steady step"),
    Figure("divergences_over_tolerance", "ops over tolerance (vs CPU)"),
    Figure("max_divergence", "max divergence (error / tolerance)"),
    Figure("max_abs_divergence", "max |device - cpu|"),
    Figure("findings", "findings"),
    Figure("fit_memory_per_chip", "fit: HBM needed per chip", "B"),
    Figure("fit_step_seconds", "fit: step estimate", "s"),
    Figure("fit_wire_bytes_per_chip", "fit: collective bytes sent per chip", "B"),
    Figure("peak_bytes", "peak program: bytes at its peak (its compiler's)", "B"),
)
# lines (or inputs) whose bytes at the peak changed most that the diff lists
PEAK_CHANGES = 10


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def run_figures(session: RunView) -> dict[str, float | int | None]:
    """The figures :func:`diff_data` compares, of one run (keys: :data:`FIGURES`).

    Per-step figures are over the steady-state steps (None when the run has none);
    an implicit sync is a device-to-host transfer nobody asked for (``.item()``,
    ``print``, ``if t:``, a CPU fallback). Divergence figures are None when the
    run did not compare against CPU; the largest divergence is over the ops found
    over tolerance (the divergence tracer records those, not the error of an op
    within tolerance), so it is None too when every op was within tolerance.
    """
    advice = advice_of(session)
    summary = advice.steps
    steps = session.steps()
    phases = dict(zip((s.index for s in steps), step_phases(steps)))
    steady = [s for s in steps if phases[s.index] == STEADY]
    ops = session.ops()
    transfers = session.transfers()
    syncs = [t for t in transfers if t.implicit and t.direction == "d2h"]
    index = StepIndex(steps)
    steady_indexes = {s.index for s in steady}
    steady_syncs = sum(1 for t in syncs if index.step_of(t.ts) in steady_indexes)

    def per_step(total: float) -> float | None:
        return total / len(steady) if steady else None

    figures: dict[str, float | int | None] = {
        "steps": summary.steps,
        "steady_steps": summary.steady,
        "step_seconds": summary.step_seconds,
        "ops_per_step": summary.ops_per_step,
        "compiles": sum(o.compiles for o in ops),
        "compile_seconds": sum(o.compile_seconds for o in ops),
        "steady_compiles": summary.steady_compiles.compiles,
        "steady_recompiles": summary.steady_compiles.recompiles,
        "transfers": len(transfers),
        "transfer_bytes": sum(t.nbytes for t in transfers),
        "implicit_syncs": len(syncs),
        "transfers_per_step": per_step(sum(s.transfers for s in steady)),
        "transfer_bytes_per_step": per_step(sum(s.transfer_bytes for s in steady)),
        "implicit_syncs_per_step": per_step(steady_syncs),
        "divergences_over_tolerance": None,
        "max_divergence": None,
        "max_abs_divergence": None,
        "findings": len(advice.findings),
        **_fit_figures(session),
        "peak_bytes": None,
    }
    peak = session.memory.peak()
    if peak is not None:
        figures["peak_bytes"] = peak.total_bytes
    checked = session.divergences.summary()
    if checked is not None:
        # the local measure: each op against CPU on its own inputs, so an op is counted
        # once, not again for every op its error flows into
        figures["divergences_over_tolerance"] = checked.over_local
        over = session.divergences(measure="local", over=True)
        if over:
            figures["max_divergence"] = _finite(max(e.ratio for e in over))
            figures["max_abs_divergence"] = _finite(max(e.max_abs for e in over))
    return figures


def _last_fit(session: RunView) -> Any:
    fits = session.events("fit")
    return fits[-1] if fits else None


def _fit_figures(session: RunView) -> dict[str, float | int | None]:
    """A fit answer's figures (its last, when the run holds several; None without one)."""
    f = _last_fit(session)
    if f is None:
        return {"fit_memory_per_chip": None, "fit_step_seconds": None, "fit_wire_bytes_per_chip": None}
    wire = sum(c.wire_bytes for c in f.collectives) if f.step_seconds is not None else None
    return {"fit_memory_per_chip": f.required_bytes, "fit_step_seconds": f.step_seconds,
            "fit_wire_bytes_per_chip": wire}


def _fit_side(session: RunView) -> dict[str, Any] | None:
    f = _last_fit(session)
    if f is None:
        return None
    return {"model": f.model, "target": f.target, "plan": f.plan, "batch": f.batch, "seq": f.seq,
            "fits": f.fits,
            "required": f.required_bytes, "capacity": f.capacity_bytes, "headroom": f.headroom_bytes,
            "step_seconds": f.step_seconds, "tokens_per_second": f.tokens_per_second, "mfu": f.mfu}


def _peak_side(session: RunView) -> dict[str, Any] | None:
    """The program at the run's peak: its figures, its bytes by kind and by the line that made them."""
    e = session.memory.peak()
    if e is None:
        return None
    lines: dict[str, int] = {}
    for b in e.buffers:
        where = made_where(b) if b.count == 1 else f"smaller {b.kind} buffers"
        lines[where] = lines.get(where, 0) + b.nbytes
    return {"name": e.name, "source": e.source, "target": e.target, "status": e.status,
            "total_bytes": e.total_bytes, "by_kind": e.by_kind(), "by_line": lines}


def _changes(a: dict[str, int], b: dict[str, int], limit: int | None = None) -> list[dict[str, Any]]:
    """``{what, a, b, change}`` per key of either, the largest change first (0 for a key one lacks)."""
    keys = list(dict.fromkeys([*a, *b]))
    rows = [{"what": k, "a": a.get(k, 0), "b": b.get(k, 0), "change": b.get(k, 0) - a.get(k, 0)} for k in keys]
    rows = [r for r in rows if r["change"]] if limit is not None else rows
    rows.sort(key=lambda r: -abs(r["change"]))
    return rows[:limit] if limit is not None else rows


def _peak_data(a: Any, b: Any) -> dict[str, Any] | None:
    pa, pb = _peak_side(a), _peak_side(b)
    if pa is None and pb is None:
        return None
    return {
        "a": pa, "b": pb,
        "by_kind": _changes((pa or {}).get("by_kind", {}), (pb or {}).get("by_kind", {})),
        "by_line": _changes((pa or {}).get("by_line", {}), (pb or {}).get("by_line", {}), PEAK_CHANGES),
    }


def _run_data(session: RunView) -> dict[str, Any]:
    m = session.metadata()
    return {"name": m.name, "dir": str(session.run_dir), "status": m.status, "argv": list(m.argv)}


def diff_data(a: Any, b: Any) -> dict[str, Any]:
    """What changed from run ``a`` to run ``b``, as data under :data:`DIFF_SCHEMA`
    (docs/report_schema.md describes every field).

    Args:
        a: the run before (a Session from :func:`tpu_debug.open_run`).
        b: the run after.

    Returns:
        A dict of JSON values: ``figures`` (each ``{a, b, change, unit}``, ``change``
        being ``b - a``) and ``findings`` (``fixed``: in A, not in B; ``introduced``:
        in B, not in A; ``remaining``: in both, each ``{a, b}``).

    Example::

        data = diff_data(tpu_debug.open_run("before"), tpu_debug.open_run("after"))
        data["figures"]["implicit_syncs_per_step"], [f["kind"] for f in data["findings"]["fixed"]]
        # ({'a': 1.0, 'b': 0.0, 'change': -1.0, 'unit': ''}, ['implicit_sync'])
    """
    fa, fb = run_figures(a), run_figures(b)
    figures = {}
    for f in FIGURES:
        va, vb = fa[f.key], fb[f.key]
        change = vb - va if va is not None and vb is not None else None
        figures[f.key] = {"a": va, "b": vb, "change": change, "unit": f.unit}
    fit_a, fit_b = _fit_side(a), _fit_side(b)
    found_a = {f.key: f for f in advice_of(a).findings}
    found_b = {f.key: f for f in advice_of(b).findings}
    return {
        "schema": DIFF_SCHEMA,
        "a": _run_data(a),
        "b": _run_data(b),
        "figures": figures,
        "fit": None if fit_a is None and fit_b is None else {"a": fit_a, "b": fit_b},
        "peak": _peak_data(a, b),
        "findings_schema": FINDINGS_SCHEMA,
        "findings": {
            "fixed": [f.to_dict() for k, f in found_a.items() if k not in found_b],
            "introduced": [f.to_dict() for k, f in found_b.items() if k not in found_a],
            "remaining": [{"a": f.to_dict(), "b": found_b[k].to_dict()} for k, f in found_a.items() if k in found_b],
        },
    }


def _value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return format_seconds(value)
    if unit == "B":
        return format_bytes(int(value))
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3g}"


def _change_text(a: float | None, b: float | None, unit: str, terminal: bool) -> Text:
    if a is None or b is None:
        return Text("-")
    if a == b:
        return Text("same", style="dim" if terminal else "")
    sign = "+" if b > a else "-"
    text = f"{sign}{_value_text(abs(b - a), unit)}"
    if a:
        text += f" ({(b - a) / abs(a):+.0%})"
    return Text(text, style=("red" if b > a else "green") if terminal else "")


def _diff_renderables(data: dict[str, Any], a: Any, b: Any, terminal: bool) -> list[tuple[str, RenderableType]]:
    runs = kv_text([
        ("A", f"{data['a']['name']} ({data['a']['status']})"),
        ("", data["a"]["dir"]),
        ("B", f"{data['b']['name']} ({data['b']['status']})"),
        ("", data["b"]["dir"]),
    ])
    table = report_table(terminal, ("figure", "left"), ("A", "right"), ("B", "right"), ("change", "right"))
    for f in FIGURES:
        fig = data["figures"][f.key]
        table.add_row(Text(f.label), _value_text(fig["a"], f.unit), _value_text(fig["b"], f.unit),
                      _change_text(fig["a"], fig["b"], f.unit, terminal))
    figures = Group(table, dim_note("change is B - A; less is better for every figure; '-': not measured in that run"))

    fixed_keys = {(f["kind"], f["subject"]) for f in data["findings"]["fixed"]}
    new_keys = {(f["kind"], f["subject"]) for f in data["findings"]["introduced"]}
    fixed = [f for f in advice_of(a).findings if f.key in fixed_keys]
    introduced = [f for f in advice_of(b).findings if f.key in new_keys]
    cwd_a, cwd_b = a.metadata().cwd, b.metadata().cwd
    parts: list[tuple[str, RenderableType]] = [("Runs", runs), ("Figures", figures)]
    if data["fit"] is not None:
        parts.append(("Fit (A | B)", _fit_table(data["fit"], terminal)))
    if data["peak"] is not None:
        parts.append(("Peak memory (A | B)", _peak_table(data["peak"], terminal)))
    parts.append((
        f"Findings fixed ({len(fixed)})",
        Group(*(finding_text(f, terminal=terminal, cwd=cwd_a) for f in fixed))
        if fixed else dim_note("none: no finding of A is gone in B"),
    ))
    parts.append((
        f"Findings introduced ({len(introduced)})",
        Group(*(finding_text(f, terminal=terminal, cwd=cwd_b) for f in introduced))
        if introduced else dim_note("none: B has no finding A did not have"),
    ))
    remaining = data["findings"]["remaining"]
    if remaining:
        text = Text()
        for i, pair in enumerate(remaining):
            if i:
                text.append("\n")
            ca, cb = pair["a"]["cost_seconds"], pair["b"]["cost_seconds"]
            text.append(f"{pair['b']['title']} (cost {format_seconds(ca)} -> {format_seconds(cb)})")
            for c in pair["b"].get("consequences", ()):  # what the one cause led to, under it
                text.append(f"\n  led to: {c['text']}")
        parts.append((f"Findings in both ({len(remaining)})", text))
    return parts


def _peak_table(peak: dict[str, Any], terminal: bool) -> RenderableType:
    """The peak programs' bytes by kind, then by the lines whose bytes changed most."""
    def side(p: dict | None) -> str:
        if p is None:
            return "-"
        where = f" on {p['target']}" if p["target"] else ""
        refused = ", refused" if p["status"] == "hbm_oom" else ""
        return f"{p['name']}{where}: {format_bytes(p['total_bytes'])}{refused}"

    head = kv_text([("A", side(peak["a"])), ("B", side(peak["b"]))])
    table = report_table(terminal, ("at the peak", "left"), ("A", "right"), ("B", "right"), ("change", "right"))
    for row in peak["by_kind"]:
        table.add_row(Text(KIND_TEXT.get(row["what"], row["what"])), format_bytes(row["a"]), format_bytes(row["b"]),
                      _change_text(row["a"], row["b"], "B", terminal))
    for row in peak["by_line"]:
        table.add_row(Text(row["what"]), format_bytes(row["a"]), format_bytes(row["b"]),
                      _change_text(row["a"], row["b"], "B", terminal))
    return Group(head, table, dim_note("by kind, then the lines (or inputs) whose bytes at the peak changed most"))


def _fit_table(fit: dict[str, Any], terminal: bool) -> RenderableType:
    """The two fit answers side by side: the slice and plan, per-chip memory, the estimates."""
    a, b = fit["a"] or {}, fit["b"] or {}
    verdict = {True: "fits", False: "DOES NOT FIT", None: "refused"}

    def cell(side: dict, key: str) -> str:
        if not side:
            return "-"
        value = side[key]
        if key == "fits":
            return verdict[value]
        if key in ("required", "capacity"):
            return "-" if value is None else format_bytes(value)
        if key == "headroom":
            return "-" if value is None else (f"{format_bytes(value)} to spare" if value >= 0
                                              else f"{format_bytes(-value)} short")
        if key == "step_seconds":
            return format_seconds(value)
        if key == "tokens_per_second":
            return "-" if value is None else f"{value:,.0f}"
        if key == "mfu":
            return "-" if value is None else f"{value:.1%}"
        return str(value)

    table = report_table(terminal, ("", "left"), ("A", "right"), ("B", "right"))
    for key, label in (("model", "model"), ("target", "slice"), ("plan", "plan"), ("batch", "batch"),
                       ("seq", "seq"), ("fits", "verdict"), ("required", "HBM needed per chip"),
                       ("capacity", "usable per chip"), ("headroom", "headroom"),
                       ("step_seconds", "step estimate"), ("tokens_per_second", "tokens/s estimate"),
                       ("mfu", "MFU estimate")):
        table.add_row(Text(label), cell(a, key), cell(b, key))
    return Group(table, dim_note("estimates are the compiler's counts at published peaks, not measurements"))


def print_diff(a: Any, b: Any, *, file: Any = None, terminal: bool | None = None, width: int | None = None) -> None:
    """Print what changed from run ``a`` to run ``b`` to ``file`` (default stdout), in the
    report's style.

    Args:
        a: the run before (a Session).
        b: the run after.
        file: where to write.
        terminal: colors and box drawing (default: whether ``file`` is a terminal).
        width: the console width (default: the terminal's; plain text: ``$COLUMNS``, else 160).

    Example::

        print_diff(tpu_debug.open_run("before"), tpu_debug.open_run("after"))
    """
    console = make_console(file, terminal, width)
    is_terminal = console.is_terminal
    data = diff_data(a, b)
    heading = f"tpu_debug diff: {data['a']['name']} -> {data['b']['name']}"
    if is_terminal:
        console.rule(Text(heading, style="bold"))
    else:
        console.print(Text(heading))
        console.print(Text("=" * min(console.width, len(heading))))
    for title, body in _diff_renderables(data, a, b, is_terminal):
        console.print()
        console.print(Text(title, style="bold underline" if is_terminal else ""))
        console.print(body)
