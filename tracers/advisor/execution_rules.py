"""The advisor's rules for how the step runs: graph breaks in compiled functions, eager steps of
many tiny ops, float64, divergence from PyTorch on CPU, and shardings XLA rematerializes.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_seconds
from tpu_debug.core.hlo_text import parse_sharding
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import (
    every_step,
    index_span,
    listing,
    most_common_line,
    plural,
    site_text,
    where_text,
)
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, ShardingRematEvent, SourceLocation

__all__ = ["DISPATCH_SHARE", "FLOAT64_BY_PYTORCH", "TINY_ELEMENTS", "TINY_OPS_MIN", "TINY_SHARE", "float64_origins"]

# An eager step is dispatch-bound when nearly all of its ops (TINY_SHARE of the executions)
# have inputs of at most TINY_ELEMENTS elements each, so a TPU does their work in far less time
# than the host takes to dispatch them, and what compiling would save (their time, less the one
# dispatch of the compiled program) is DISPATCH_SHARE of the step's time or more. TINY_OPS_MIN
# keeps the finding to steps that issue hundreds of ops (a Python loop over time steps or
# layers): a step of a few dozen small ops (a small model's layers) pays a few milliseconds of
# dispatch at most, which is the price of eager mode, not a defect of the program.
TINY_OPS_MIN = 400
TINY_SHARE = 0.9
TINY_ELEMENTS = 65536
DISPATCH_SHARE = 0.5


# dynamo's reasons for the two breaks a compiled training step hits at loss.backward(): without
# trace_autograd_ops it does not trace backward; with it, a loss returned still attached would
# need the graph backward consumed
_BACKWARD_UNTRACED = "Tensor.backward()"
_BACKWARD_CONSUMED = "consumed returned tensor's grad_fn"


def _backward_fix(reason: str) -> str | None:
    """The fix for a break at ``loss.backward()`` inside the compiled function, or None."""
    if _BACKWARD_UNTRACED in reason and "trace_autograd_ops" in reason:
        return (
            "compile the function with tpu_debug.compile (or set torch._dynamo.config.trace_autograd_ops "
            "= True before its first call) and return loss.detach() rather than the loss: dynamo then "
            "traces the backward and the .grad sums into the same graph, forward and backward one "
            "program per step"
        )
    if _BACKWARD_CONSUMED in reason:
        return (
            "return loss.detach() rather than the loss itself: the backward traced inside consumed the "
            "graph the returned loss would need"
        )
    return None


def _break_text(name: str, location: SourceLocation | None, context: str, backward: str | None) -> tuple[str, str]:
    """(what splits where, the fix) for a graph break at the user's ``location``; ``context``
    is the library frame that holds the break, empty when the break is in user code;
    ``backward`` the fix of a break at ``loss.backward()`` in user code (:func:`_backward_fix`)."""
    if backward is not None:
        return f"dynamo splits {name} at {where_text(location)}, the backward inside it", (
            f"{backward}; each break costs a program launch and a return to Python per call"
        )
    if not context:
        return f"dynamo splits {name} at {where_text(location)}", (
            "move the call dynamo cannot trace (named in the reason) out of the compiled function, or "
            "replace it: keep values as tensors (torch.where instead of if on a tensor, no .item() or "
            "print inside); each break costs a program launch and a return to Python per call"
        )
    file, _, rest = context.rpartition(":")
    library = f"{os.path.basename(file)}:{rest}"
    return f"dynamo splits the compiled code that {where_text(location)} runs, inside library code ({library})", (
        f"the break is in library code ({library}), not on your line: the line cannot be made traceable; "
        f"call what {where_text(location)} reaches outside the compiled function, or compile only the code "
        "around it; each break costs a program launch and a return to Python per call"
    )


@rule("graph_break", about="dynamo splits a compiled function that runs at every step", view="recompiles")
def graph_break(facts: RunFacts) -> Iterable[Finding]:
    # PyTorch's own deliberate breaks (the optimizer's graph_break(), its compiler.disable'd
    # bookkeeping) split off Python-only code that launches no program: nothing to fix
    breaks = [b for b in facts.graph_breaks if not b.deliberate]
    if not breaks:
        return
    ran = [s for s in facts.steady if s.graph_runs]
    if not every_step(facts, [s.index for s in ran]):
        return  # the function that broke is not called in steady state
    runs = sorted(s.graph_runs for s in ran)[len(ran) // 2]
    if runs < 2:
        return  # one compiled program per step: nothing is split where the step runs
    compiled = [o for o in facts.ops if o.mode == "compiled" and o.count]
    dispatch = sum(o.seconds for o in compiled) / max(1, sum(o.count for o in compiled))
    sites: dict[tuple, list[Any]] = {}
    for b in breaks:
        sites.setdefault((b.name, b.location, b.reason, b.context), []).append(b)
    for (name, location, reason, context), items in sites.items():
        backward = None if context else _backward_fix(reason or "")
        what, fix = _break_text(name, location, context, backward)
        where = (f"the break is in library code: {context}",) if context else ()
        yield Finding(
            kind="graph_break",
            severity="warning",
            title=(
                f"{what}; each of {len(ran)} steady steps runs {plural(runs, 'compiled program')} "
                "with Python in between"
            ),
            fix=fix,
            cost_seconds=len(ran) * dispatch,
            evidence=Evidence(
                location,
                (
                    Count("breaks recorded", len(items)),
                    Count("steady steps", len(ran)),
                    Count("compiled programs per step", runs),
                    Count("launch time per program", dispatch, "s"),
                ),
                (f"reason: {reason}", *where),
            ),
            steps=index_span([s.index for s in ran]),
            cause="library" if context else ("backward" if backward else "graph_break"),
            subject=f"{name}: {site_text(location)}",
            estimated=True,
        )


def _dispatch_floor(ops: Sequence[Any]) -> float:
    """What one eager op costs the host at the least: the 10th percentile of the run's
    per-execution times (the cheapest ops are almost all dispatch)."""
    return _dispatch_floor_of([(o.mean_seconds, o.count) for o in ops if o.count], 0.1)


def _dispatch_floor_of(means: Sequence[tuple[float, int]], quantile: float) -> float:
    """The ``quantile`` of per-execution times, from (mean time, executions) pairs."""
    means = sorted(means)
    total = sum(n for _, n in means)
    seen = 0
    for mean, n in means:
        seen += n
        if seen >= quantile * total:
            return mean
    return means[-1][0] if means else 0.0


def _tiny_share(facts: RunFacts) -> tuple[float, float] | None:
    """Of the run's eager executions, the share whose inputs are all small (at most
    :data:`TINY_ELEMENTS` elements each), and the typical time of one of those executions (the
    upper quartile), read from the compiled programs' arguments (per op when the run recorded
    no programs); None when no eager op ran. A quartile, not the mean, because an op's measured
    time also holds any wait for the device work queued before it (a small op after a large
    matmul), which is not its own."""
    sizes: dict[str, int] = {}
    largest: dict[str, int] = {}  # per op: its largest input over every program it compiled
    for c in facts.compiles:
        if c.mode == "eager":
            size = max((math.prod(a.shape) for a in c.args if a.shape is not None), default=0)
            largest[c.name] = max(largest.get(c.name, 0), size)
            if c.program is not None:
                sizes[c.program] = size
    programs = facts.query.programs(mode="eager")
    runs = [(p.count, p.seconds, sizes.get(p.hash, TINY_ELEMENTS + 1)) for p in programs]
    if not any(n for n, _, _ in runs):
        # a run without HLO records no programs: judge each op by the largest input it
        # compiled for (an op that ever ran on a large tensor counts as large)
        ops = [o for o in facts.ops if o.mode == "eager"]
        runs = [(o.count, o.seconds, largest.get(o.name, TINY_ELEMENTS + 1)) for o in ops]
    small = [(t / n, n) for n, t, size in runs if n and size <= TINY_ELEMENTS]
    total = sum(n for n, _, _ in runs)
    if not total:
        return None
    return sum(n for _, n in small) / total, _dispatch_floor_of(small, 0.75)


@rule(
    "eager_tiny_ops",
    about="an eager step of hundreds of small ops whose time is mostly dispatch, which compiling would fuse",
    view="steps",
)
def eager_tiny_ops(facts: RunFacts) -> Iterable[Finding]:
    steady = [s for s in facts.steady if s.eager_ops]
    if len(steady) < 2:
        return
    ops = sorted(s.eager_ops for s in steady)[len(steady) // 2]
    if ops < TINY_OPS_MIN:
        return
    shares = _tiny_share(facts)
    if shares is None or shares[0] < TINY_SHARE:
        return  # big ops: their time is the device's work, which compiling does not remove
    share, typical = shares
    floor = _dispatch_floor([o for o in facts.ops if o.mode == "eager"])
    step = sorted(s.seconds for s in steady)[len(steady) // 2]
    measured = sorted(s.op_seconds for s in steady)[len(steady) // 2]
    # What the step spends beyond dispatching its small ops is device work: the big ops' time, and
    # the time small ops spend waiting behind them (beyond a typical small op's; with no big op
    # there is nothing to wait behind, and a small op's device work is next to nothing). The rest
    # of the step is the host's: the ops' dispatch and the Python, dispatcher and autograd work
    # around each op, which compiling turns into one program's dispatch.
    device = max(0.0, measured - ops * share * typical) if share < 1 else 0.0
    dispatch = max(0.0, step - device)
    saved = max(0.0, dispatch - floor)
    if step <= 0 or saved < DISPATCH_SHARE * step:
        return  # the step's time is elsewhere (device work, data, Python): dispatch is not its cost
    yield _tiny_ops_finding(facts, steady, ops, share, floor, step, dispatch, saved)


def _tiny_ops_finding(facts: RunFacts, steady: Sequence[Any], ops: int, share: float, floor: float,
                      step: float, dispatch: float, saved: float) -> Finding:
    per_op = dispatch / ops  # the host's time per op: its dispatch and the Python around it
    # the line that issues the most distinct eager ops (the unrolled loop's body, usually):
    # ops are not located one by one unless op events are recorded, their compiles are
    where = most_common_line(c.location for c in facts.compiles if c.mode == "eager" and c.location is not None)
    return Finding(
        kind="eager_tiny_ops",
        severity="warning",
        title=(
            f"each steady step runs {ops:,} eager ops on small tensors, {format_seconds(per_op)} of host time each, "
            f"{100 * dispatch / step:.0f}% of the step's time on this machine; compiled, it would save about "
            f"{format_seconds(saved)} of its {format_seconds(step)} (an estimate)"
        ),
        fix=(
            "compile the step: step = tpu_debug.compile(step) (forward and backward become one program; "
            "the optimizer too with tpu_debug.compile(opt.step) and capturable=True), so the ops run as "
            f"one dispatch instead of {ops:,}; or run the loop in lazy mode (with torch.tpu.set_eager_mode("
            "torch.tpu.EagerMode.DEFER_AND_FUSE):), "
            "which fuses the ops between reads into one program"
        ),
        cost_seconds=saved * len(steady),
        evidence=Evidence(
            where,
            (
                Count("eager ops per step", ops),
                Count("small ops", round(100 * share), ""),
                Count("time per op", per_op, "s"),
                Count("dispatch time per step", dispatch, "s"),
                Count("step time", step, "s"),
                Count("saved per step", saved, "s"),
                Count("steady steps", len(steady)),
            ),
            (
                f"{100 * share:.0f}% of the eager ops have inputs of at most {TINY_ELEMENTS:,} elements: "
                "their time is dispatch, not device work",
                f"estimate: the step spends {format_seconds(dispatch)} of its {format_seconds(step)} on the host around its "
                "ops (their dispatch, the Python, dispatcher and autograd work between them); compiled, "
                f"that is one dispatch (about {format_seconds(floor)}, the run's 10th-percentile op time)",
            ),
        ),
        steps=index_span([s.index for s in steady]),
        cause="dispatch",
        subject="eager step",
        estimated=True,
    )


def _wide(arg: Any) -> bool:
    return arg.dtype in ("float64", "complex128")


def _from_python_floats(facts: RunFacts, compiles: dict[str, list[CompileEvent]]) -> list[str]:
    """The backward graphs whose only float64 values are 0-d scalars dynamo made from Python
    floats, not the user's tensors.

    Dynamo passes a Python float that changed between calls (a temperature, a scale read
    with ``.item()``) to the graph as a 0-d float64 CPU tensor: the forward graph reads it
    as a host scalar (recorded in the default float32) and saves it for the backward, whose
    input it is in float64. A 0-d float64 of the user's own is a device tensor: the forward
    graph has it as a float64 input too, and the finding stays.
    """
    forwards: dict[str, list[CompileEvent]] = {}
    for c in facts.compiles:
        if c.mode == "compiled" and c.name.endswith("/forward"):
            forwards.setdefault(c.name.rsplit("/", 1)[0], []).append(c)
    made = []
    for name, items in compiles.items():
        graph, _, kind = name.rpartition("/")
        if kind != "backward" or not forwards.get(graph):
            continue
        scalars = all(a.shape == () and a.dtype == "float64" for c in items for a in c.args if _wide(a))
        host = all(
            not any(_wide(a) for a in f.args) and any(a.shape == () for a in f.args) for f in forwards[graph]
        )
        if scalars and host:
            made.append(name)
    return made


# why a float64 op or graph is PyTorch's rather than the program's (no finding for it)
FLOAT64_BY_PYTORCH = {
    "print": "PyTorch's tensor printing computes in float64",
    "python_float": "a 0-d scalar dynamo made from a Python float",
}


def float64_origins(facts: RunFacts) -> dict[str, str]:
    """Each op or graph that ran with float64/complex128 values, and whose it is: ``"program"``
    (the float64 finding is about it) or a key of :data:`FLOAT64_BY_PYTORCH`.

    The float64 finding and the report's float64 section both read this, so they agree.
    """
    wide = facts.query.ops.float64()
    origins = dict.fromkeys(wide, "program")
    # printing a tpu tensor runs PyTorch's formatting code on the device, and it computes in
    # float64 (it calls .double()): ops compiled only at lines that printed a tensor are the
    # formatter's, not the program's
    printing = {(t.location.file, t.location.line) for t in facts.transfers if t.op == "print" and t.location}
    compiles = _float64_compiles(facts, wide)
    for name, items in compiles.items():
        if all(c.location is not None and (c.location.file, c.location.line) in printing for c in items):
            origins[name] = "print"
    for name in _from_python_floats(facts, compiles):
        origins[name] = "python_float"
    return origins


def _float64_compiles(facts: RunFacts, wide: dict) -> dict[str, list[CompileEvent]]:
    compiles: dict[str, list[CompileEvent]] = {}
    for c in facts.compiles:
        if c.name in wide and ("float64" in c.signature or "complex128" in c.signature):
            compiles.setdefault(c.name, []).append(c)
    return compiles


@rule("float64", about="float64 or complex128 values, which a TPU does not have", view="ops")
def float64(facts: RunFacts) -> Iterable[Finding]:
    origins = float64_origins(facts)
    everything = facts.query.ops.float64()
    wide = {name: everything[name] for name, origin in origins.items() if origin == "program"}
    if not wide:
        return
    compiles = _float64_compiles(facts, wide)
    names = sorted(wide, key=lambda n: (-wide[n][1], n))
    first = min((c for n in names for c in compiles.get(n, ())), key=lambda c: c.id, default=None)
    runs = sum(r for _, r in wide.values())
    # where the data entered: the first float64 upload (a tensor made on the device in float64
    # has none, and the first float64 op is the line to look at)
    entered = next((t for t in facts.transfers if t.direction == "h2d" and t.location is not None
                    and t.dtype in ("float64", "complex128", "torch.float64", "torch.complex128")), None)
    where = entered.location if entered is not None else (first.location if first is not None else None)
    facts_text = tuple(f"{n}: {wide[n][0]} program(s), {wide[n][1]} execution(s)" for n in names[:6])
    if entered is not None:
        facts_text = (f"float64 data uploaded here: {entered.dtype}{list(entered.shape)}",) + facts_text
        if first is not None and first.location is not None:
            facts_text += (f"first float64 op: {first.name} at {where_text(first.location)}",)
    yield Finding(
        kind="float64",
        severity="error",
        title=f"{plural(len(names), 'op')} ran in float64/complex128 ({listing(names, 4)}): a TPU has no float64",
        fix=(
            "make them float32 where the data enters: look for .double(), dtype=torch.float64, "
            "torch.from_numpy of float64 arrays, and Python floats made into tensors with the default dtype "
            "set to float64; on a TPU these ops fail or must be rewritten"
        ),
        cost_seconds=0.0,
        evidence=Evidence(where, (Count("ops", len(names)), Count("executions", runs)), facts_text),
        steps=None,
        cause="dtype",
        subject="float64",
        targets=tuple(names),
    )


def _g(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.2g}"


@rule("divergence", about="an op whose result leaves tolerance against PyTorch on CPU, or makes NaN/Inf", view="divergence")
def divergence(facts: RunFacts) -> Iterable[Finding]:
    first = facts.query.divergences.first()
    origin = facts.query.divergences.nan_origin()
    for event, what in ((first, "first"), (origin, "nan")):
        if event is None or (what == "nan" and first is not None and origin.id == first.id):
            continue
        name = f"{event.name} ({event.target}, {event.graph})" if event.mode == "compiled" else event.name
        step = facts.step_of(event.ts)
        if what == "nan":
            title = f"{name} makes NaN/Inf from finite inputs at {where_text(event.location)}"
            fix = "look at this op's inputs at that line: a division by zero, log or sqrt of a negative, an overflow"
        else:
            title = (
                f"{name} is the first op over tolerance against CPU at {where_text(event.location)} "
                f"({event.phase}): max abs {_g(event.max_abs)}, {_g(event.ratio)}x its tolerance"
            )
            if event.highest is True:
                fix = (
                    "it vanishes at precision 'highest': a bfloat16 matmul effect; set "
                    "torch.tpu.precision.set('highest') for this computation, or scale the data so the "
                    "signal survives bfloat16 (centre inputs with a large offset)"
                )
            elif event.highest is False:
                fix = "it remains at precision 'highest': not a matmul precision effect; compare this op's inputs and its lowering"
            else:
                fix = "compare this op's inputs on both sides; run with --numerics tpu to see whether bfloat16 matmuls explain it"
        yield Finding(
            kind="divergence",
            severity="error",
            title=title,
            fix=fix,
            cost_seconds=0.0,
            evidence=_divergence_evidence(event, f"{event.measure} measure, {event.mode} mode"),
            steps=(step, step) if step is not None else None,
            cause="nan" if what == "nan" else event.measure,
            subject=f"{what}: {name}",
        )
    fused = _fused_divergence(facts, first)
    if fused is not None:
        yield fused
    yield from _changed_decisions(facts)


def _changed_decisions(facts: RunFacts) -> Iterable[Finding]:
    """Decisions (argmax, argmin, topk, sort, comparisons) that the emulated TPU precision made
    otherwise than CPU float32 for a share of their results (verdict ``"precision"``, see
    ``tracers/recording/divergence/emulated_precision.py``): one finding per op and line, from its first event."""
    seen: set[tuple] = set()
    for event in facts.query.divergences(measure="drift"):
        if event.verdict != "precision" or (event.name, event.location) in seen:
            continue
        seen.add((event.name, event.location))
        crossing = event.crossings[0] if event.crossings else None
        changed = (f"{crossing.elements} of its {crossing.numel} results ({100 * crossing.elements / crossing.numel:.0f}%)"
                   if crossing is not None and crossing.numel else "some of its results")
        name = f"{event.name} ({event.target}, {event.graph})" if event.mode == "compiled" else event.name
        source = event.upstream or "a float32 product"
        step = facts.step_of(event.ts)
        yield Finding(
            kind="divergence",
            severity="error",
            title=(
                f"{name} at {where_text(event.location)} decides otherwise at the TPU's precision: {changed} differ "
                f"from CPU float32, because the values it compares come from {source}, computed in bfloat16 passes"
            ),
            fix=(
                f"compute what this decision compares at full precision: torch.tpu.precision.set('highest') (or "
                f"torch.set_float32_matmul_precision('highest')) for the product ({source}), six bfloat16 passes on a "
                "TPU, slower; or make the differences it decides on larger than bfloat16 keeps: centre the data "
                "(subtract its mean) before the product, so the products carry the differences and not an offset"
            ),
            cost_seconds=0.0,
            evidence=Evidence(
                event.location,
                (Count("results changed", crossing.elements if crossing else 0),
                 Count("results", crossing.numel if crossing else event.numel)),
                ((f"drift measure, {event.mode} mode: the op matches CPU on its own inputs, which differ from "
                  f"the CPU run's; they come from {source}"),),
            ),
            steps=(step, step) if step is not None else None,
            cause="decision",
            subject=f"decision: {name} {site_text(event.location)}",
        )


def _divergence_evidence(event: Any, how: str) -> Evidence:
    counts = (
        Count("max abs error", event.max_abs),
        Count("x tolerance", event.ratio),
        Count("elements over tolerance", event.mismatched),
    )
    return Evidence(event.location, counts, (f"{how}, {event.dtype}",))


def _fused_divergence(facts: RunFacts, first: Any) -> Finding | None:
    """The first node that drifts in a real compiled program whose outputs leave tolerance,
    unless the node check explained it as noise or already named that node."""
    event = facts.query.divergences.first("fused")
    if event is None or event.verdict == "noise":
        return None
    if first is not None and (first.graph, first.name) == (event.graph, event.name):
        return None
    name = f"{event.name} ({event.target}, {event.graph})"
    step = facts.step_of(event.ts)
    return Finding(
        kind="divergence",
        severity="error",
        title=(
            f"the compiled program's outputs leave tolerance against CPU; {name} at {where_text(event.location)} "
            f"({event.phase}) is the first node that drifts in the fused program: max abs {_g(event.max_abs)}, "
            f"{_g(event.ratio)}x its tolerance"
        ),
        fix=(
            "XLA's fused program computes this line otherwise than PyTorch op by op (constants folded, a "
            "reduction reassociated, an intermediate kept in another precision); if the difference matters, "
            "compute that line in a wider dtype (.float() before it) or keep it out of torch.compile"
        ),
        cost_seconds=0.0,
        evidence=_divergence_evidence(event, "fused measure, compiled mode"),
        steps=(step, step) if step is not None else None,
        cause="fused",
        subject=f"fused: {name}",
    )


def _sharding_text(sharding: str) -> str:
    """XLA's sharding string in words: ``{devices=[2,1,4]<=[4,2]T(1,0)}`` is "dim 0 split 2
    ways, dim 2 split 4 ways"; trailing tile dimensions that split no data are left out."""
    parsed = parse_sharding(sharding)
    if parsed.kind == "maximal":
        return "held by one device"
    if parsed.kind != "tiled":
        return "replicated" if parsed.kind == "replicated" else sharding
    split = [f"dim {d} split {n} ways" for d, n in enumerate(parsed.data_tiles) if n > 1]
    return ", ".join(split) if split else "replicated"


_RESHAPES = {"view", "view.default", "_unsafe_view", "_unsafe_view.default", "reshape", "reshape.default",
             "view_copy.default", "_reshape_alias.default", "flatten.using_ints", "unflatten.int"}


def _remat_fix(op: str) -> str:
    if op in _RESHAPES:
        return (
            "this reshape merges or splits a sharded dimension in a way XLA cannot keep sharded, so it gathers "
            "the tensor first: reshape only dimensions that are not sharded, or keep the sharded dimension "
            "outermost among those it merges (its size a multiple of the devices it is split over), or shard "
            "the tensor on a dimension the reshape leaves alone"
        )
    return (
        "the tensors this op combines are sharded differently and XLA cannot move between the two layouts "
        "with one collective: shard them the same way (one mark_sharding spec, or the same distribute_tensor "
        "placements, for every input the op meets), or, when the layout must change, reshard once outside "
        "the step (distribute_tensor into the new placements) instead of in every call"
    )


@rule("sharding_remat", about="XLA gathers a whole tensor onto every device to split it again, because the values "
      "an op combines are sharded differently (XLA's involuntary full rematerialization)", view="collectives")
def sharding_remat(facts: RunFacts) -> Iterable[Finding]:
    programs: dict[str, list[Any]] = collections.defaultdict(list)
    for e in facts.query.events(ShardingRematEvent.kind):
        if isinstance(e, ShardingRematEvent):
            programs[e.name].append(e)
    for name, events in programs.items():
        # the one XLA names by its FX node is the user's op; a resharded parameter is its input
        first = next((e for e in events if e.node), events[0])
        op = first.aten_op.removeprefix("aten::") or first.opcode or "an op"
        step = facts.step_of(first.ts)
        yield Finding(
            kind="sharding_remat",
            severity="warning",
            title=(
                f"{op} in {name} at {where_text(first.location)}: XLA gathers the whole tensor"
                + (f" ({first.shape} per device)" if first.shape else "")
                + f" onto every device to go from {_sharding_text(first.from_sharding)} to "
                f"{_sharding_text(first.to_sharding)}"
            ),
            fix=_remat_fix(op),
            cost_seconds=0.0,
            evidence=Evidence(first.location, (Count("rematerializations", len(events)),), tuple(
                f"HLO {e.instruction} = {e.shape} {e.opcode}" + (f" (FX node {e.node})" if e.node else "")
                + f": from {e.from_sharding} to {e.to_sharding}" for e in events[:4]
            )),
            steps=(step, step) if step is not None else None,
            cause="reshape" if op in _RESHAPES else "layouts",
            subject=f"{name}: {op} {site_text(first.location)}",
            targets=(name,),
        )
