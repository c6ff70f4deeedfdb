"""The advisor's rules for where the steps' time goes: a steady state bound by something other
than the device's work (``tracers/reading/step_time.py`` splits each step's time and names the bound).

A run is input-, sync-, compile-, collective- or checkpoint-bound when that part of the split
holds at least :data:`BOUND_SHARE` of a typical steady step's time (its median share over the
steady steps: one step's one-off compile is no bound); the finding names the bound,
its share and seconds, the lines behind it, and a fix chosen from what was measured there
(the loader's settings, the reads' lines, the compiles' lines, the collective's line).

A collective-bound run is named only when the ranks waited for each other for that share
(the live check's arrival times): a step whose collectives cost their own exchange, alike on
every rank, is not a rank to fix.

It is one finding about the run, and not a second one about a line another rule already
named: when the findings of the rules that look at the same events (the views: transfers
for input and syncs, recompiles for compiles, collectives for collectives) cost at least
:data:`COVERED_SHARE` of the bound part's time, they are the answer and this rule is
silent; the report's Steps section still shows the bound. A host-bound run gets no finding
here: on an eager step the host's time is the runtime's work per op, which the
``eager_tiny_ops`` rule judges by the ops' sizes, and a device-bound run is a correct one.

An optimizer left outside a compiled model (``split_step``) is the other rule here: the model
runs as compiled programs, ``optimizer.step()`` op by op after them (at least
:data:`OPTIMIZER_OPS_MIN` ops), and the optimizer's host work is at least half of a typical
steady step.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_location, format_seconds
from tpu_debug.tracers.advisor.execution_rules import _dispatch_floor, eager_tiny_ops
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import index_span, most_common_line
from tpu_debug.tracers.advisor.registry import RULES, rule
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.reading.step_time import PARTS, Verdict, split_step, verdict

__all__ = [
    "BOUND_SHARE",
    "COVERED_SHARE",
    "INPUT_FLOOR_SECONDS",
    "OPTIMIZER_OPS_MIN",
    "OPTIMIZER_SHARE",
    "optimizer_outside_step",
    "step_bound",
]

# a part holding at least half of a typical step's time is what bounds it: removing any other
# part cannot make the step more than twice as fast
BOUND_SHARE = 0.5
# other rules' findings about the same events explain the bound when they cost this share of it
COVERED_SHARE = 0.5
# a typical steady step's wait for its batch under this is no input bound worth a finding: the
# fixes it names (loader workers, pinned memory, prefetch) cost about a millisecond per batch
# themselves (a process hand-off, the batch's pickling or shared-memory set-up), so a few
# milliseconds of loading is not shown to be won back by them
INPUT_FLOOR_SECONDS = 0.01
# an optimizer left outside a compiled step is worth a finding when its host work (its Python and
# one dispatch per op, which compiling it into the step's program removes) is at least half of a
# typical steady step: the step would be at least twice as fast, as for BOUND_SHARE. A lower share
# is what a compiled model with a foreach optimizer spends on small models (a fifth to two fifths
# here), and it moves with the machine's load: a finding there would come and go between runs
OPTIMIZER_SHARE = 0.5
# and when it runs at least this many eager ops per step: an optimizer over many parameters one
# by one (foreach=False, or one without foreach kernels), a few ops per parameter. A foreach
# optimizer (PyTorch's default here) runs a handful whatever its size (Adam 7), whose share of a
# small model's step sits around half and moves with the machine's load: a finding there would
# come and go between two runs of the same program
OPTIMIZER_OPS_MIN = 32
# the TUI views whose rules' findings are about each part's events
_RELATED_VIEWS = {
    "input": ("transfers",),
    "sync": ("transfers",),
    "compile": ("recompiles",),
    "collective": ("collectives",),
    "checkpoint": (),
}


@rule("step_bound", about="a steady state whose time goes mostly to waiting for input, syncs, compiles, "
      "collectives or checkpoint saves rather than the device's work", view="steps")
def step_bound(facts: RunFacts) -> Iterable[Finding]:
    v = verdict(facts.steps, [facts.phases[s.index] for s in facts.steps])
    if v is None or v.warmup_only or v.part not in _RELATED_VIEWS or v.share < BOUND_SHARE:
        return
    if len(facts.steady) < 2:
        return
    if v.part == "input" and v.seconds < INPUT_FLOOR_SECONDS * max(v.steps, 1):
        return
    if v.part == "collective" and _ranks_waited(facts) < BOUND_SHARE * v.steady_seconds:
        return
    if _covered(facts, v):
        return
    yield _BUILDERS[v.part](facts, v)


@rule("split_step", about="a compiled model whose optimizer.step() runs outside it, op by op over many "
      "parameters, for at least half of each step", view="steps")
def optimizer_outside_step(facts: RunFacts) -> Iterable[Finding]:
    """The model runs as compiled programs and ``optimizer.step()`` runs eagerly after them, at
    least :data:`OPTIMIZER_OPS_MIN` ops, and the optimizer's host work holds at least
    :data:`OPTIMIZER_SHARE` of a typical steady step: one program for the whole step would do
    (TorchTPU's guide compiles the training step whole). Silent where the optimizer is compiled
    too (its ops are then graph runs), in lazy mode (its ops are deferred into the step's
    graph), and where it costs a small share.

    The host work is an estimate: the optimizer's Python (its time outside its ops and their
    compiles), and each of its ops at the run's cheapest op time (its dispatch; at its own mean
    where that is less). Its ops' own
    measured time is not used: it holds the wait for the model's device work queued before
    them, which compiling the step does not remove."""
    split = [s for s in facts.steady if s.graph_runs and s.optimizer_ops]
    if len(split) < 2 or 2 * len(split) < len(facts.steady):
        return
    ops = _median([s.optimizer_ops for s in split])
    if ops < OPTIMIZER_OPS_MIN:
        return
    floor = _dispatch_floor([o for o in facts.ops if o.mode == "eager"])
    # each op's dispatch at the run's cheapest op time, or at its own where that is less: the
    # host work stays within the optimizer's time, the rest of which is its ops' waits
    hosts = [
        max(0.0, s.optimizer_seconds - s.optimizer_op_seconds)
        + s.optimizer_ops * min(floor, s.optimizer_op_seconds / s.optimizer_ops)
        for s in split
    ]
    # the median step's share: another process's load stalls one part of a step or another, and
    # one long stall moves a total (or a quartile of each part) but not the middle step's share
    share = _median([h / s.seconds if s.seconds > 0 else 0.0 for h, s in zip(hosts, split)])
    if share < OPTIMIZER_SHARE or any(eager_tiny_ops(facts)):
        return  # a small share; or hundreds of small eager ops per step, whose finding names the same fix
    host, step = _median(hosts), _median([s.seconds for s in split])
    total = _median([s.optimizer_seconds for s in split])
    where = most_common_line(s.location for s in split)
    yield Finding(
        kind="split_step",
        severity="warning",
        title=(
            f"optimizer.step() runs outside the compiled model, {ops} eager op(s) per step: about "
            f"{format_seconds(host)} of host work in a {format_seconds(step)} step ({100 * share:.0f}%) "
            "on this machine, which one program for the whole step would not spend (an estimate)"
        ),
        fix=(
            "compile the whole step, as TorchTPU's guide does: one function that runs the forward, "
            "loss.backward() and optimizer.step(), compiled with step = tpu_debug.compile(step), so the "
            f"update runs inside the step's program instead of as {ops} dispatches with the optimizer's "
            "Python around them; or at least compile the optimizer's step (opt_step = "
            "torch.compile(opt.step, backend=\"tpu_debug\"); capturable=True for Adam-style optimizers)"
        ),
        cost_seconds=host * len(split),
        evidence=Evidence(
            where,
            (
                Count("optimizer host work per step", host, "s"),
                Count("share of a steady step", round(100 * share)),
                Count("optimizer.step() time per step", total, "s"),
                Count("optimizer eager ops per step", ops),
                Count("compiled program runs per step", _median([s.graph_runs for s in split])),
                Count("step time", step, "s"),
                Count("steady steps", len(split)),
            ),
            (
                (
                    f"estimate: the optimizer's Python (its time outside its ops and their compiles) and "
                    f"each of its {ops} ops at most at the run's cheapest op time ({format_seconds(floor)}, its "
                    f"dispatch); the rest of optimizer.step()'s {format_seconds(total)} is its ops waiting "
                    "for the device, which a whole-step program spends too"
                ),
            ),
        ),
        steps=index_span([s.index for s in split]),
        cause="optimizer",
        subject=f"split step: {_where(where)}",
        estimated=True,
    )


def _median(values: Sequence[Any]) -> Any:
    return sorted(values)[len(values) // 2]


def _ranks_waited(facts: RunFacts) -> float:
    """The steady steps' time in collectives spent waiting for a later rank: the live check's
    ``waited`` where it saw the ranks arrive, the whole call where it did not. The rest of a
    call is the exchange itself (the host copies and the transport here, the interconnect on
    a TPU), which every rank pays alike and the collectives' own views show."""
    dones = _steady_events(facts, facts.query.events("collective_done"))
    return sum(d.seconds if d.waited is None else min(d.waited, d.seconds) for d in dones)


def _covered(facts: RunFacts, v: Verdict) -> bool:
    """Other rules' findings about the bound part's events cost at least COVERED_SHARE of it.

    Compiling is read by steps instead: the steady steps the compile findings span hold at least
    COVERED_SHARE of the part's time. A finding's cost counts the programs it made, compiled or
    read back from the compile cache; dynamo's own tracing of them is the step's compile time too
    and is not in it, and a warm cache shrinks the programs' part and not the tracing: read by
    seconds, the same finding would cover the steps cold and not warm."""
    views = _RELATED_VIEWS[v.part]
    cost = 0.0
    spans: list[tuple[int, int]] = []
    for r in RULES.values():
        if r.kind == "step_bound" or r.view not in views:
            continue
        with contextlib.suppress(Exception):  # that rule's failure is reported as its own; it covers nothing
            for f in r.check(facts):
                cost += f.cost_seconds
                if f.steps is not None:
                    spans.append(f.steps)
    if v.part != "compile":
        return cost >= COVERED_SHARE * v.seconds
    split = [(s.index, split_step(s)) for s in facts.steady]
    total = sum(p.part("compile") for _, p in split if p is not None)
    inside = sum(p.part("compile") for i, p in split if p is not None and any(a <= i <= b for a, b in spans))
    return total > 0 and inside >= COVERED_SHARE * total


def _steady_events(facts: RunFacts, events: Iterable[Any]) -> list[Any]:
    return [e for e in events if facts.phase(e.ts) == "steady"]


def _lines(events: Sequence[Any], limit: int = 3) -> list[tuple[Any, float, int]]:
    """The locations of ``events`` with their seconds and counts, most time first."""
    time: dict[Any, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    for e in events:
        time[e.location] += e.seconds
        count[e.location] += 1
    return sorted(((loc, t, count[loc]) for loc, t in time.items()), key=lambda x: -x[1])[:limit]


def _where(loc: SourceLocation | None) -> str:
    return format_location(loc.file, loc.line) if loc is not None else "an unknown line"


def _subject(part: str, loc: SourceLocation | None) -> str:
    site = format_location(loc.file, loc.line, loc.function) if loc is not None else "-"
    return f"{part}-bound: {site}"


def _base_counts(v: Verdict) -> tuple[Count, ...]:
    return (
        Count("share of a steady step", round(100 * v.share)),
        Count(f"{v.part} time", v.seconds, "s"),
        Count("steady time", v.steady_seconds, "s"),
        Count("steady steps", v.steps),
    )


def _split_fact(v: Verdict) -> str:
    shown = sorted(((s, p) for p, s in zip(PARTS, v.shares) if s >= 0.01), reverse=True)
    return "a typical steady step: " + ", ".join(f"{p} {100 * s:.0f}%" for s, p in shown)


def _head(v: Verdict, what: str) -> str:
    return (f"{v.bound}: {100 * v.share:.0f}% of a typical steady step ({format_seconds(v.seconds)} of "
            f"{format_seconds(v.steady_seconds)} over {v.steps} steps) {what}")


def _input(facts: RunFacts, v: Verdict) -> Finding:
    waits = _steady_events(facts, facts.query.steps.waits("input"))
    loader = sum(w.seconds for w in waits)
    lines = _lines(waits)
    loc = lines[0][0] if lines else None
    settings = collections.Counter((w.workers, w.pin_memory, w.prefetch_factor) for w in waits).most_common(1)
    workers, pinned, prefetch = settings[0][0] if settings else (None, None, None)
    copies = max(0.0, v.seconds - loader)
    if waits and loader >= copies:
        what = f"the DataLoader's next batch at {_where(loc)}"
        if not workers:
            fix = ("load batches while the step runs: DataLoader(..., num_workers=N, "
                   "persistent_workers=True) "
                   f"(N up to the host's {os.cpu_count() or 'available'} cores)"
                   + ("" if pinned else ", pin_memory=True")
                   + ", and copy the next batch to the device before the step needs it (.to('tpu', "
                     "non_blocking=True) one batch ahead); data read again every epoch can be read once and "
                     "kept in memory")
        else:
            fix = (f"the loader's {workers} workers do not keep up: raise num_workers (the host has "
                   f"{os.cpu_count() or 'more'} cores), raise prefetch_factor ({prefetch} now), or make "
                   "__getitem__ and collate cheaper (decode once and cache, move augmentation to the device)")
        detail = (f"loader: num_workers={workers}, pin_memory={pinned}"
                  + (f", prefetch_factor={prefetch}" if prefetch else ""),)
    else:
        uploads = [t for t in _steady_events(facts, facts.transfers)
                   if t.direction == "h2d" and t.op != "scalar"]
        lines = _lines(uploads)
        loc = lines[0][0] if lines else loc
        what = f"copies of the batch to the device at {_where(loc)}"
        fix = ("overlap the copy with the step: pin the batch (DataLoader(pin_memory=True)) and copy it one "
               "step ahead with .to('tpu', non_blocking=True), or build it on the device")
        detail = ()
    return Finding(
        kind="step_bound",
        severity="warning",
        title=_head(v, f"waits for {what}"),
        fix=fix,
        cost_seconds=v.seconds,
        evidence=Evidence(
            loc,
            (*_base_counts(v), Count("loader time", loader, "s"), Count("copy time", copies, "s")),
            (_split_fact(v), *detail,
             *(f"{_where(line)}: {format_seconds(t)} in {n} waits" for line, t, n in lines)),
        ),
        steps=_span(facts),
        cause="input",
        subject=_subject("input", loc),
    )


def _sync(facts: RunFacts, v: Verdict) -> Finding:
    reads = [t for t in _steady_events(facts, facts.transfers) if t.direction == "d2h"]
    waits = _steady_events(facts, facts.query.steps.waits("synchronize"))
    lines = _lines([*reads, *waits])
    loc = lines[0][0] if lines else None
    ops = sorted({t.op for t in reads} | ({"synchronize"} if waits else set()))
    saved = _sync_overlap(facts)
    return Finding(
        kind="step_bound",
        severity="warning",
        title=_head(v, f"waits on the device, at reads of device values ({', '.join(ops)}) at {_where(loc)}"),
        fix=("keep the values on the device and read them every N steps, not in every step (accumulate a "
             "running sum on the device, read it when logging); each read drains the device's queue, so the "
             f"host's work of the next step no longer overlaps the device's: the reads at "
             f"{', '.join(_where(line) for line, _, _ in lines)}"),
        cost_seconds=saved,
        evidence=Evidence(
            loc,
            (*_base_counts(v), Count("overlap lost (estimate)", saved, "s")),
            (_split_fact(v),
             ("the wait itself is the device finishing the step's work; what the reads cost is the host time "
             "that would otherwise have overlapped it (per step the smaller of the wait and the host time)"),
             *(f"{_where(line)}: {format_seconds(t)} in {n} reads" for line, t, n in lines)),
        ),
        steps=_span(facts),
        cause="sync",
        subject=_subject("sync", loc),
        estimated=True,
    )


def _sync_overlap(facts: RunFacts) -> float:
    total = 0.0
    for s in facts.steady:
        sp = split_step(s)
        if sp is not None:
            total += min(sp.part("sync"), sp.part("host") + sp.part("dispatch"))
    return total


def _compile(facts: RunFacts, v: Verdict) -> Finding:
    # programs read back from the compile cache are the compile side's time: what a cold cache
    # compiles, a warm one reads back, at the same lines
    compiles = _steady_events(facts, facts.compiles)
    lines = _lines(compiles)
    loc = lines[0][0] if lines else None
    names = sorted({c.identity or c.name for c in compiles})
    again = sum(1 for c in compiles if not c.diffs)
    read = sum(1 for c in compiles if c.from_cache)
    what = (f"{len(compiles)} compiles" if not read else
            f"{len(compiles)} programs compiled or read back from the compile cache ({read} read back)")
    return Finding(
        kind="step_bound",
        severity="warning",
        title=_head(v, f"is compiling: {what} of {', '.join(names[:3])}"
                    f"{', ...' if len(names) > 3 else ''}"),
        fix=("remove what makes the steady steps compile: the Recompiles section gives each compile's "
             "difference from the last (a shape to pad, a Python scalar to pass as a tensor); "
             + (f"{again} compiled a key compiled before, an executable evicted from the cache: raise "
                "TPU_DEBUG_EAGER_CACHE_SIZE or TPU_DEBUG_COMPILED_CACHE_SIZE" if again else
                f"the compiles are at {', '.join(_where(line) for line, _, _ in lines)}")),
        cost_seconds=v.seconds,
        evidence=Evidence(
            loc,
            (*_base_counts(v), Count("compiles", len(compiles))),
            (_split_fact(v),
             *(f"{_where(line)}: {format_seconds(t)} in {n} compiles" for line, t, n in lines)),
        ),
        steps=_span(facts),
        cause="compile",
        subject=_subject("compile", loc),
    )


def _collective(facts: RunFacts, v: Verdict) -> Finding:
    calls = {(c.group, c.rank, c.seq, c.op): c for c in facts.query.events("collective_call")}
    dones = _steady_events(facts, facts.query.events("collective_done"))
    entered = [(calls.get((d.group, d.rank, d.seq, d.op)), d.seconds) for d in dones]
    time: dict[Any, float] = collections.defaultdict(float)
    for call, seconds in entered:
        if call is not None:
            time[(call.location, call.op)] += seconds
    top = sorted(time.items(), key=lambda kv: -kv[1])[:3]
    loc, op = top[0][0] if top else (None, "collective")
    return Finding(
        kind="step_bound",
        severity="warning",
        title=_head(v, f"is in collectives, waiting for the other ranks: {op} at {_where(loc)}"),
        fix=("this rank waits in the collective for the others: compare the ranks' step splits (tpu-debug "
             "report of each rank's run): a slower rank's largest part is the one to fix (uneven batches, "
             "work only one rank does such as logging, evaluation or saving on rank 0); when every rank is "
             "collective-bound the exchange itself costs the time: fewer, larger collectives (DDP's "
             "bucket_cap_mb), overlapped with the backward"),
        cost_seconds=v.seconds,
        evidence=Evidence(
            loc,
            (*_base_counts(v), Count("collectives", len(dones))),
            (_split_fact(v), *(f"{o} at {_where(where)}: {format_seconds(t)}" for (where, o), t in top)),
        ),
        steps=_span(facts),
        cause="collective",
        subject=_subject("collective", loc),
    )


def _checkpoint(facts: RunFacts, v: Verdict) -> Finding:
    saves = _steady_events(facts, facts.query.steps.waits("checkpoint"))
    lines = _lines(saves)
    loc = lines[0][0] if lines else None
    apis = sorted({w.api for w in saves})
    return Finding(
        kind="step_bound",
        severity="warning",
        title=_head(v, f"is saving checkpoints: {', '.join(apis) or 'saves'} at {_where(loc)}"),
        fix=("save less often (every N steps), or save without blocking the step: "
             "torch.distributed.checkpoint.async_save copies the state to the host and writes it in the "
             "background"),
        cost_seconds=v.seconds,
        evidence=Evidence(
            loc,
            (*_base_counts(v), Count("saves", len(saves))),
            (_split_fact(v), *(f"{_where(line)}: {format_seconds(t)} in {n} saves" for line, t, n in lines)),
        ),
        steps=_span(facts),
        cause="checkpoint",
        subject=_subject("checkpoint", loc),
    )


def _span(facts: RunFacts) -> tuple[int, int] | None:
    indexes = [s.index for s in facts.steady]
    return (min(indexes), max(indexes)) if indexes else None


_BUILDERS = {
    "input": _input,
    "sync": _sync,
    "compile": _compile,
    "collective": _collective,
    "checkpoint": _checkpoint,
}
