"""The advisor's rules: one function per kind of finding (see the package docstring).

Every rule looks at steady state first: a cost paid once while the program
warms up is not worth a finding, a cost paid at every step is. "In every
step" means in at least half of the steady steps and in two of them at
least; a run without steps (no ``optimizer.step()``, no ``tpu_debug.step()``
and no loop found) counts a line that repeats :data:`REPEATS` times instead.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation
from tpu_debug.tracers.recompiles import describe, summarize
from tpu_debug.tracers.transfers import CAUSE_TEXT, CallSite, advice_for

__all__ = ["REPEATS", "TINY_ELEMENTS", "TINY_OPS_MIN", "TINY_SHARE", "UPLOAD_MIN_BYTES", "UPLOAD_SHARE"]

# a run without steps: a line that does something this many times sits in a loop
REPEATS = 3
# an eager step of at least this many ops, nearly all of them (this share of the
# executions) on inputs of at most TINY_ELEMENTS elements each, is worth compiling: a
# TPU does such an op's work in far less time than the host takes to dispatch it
TINY_OPS_MIN = 1000
TINY_SHARE = 0.9
TINY_ELEMENTS = 65536
# a per-step upload of a new batch is worth overlapping when it is this big and takes
# this share of the steady step's time
UPLOAD_MIN_BYTES = 64 * 1024
UPLOAD_SHARE = 0.25


# ---------------------------------------------------------------------------------
# Prose helpers (findings are the only place the advisor's prose is made)
# ---------------------------------------------------------------------------------


def _secs(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _where(loc: SourceLocation | None) -> str:
    return f"{os.path.basename(loc.file)}:{loc.line}" if loc is not None else "an unknown line"


def _site(loc: SourceLocation | None) -> str:
    """A line as a stable subject: ``train.py:41 in step``."""
    return f"{os.path.basename(loc.file)}:{loc.line} in {loc.function}" if loc is not None else "-"


def _most_common(locations: Iterable[SourceLocation | None]) -> SourceLocation | None:
    counts = collections.Counter(loc for loc in locations if loc is not None)
    return counts.most_common(1)[0][0] if counts else None


def _span(indexes: Sequence[int]) -> tuple[int, int] | None:
    return (min(indexes), max(indexes)) if indexes else None


def _listing(values: Sequence[str], limit: int = 6) -> str:
    return ", ".join(values[:limit]) + (", ..." if len(values) > limit else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _every_step(facts: RunFacts, steps: Sequence[int]) -> bool:
    """Steady steps ``steps`` make "every step": half of the steady steps, two at least."""
    return len(steps) >= 2 and 2 * len(steps) >= len(facts.steady)


def _unstepped(facts: RunFacts) -> bool:
    return not facts.steps


# ---------------------------------------------------------------------------------
# Recompiles in steady state, and the dynamic shapes padding would fix
# ---------------------------------------------------------------------------------

# the cause of a recompile, from its key differences: the first of these that applies
_CAUSES = ("shape", "rank", "dtype", "scalar", "static", "precision", "grad", "layout", "guard", "inputs", "config", "cache", "other")


def _diff_cause(d: KeyDiff) -> str:
    if d.aspect == "shape":
        if d.detail == "rank":
            return "rank"
        return "shape" if d.dims else "inputs"
    if d.aspect == "key":
        return "cache" if d.before == "compiled before" else "other"
    return d.aspect if d.aspect in _CAUSES else "other"


def _cause(diffs: Sequence[KeyDiff]) -> tuple[str, KeyDiff | None]:
    found = [(_CAUSES.index(_diff_cause(d)), i, d) for i, d in enumerate(diffs)]
    if not found:
        return "other", None
    _, _, d = min(found)
    return _diff_cause(d), d


def _steady_recompiles(facts: RunFacts) -> dict[tuple[str | None, str], list[CompileEvent]]:
    """Recompiles in steady steps, per (mode, identity)."""
    out: dict[tuple[str | None, str], list[CompileEvent]] = {}
    for c in facts.compiles:
        if c.diffs and facts.phase(c.ts) == "steady":
            out.setdefault((c.mode, c.identity or c.name), []).append(c)
    return out


def _numeric(values: Iterable[str]) -> list[int] | None:
    try:
        return sorted({int(v) for v in values})
    except ValueError:
        return None


def _buckets(sizes: list[int]) -> tuple[int, list[int]]:
    """The smallest multiple (8, 16, 32, ...) that pads ``sizes`` into at most 4 sizes, and those sizes."""
    m = 8
    while True:
        padded = sorted({-(-s // m) * m for s in sizes})
        if len(padded) <= 4 or m >= max(sizes):
            return m, padded
        m *= 2


def _grows_by_steps(change: Any) -> bool:
    """A size that grew by the same amount at each of five or more compiles (5, 6, 7, 8, 9):
    a sequence extended one step at a time, such as a dynamic KV cache, which padding does
    not fix. Fewer sizes, or uneven steps, read as batches of varying size."""
    if not change.grows or len(change.values) < 5:
        return False
    sizes = [int(v) for v in change.values]
    return len({b - a for a, b in zip(sizes, sizes[1:])}) == 1


@rule("dynamic_shape", about="a dimension that takes new sizes in steady state, recompiling at each (padding fixes it)", view="recompiles")
def dynamic_shape(facts: RunFacts) -> Iterable[Finding]:
    # ops whose shape recompiles fall in the same steps change with one size (a sequence
    # length, and the flattened batch x length after it): one finding, about that size
    groups: dict[frozenset[int], list[tuple[str, str | None, Any, list[int], list[CompileEvent]]]] = {}
    for (mode, identity), items in _steady_recompiles(facts).items():
        shaped = [c for c in items if _cause(c.diffs)[0] == "shape"]
        steps = facts.steady_steps_of(shaped)
        if len(steps) < 2:
            continue
        history = [c for c in facts.compiles if c.mode == mode and (c.identity or c.name) == identity]
        changes = [ch for ch in summarize(history)[0].changes if ch.kind == "shape" and ch.dim is not None]
        values = _numeric(changes[0].values) if changes else None
        if values is None or len(values) < 3:
            continue
        groups.setdefault(frozenset(steps), []).append((identity, mode, changes[0], values, shaped))
    for step_set, members in groups.items():
        # the size the others derive from is the smallest (a length, before it is multiplied)
        members.sort(key=lambda m: (max(m[3]), min(c.id for c in m[4])))
        identity, mode, change, values, _ = members[0]
        shaped = [c for m in members for c in m[4]]
        steps = sorted(step_set)
        seconds = sum(c.seconds for c in shaped)
        multiple, padded = _buckets(values)
        ops = list(dict.fromkeys(m[0] for m in members))
        example = next((describe(d) for c in reversed(members[0][4]) for d in c.diffs if _diff_cause(d) == "shape"), None)
        fix = (
            f"pad {change.what} of {identity} up to a multiple of {multiple}, where the data is batched: "
            f"its {len(values)} sizes ({values[0]}..{values[-1]}) become {len(padded)} "
            f"({', '.join(map(str, padded))}), so each op compiles {len(padded)} programs instead of "
            f"{len(values)}; mask the padding out of the result (ignore_index in the loss, an attention mask)"
        )
        if _grows_by_steps(change):
            # a sequence extended one step at a time (a KV cache): padding each step is the wrong fix
            fix = (
                f"{change.what} of {identity} grows at every call ({values[0]}..{values[-1]}): a sequence "
                "extended one step at a time, such as a dynamic KV cache; allocate it once at its final "
                "length and write each step into it (Hugging Face: generate(..., cache_implementation="
                "'static')), so every step has the same shapes"
            )
        elif any(m[1] == "compiled" for m in members):
            fix += (
                "; torch._dynamo.mark_dynamic(t, dim) stops dynamo from retracing, but XLA still compiles "
                "one program per size"
            )
        others = [f"changes with it: {m[2].what} of {m[0]} ({m[3][0]}..{m[3][-1]})" for m in members[1:4]]
        yield Finding(
            kind="dynamic_shape",
            severity="warning",
            title=(
                f"{change.what} of {identity} takes a new size in steady state "
                f"({_listing([str(v) for v in values])}): {_plural(len(shaped), 'recompile')} of "
                f"{_plural(len(ops), 'op')} in {_plural(len(steps), 'step')}, {_secs(seconds)} "
                + ("reading them back from the compile cache" if all(getattr(c, "from_cache", False) for c in shaped)
                   else "compiling")
            ),
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                _most_common(c.location for c in members[0][4]),
                (
                    Count("sizes", len(values)),
                    Count("ops", len(ops)),
                    Count("recompiles in steady state", len(shaped)),
                    Count("steady steps with recompiles", len(steps)),
                    Count("compile time", seconds, "s"),
                ),
                (f"ops: {_listing(ops)}", *([f"e.g. {example}"] if example else []), *others),
            ),
            steps=_span(steps),
            cause="shape",
            subject=f"{identity}: {change.what}",
            targets=tuple(ops),
        )


def _recompile_fix(cause: str, diff: KeyDiff | None, values: list[str], mode: str | None) -> str:
    name = (diff.arg_name if diff is not None else None) or "?"
    subject = (diff.subject if diff is not None else "") or "an input"
    shown = ", ".join(values[:4])
    if cause == "rank":
        return (
            f"give {subject} one rank at every step (it took ranks {shown}): padding cannot change a "
            "rank; keepdim=True in reductions, no squeeze() of a dimension that is sometimes 1, or a "
            "reshape to a fixed rank before the call"
        )
    if cause == "dtype":
        return (
            f"cast {subject} once where it is made, so every step sees one dtype (it arrived as {shown}); "
            "padding or bucketing cannot fix a dtype"
        )
    if cause == "scalar":
        return (
            f"hoist the Python number '{name}' into a tensor on the device, made once and updated in place "
            f"(t = torch.tensor(v, device='tpu') before the loop, t.fill_(v) each step): as a number it is "
            f"baked into the program, and each new value ({shown}) compiles again"
        )
    if cause == "static":
        return (
            f"keep the argument '{name}' fixed across steps (it took {shown}): it is compiled into the "
            "program, and each value is a new program"
        )
    if cause == "precision":
        return (
            f"set the float32 matmul precision once, at start-up (it changed between {shown}): "
            "torch.tpu.precision.set(...) or torch.set_float32_matmul_precision(...)"
        )
    if cause == "grad":
        return (
            "run the function under one grad mode (it ran with grad on and off, or with inputs that do and "
            "do not require grad): compile the training and the evaluation function apart"
        )
    if cause == "layout":
        return f"make {subject} contiguous (.contiguous()) before the call, or keep its slicing the same every step"
    if cause == "guard":
        guard = diff.before if diff is not None else "?"
        return (
            f"keep what dynamo's failed guard checks fixed across calls ({guard}): a Python value, global "
            "or attribute read inside the compiled function; pass a changing value in as a tensor"
        )
    if cause == "cache":
        option = "compiled_cache_size" if mode == "compiled" else "eager_cache_size"
        return (
            f"the runtime's cache evicted the executable and it compiled again: raise "
            f"tpu_debug.runtime.config.{option} (TPU_DEBUG_{option.upper()}) above the programs one step uses"
        )
    if cause == "inputs":
        return "call it with the same inputs at every step (their number or kind changes: see the diffs)"
    return "keep the program's inputs and settings the same at every step (see the diffs)"


def _recompile_title(cause: str, diff: KeyDiff | None, ops: list[str], n: int, steps: int, values: list[str]) -> str:
    what = f"{_plural(n, 'recompile')} of {_listing(ops, 3)} in {_plural(steps, 'steady step')}"
    shown = _listing(values, 4)
    subject = (diff.subject if diff is not None else "") or "an input"
    if cause == "rank":
        return f"the rank of {subject} changes between steps ({shown}): {what}"
    if cause == "dtype":
        return f"the dtype of {subject} changes between steps ({shown}): {what}"
    if cause == "scalar":
        return f"the Python number '{diff.arg_name if diff else '?'}' is baked into the program and changes ({shown}): {what}"
    if cause == "static":
        return f"the argument '{diff.arg_name if diff else '?'}' changes ({shown}): {what}"
    if cause == "precision":
        return f"the matmul precision changes between steps ({shown}): {what}"
    if cause == "cache":
        return f"executables are evicted and compiled again: {what}"
    if cause == "guard":
        return f"a dynamo guard fails again in steady state: {what}"
    return f"{what}: {describe(diff) if diff is not None else 'the key changed'}"


def _values(d: KeyDiff) -> tuple[str, ...]:
    # a failed dynamo guard knows the value it was compiled for, not the one that failed it
    return (d.before,) if d.source == "guard" else (d.before, d.now)


def _group_label(cause: str, diff: KeyDiff | None) -> str:
    if diff is None:
        return cause
    if cause in ("scalar", "static"):
        return f"{cause} {diff.arg_name}"
    if cause in ("rank", "dtype", "layout", "inputs"):
        return f"{cause} {diff.subject}"
    if cause == "guard":
        return f"guard {diff.before}"
    return f"{cause} {diff.detail or ''}".strip()


@rule("recompile", about="recompiles that keep happening in steady state, by cause (padding cannot fix these)", view="recompiles")
def recompile(facts: RunFacts) -> Iterable[Finding]:
    groups: dict[tuple[str, str], list[tuple[str, str | None, CompileEvent, KeyDiff | None]]] = {}
    for (mode, identity), items in _steady_recompiles(facts).items():
        for c in items:
            cause, diff = _cause(c.diffs)
            if cause == "shape":
                continue  # the dynamic_shape rule's: padding applies
            groups.setdefault((cause, _group_label(cause, diff)), []).append((identity, mode, c, diff))
    for (cause, label), members in groups.items():
        events = [m[2] for m in members]
        steps = facts.steady_steps_of(events)
        if len(steps) < 2:
            continue  # once in steady state (an epoch's short last batch): paid once, not per step
        ops = list(dict.fromkeys(m[0] for m in members))
        diff = members[-1][3]
        values = list(dict.fromkeys(v for m in members if m[3] is not None for v in _values(m[3])))
        seconds = sum(c.seconds for c in events)
        mode = members[0][1]
        yield Finding(
            kind="recompile",
            severity="warning",
            title=_recompile_title(cause, diff, ops, len(events), len(steps), values),
            fix=_recompile_fix(cause, diff, values, mode),
            cost_seconds=seconds,
            evidence=Evidence(
                _most_common(c.location for c in events),
                (
                    Count("recompiles in steady state", len(events)),
                    Count("steady steps with recompiles", len(steps)),
                    Count("ops", len(ops)),
                    Count("compile time", seconds, "s"),
                ),
                (f"ops: {_listing(ops)}", *(f"e.g. {describe(d)}" for d in events[-1].diffs[:3])),
            ),
            steps=_span(steps),
            cause=cause,
            subject=f"{ops[0]}: {label}",
            targets=tuple(ops),
        )


@rule("recompile_limit", about="a function that hit dynamo's recompile limit and runs uncompiled", view="recompiles")
def recompile_limit(facts: RunFacts) -> Iterable[Finding]:
    for hit in facts.recompile_limits:
        step = facts.step_of(hit.ts)
        yield Finding(
            kind="recompile_limit",
            severity="error",
            title=(
                f"{hit.name} hit dynamo's {hit.limit_type} ({hit.limit}) and runs uncompiled from then on"
            ),
            fix=(
                "remove what makes it recompile (its other findings and the recompiles view name it); "
                "raising torch._dynamo.config.recompile_limit only delays this"
            ),
            cost_seconds=0.0,
            evidence=Evidence(hit.location, (Count("limit", hit.limit),), (f"last failed guard: {hit.reason}",)),
            steps=(step, step) if step is not None else None,
            cause="guard",
            subject=hit.name,
            targets=tuple(
                dict.fromkeys(c.identity for c in facts.compiles if c.identity and c.identity.startswith(f"{hit.name} in "))
            ),
        )


# ---------------------------------------------------------------------------------
# Syncs, uploads and fallbacks inside the step
# ---------------------------------------------------------------------------------


def _repeated(facts: RunFacts, events: Sequence[Any]) -> tuple[list[Any], list[int]] | None:
    """The events that make a per-step cost: those in steady steps when they come in (nearly)
    every steady step, or, in a run without steps, all of them when they repeat."""
    if _unstepped(facts):
        return (list(events), []) if len(events) >= REPEATS else None
    steps = facts.steady_steps_of(events)
    if not _every_step(facts, steps):
        return None
    return facts.in_steady(events), steps


def _how_often(facts: RunFacts, steps: list[int], events: Sequence[Any]) -> str:
    if steps:
        return f"in {len(steps)} of {len(facts.steady)} steady steps"
    return f"{len(events)} times (no steps were found; it repeats)"


@rule("implicit_sync", about="a sync nobody asked for (.item(), print, if t:) inside the step", view="transfers")
def implicit_sync(facts: RunFacts) -> Iterable[Finding]:
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.implicit and not t.op.startswith("fallback:"):
            sites.setdefault((t.location, t.op, t.direction), []).append(t)
    for (location, op, direction), events in sites.items():
        found = _repeated(facts, events)
        if found is None:
            continue
        chosen, steps = found
        seconds = sum(t.seconds for t in chosen)
        nbytes = sum(t.nbytes for t in chosen)
        site = CallSite(location, direction, op, True, len(chosen), nbytes, seconds, ())
        what = CAUSE_TEXT.get(op, op)
        yield Finding(
            kind="implicit_sync",
            severity="warning",
            title=f"{what} at {_where(location)} waits for the device {_how_often(facts, steps, chosen)}",
            fix=advice_for(site),
            cost_seconds=seconds,
            evidence=Evidence(
                location,
                (
                    Count("syncs", len(chosen)),
                    Count("steady steps", len(steps)),
                    Count("bytes", nbytes, "B"),
                    Count("time", seconds, "s"),
                ),
                (f"{direction} copies made by {what}",),
            ),
            steps=_span(steps),
            cause=op,
            subject=f"{_site(location)} ({op})",
        )


@rule("cpu_fallback", about="an op with no tpu lowering that runs on CPU inside the step", view="ops")
def cpu_fallback(facts: RunFacts) -> Iterable[Finding]:
    by_op: dict[str, list[Any]] = {}
    for f in facts.fallbacks:
        by_op.setdefault(f.name, []).append(f)
    moved = collections.defaultdict(list)
    for t in facts.transfers:
        if t.op.startswith("fallback:"):
            moved[t.op.removeprefix("fallback:")].append(t)
    for name, events in by_op.items():
        # unlike a sync every N steps (a fine way to log), a fallback in steady state at all
        # is one the step keeps paying: two steady steps with it are enough
        if _unstepped(facts):
            if len(events) < REPEATS:
                continue
            chosen, steps = list(events), []
        else:
            steps = facts.steady_steps_of(events)
            if len(steps) < 2:
                continue
            chosen = facts.in_steady(events)
        copies = facts.in_steady(moved[name]) if steps else moved[name]
        seconds = sum(f.seconds for f in chosen) + sum(t.seconds for t in copies)
        shapes = _listing(list(dict.fromkeys(", ".join(a.render() for a in f.args) for f in chosen)), 3)
        yield Finding(
            kind="cpu_fallback",
            severity="warning",
            title=f"{name} has no tpu lowering and runs on CPU {_how_often(facts, steps, chosen)}",
            fix=(
                f"give {name} a tpu lowering (runtime/ops/, @lower), or compute it with ops that have "
                "one: each call copies its inputs to the host and its result back"
            ),
            cost_seconds=seconds,
            evidence=Evidence(
                _most_common(f.location for f in chosen),
                (
                    Count("calls", len(chosen)),
                    Count("host copies", len(copies)),
                    Count("bytes copied", sum(t.nbytes for t in copies), "B"),
                    Count("time", seconds, "s"),
                ),
                (f"inputs: {shapes}",),
            ),
            steps=_span(steps),
            cause=name,
            subject=name,
            targets=(name,),
        )


@rule("h2d_every_step", about="the same host-to-device copy at every step (a tensor rebuilt from Python data, a batch copied synchronously)", view="transfers")
def h2d_every_step(facts: RunFacts) -> Iterable[Finding]:
    if len(facts.steady) < REPEATS:
        return
    step_seconds = sum(s.seconds for s in facts.steady)
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.direction == "h2d" and not t.implicit:
            sites.setdefault((t.location, t.op, t.shape, t.dtype), []).append(t)
    for (location, op, shape, dtype), events in sites.items():
        steady = facts.in_steady(events)
        steps = facts.steady_steps_of(steady)
        if len(steps) < max(REPEATS, len(facts.steady) - 1):
            continue  # not in every steady step
        seconds = sum(t.seconds for t in steady)
        nbytes = sum(t.nbytes for t in steady)
        per_step = nbytes / len(steps)
        aval = f"{dtype}[{','.join(map(str, shape))}]"
        if op == "tensor":
            title = (
                f"torch.tensor(...) at {_where(location)} builds a {aval} from Python data on the device "
                f"in {len(steps)} of {len(facts.steady)} steady steps"
            )
            fix = (
                "build it once, before the loop, when its values do not change; otherwise make it on the "
                "device (torch.arange, torch.full, indexing a tensor made once) instead of from a Python list"
            )
        elif per_step >= UPLOAD_MIN_BYTES and step_seconds > 0 and seconds >= UPLOAD_SHARE * step_seconds:
            title = (
                f"{CAUSE_TEXT.get(op, op)} at {_where(location)} copies {_bytes(per_step)} ({aval}) to the "
                f"device in {len(steps)} steady steps, {100 * seconds / step_seconds:.0f}% of their time"
            )
            fix = (
                "if the data is the same every step, move it to the device once, before the loop; if it is "
                "a new batch, overlap the copy with the step: DataLoader(..., pin_memory=True) with "
                ".to('tpu', non_blocking=True), or prefetch the next batch while this one runs"
            )
        else:
            continue
        yield Finding(
            kind="h2d_every_step",
            severity="warning",
            title=title,
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                location,
                (
                    Count("copies", len(steady)),
                    Count("steady steps", len(steps)),
                    Count("bytes per step", per_step, "B"),
                    Count("time", seconds, "s"),
                ),
                (f"{aval} by {CAUSE_TEXT.get(op, op)}",),
            ),
            steps=_span(steps),
            cause=op,
            subject=f"{_site(location)} ({op})",
        )


# ---------------------------------------------------------------------------------
# Compiled mode, eager dispatch, float64, numerics
# ---------------------------------------------------------------------------------


@rule("graph_break", about="dynamo splits a compiled function that runs at every step", view="recompiles")
def graph_break(facts: RunFacts) -> Iterable[Finding]:
    if not facts.graph_breaks:
        return
    ran = [s for s in facts.steady if s.graph_runs]
    if not _every_step(facts, [s.index for s in ran]):
        return  # the function that broke is not called in steady state
    runs = sorted(s.graph_runs for s in ran)[len(ran) // 2]
    if runs < 2:
        return  # one compiled program per step: nothing is split where the step runs
    compiled = [o for o in facts.ops if o.mode == "compiled" and o.count]
    dispatch = sum(o.seconds for o in compiled) / max(1, sum(o.count for o in compiled))
    sites: dict[tuple, list[Any]] = {}
    for b in facts.graph_breaks:
        sites.setdefault((b.name, b.location, b.reason), []).append(b)
    for (name, location, reason), items in sites.items():
        cost = len(ran) * dispatch
        yield Finding(
            kind="graph_break",
            severity="warning",
            title=(
                f"dynamo splits {name} at {_where(location)}; each of {len(ran)} steady steps runs "
                f"{_plural(runs, 'compiled program')} with Python in between"
            ),
            fix=(
                "move the call dynamo cannot trace (named in the reason) out of the compiled function, or "
                "replace it: keep values as tensors (torch.where instead of if on a tensor, no .item() or "
                "print inside); each break costs a program launch and a return to Python per call"
            ),
            cost_seconds=cost,
            evidence=Evidence(
                location,
                (
                    Count("breaks recorded", len(items)),
                    Count("steady steps", len(ran)),
                    Count("compiled programs per step", runs),
                    Count("launch time per program", dispatch, "s"),
                ),
                (f"reason: {reason}",),
            ),
            steps=_span([s.index for s in ran]),
            cause="graph_break",
            subject=f"{name}: {_site(location)}",
            estimated=True,
        )


def _dispatch_floor(ops: Sequence[Any]) -> float:
    """What one eager op costs the host at the least: the 10th percentile of the run's
    per-execution times (the cheapest ops are almost all dispatch)."""
    means = sorted((o.mean_seconds, o.count) for o in ops if o.count)
    total = sum(n for _, n in means)
    seen = 0
    for mean, n in means:
        seen += n
        if seen >= 0.1 * total:
            return mean
    return means[-1][0] if means else 0.0


def _tiny_share(facts: RunFacts) -> float | None:
    """Of the run's eager executions, the share whose inputs are all small (at most
    :data:`TINY_ELEMENTS` elements each), read from the compiled programs' arguments
    (per op when the run recorded no programs); None when no eager op ran."""
    sizes: dict[str, int] = {}
    largest: dict[str, int] = {}  # per op: its largest input over every program it compiled
    for c in facts.compiles:
        if c.mode == "eager":
            size = max((math.prod(a.shape) for a in c.args if a.shape is not None), default=0)
            largest[c.name] = max(largest.get(c.name, 0), size)
            if c.program is not None:
                sizes[c.program] = size
    tiny = total = 0
    for p in facts.query.programs(mode="eager"):
        if p.count:
            total += p.count
            tiny += p.count if sizes.get(p.hash, TINY_ELEMENTS + 1) <= TINY_ELEMENTS else 0
    if not total:
        # a run without HLO records no programs: judge each op by the largest input it
        # compiled for (an op that ever ran on a large tensor counts as large)
        for o in facts.ops:
            if o.mode == "eager" and o.count:
                total += o.count
                tiny += o.count if largest.get(o.name, TINY_ELEMENTS + 1) <= TINY_ELEMENTS else 0
    return tiny / total if total else None


@rule("eager_tiny_ops", about="an eager step of thousands of small ops, each paying a dispatch, that compiling would fuse", view="steps")
def eager_tiny_ops(facts: RunFacts) -> Iterable[Finding]:
    steady = [s for s in facts.steady if s.eager_ops]
    if len(steady) < 2:
        return
    ops = sorted(s.eager_ops for s in steady)[len(steady) // 2]
    if ops < TINY_OPS_MIN:
        return
    share = _tiny_share(facts)
    if share is None or share < TINY_SHARE:
        return  # big ops: their time is the device's work, which compiling does not remove
    floor = _dispatch_floor([o for o in facts.ops if o.mode == "eager"])
    step = sorted(s.seconds for s in steady)[len(steady) // 2]
    dispatch = sorted(s.op_seconds for s in steady)[len(steady) // 2]
    # the small ops' time is the host's (their device work is next to nothing): compiled,
    # it becomes one program's dispatch
    saved = max(0.0, min(step, dispatch * share - floor))
    per_op = sum(s.op_seconds for s in steady) / max(1, sum(s.eager_ops for s in steady))
    yield Finding(
        kind="eager_tiny_ops",
        severity="warning",
        title=(
            f"each steady step runs {ops:,} eager ops on small tensors, {_secs(per_op)} each; compiled, "
            f"it would save about {_secs(saved)} of its {_secs(step)} (an estimate)"
        ),
        fix=(
            "compile the step: step = tpu_debug.compile(step) (forward and backward become one program; "
            "the optimizer too with tpu_debug.compile(opt.step) and capturable=True), so the ops run as "
            f"one dispatch instead of {ops:,}"
        ),
        cost_seconds=saved * len(steady),
        evidence=Evidence(
            None,
            (
                Count("eager ops per step", ops),
                Count("small ops", round(100 * share), ""),
                Count("time per op", per_op, "s"),
                Count("dispatch time per step", dispatch, "s"),
                Count("step time", step, "s"),
                Count("steady steps", len(steady)),
            ),
            (
                f"{100 * share:.0f}% of the eager ops have inputs of at most {TINY_ELEMENTS:,} elements: "
                "their time is dispatch, not device work",
                f"estimate: the step spends {_secs(dispatch)} dispatching ops; compiled, that is one "
                f"dispatch (about {_secs(floor)}, the run's 10th-percentile op time)",
            ),
        ),
        steps=_span([s.index for s in steady]),
        cause="dispatch",
        subject="eager step",
        estimated=True,
    )


@rule("float64", about="float64 or complex128 values, which a TPU does not have", view="ops")
def float64(facts: RunFacts) -> Iterable[Finding]:
    wide = facts.query.float64_ops()
    if not wide:
        return
    # printing a tpu tensor runs PyTorch's formatting code on the device, and it computes in
    # float64 (it calls .double()): ops compiled only at lines that printed a tensor are the
    # formatter's, not the program's
    printing = {(t.location.file, t.location.line) for t in facts.transfers if t.op == "print" and t.location}
    compiles: dict[str, list[CompileEvent]] = {}
    for c in facts.compiles:
        if c.name in wide and ("float64" in c.signature or "complex128" in c.signature):
            compiles.setdefault(c.name, []).append(c)
    for name, items in compiles.items():
        if all(c.location is not None and (c.location.file, c.location.line) in printing for c in items):
            del wide[name]
    if not wide:
        return
    names = sorted(wide, key=lambda n: (-wide[n][1], n))
    first = min((c for n in names for c in compiles.get(n, ())), key=lambda c: c.id, default=None)
    runs = sum(r for _, r in wide.values())
    yield Finding(
        kind="float64",
        severity="error",
        title=f"{_plural(len(names), 'op')} ran in float64/complex128 ({_listing(names, 4)}): a TPU has no float64",
        fix=(
            "make them float32 where the data enters: look for .double(), dtype=torch.float64, "
            "torch.from_numpy of float64 arrays, and Python floats made into tensors with the default dtype "
            "set to float64; on a TPU these ops fail or must be rewritten"
        ),
        cost_seconds=0.0,
        evidence=Evidence(
            first.location if first is not None else None,
            (Count("ops", len(names)), Count("executions", runs)),
            tuple(f"{n}: {wide[n][0]} program(s), {wide[n][1]} execution(s)" for n in names[:6]),
        ),
        steps=None,
        cause="dtype",
        subject="float64",
        targets=tuple(names),
    )


def _g(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.2g}"


@rule("divergence", about="an op whose result leaves tolerance against PyTorch on CPU, or makes NaN/Inf", view="divergence")
def divergence(facts: RunFacts) -> Iterable[Finding]:
    first = facts.query.first_divergence()
    origin = facts.query.nan_origin()
    for event, what in ((first, "first"), (origin, "nan")):
        if event is None or (what == "nan" and first is not None and origin.id == first.id):
            continue
        name = f"{event.name} ({event.target}, {event.graph})" if event.mode == "compiled" else event.name
        step = facts.step_of(event.ts)
        if what == "nan":
            title = f"{name} makes NaN/Inf from finite inputs at {_where(event.location)}"
            fix = "look at this op's inputs at that line: a division by zero, log or sqrt of a negative, an overflow"
        else:
            title = (
                f"{name} is the first op over tolerance against CPU at {_where(event.location)} "
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
            evidence=Evidence(
                event.location,
                (
                    Count("max abs error", event.max_abs),
                    Count("x tolerance", event.ratio),
                    Count("elements over tolerance", event.mismatched),
                ),
                (f"{event.measure} measure, {event.mode} mode, {event.dtype}",),
            ),
            steps=(step, step) if step is not None else None,
            cause="nan" if what == "nan" else event.measure,
            subject=f"{what}: {name}",
        )
    fused = _fused_divergence(facts, first)
    if fused is not None:
        yield fused


def _fused_divergence(facts: RunFacts, first: Any) -> Finding | None:
    """The first node that drifts in a real compiled program whose outputs leave tolerance,
    unless the node check explained it as noise or already named that node."""
    event = facts.query.first_divergence("fused")
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
            f"the compiled program's outputs leave tolerance against CPU; {name} at {_where(event.location)} "
            f"({event.phase}) is the first node that drifts in the fused program: max abs {_g(event.max_abs)}, "
            f"{_g(event.ratio)}x its tolerance"
        ),
        fix=(
            "XLA's fused program computes this line otherwise than PyTorch op by op (constants folded, a "
            "reduction reassociated, an intermediate kept in another precision); if the difference matters, "
            "compute that line in a wider dtype (.float() before it) or keep it out of torch.compile"
        ),
        cost_seconds=0.0,
        evidence=Evidence(
            event.location,
            (
                Count("max abs error", event.max_abs),
                Count("x tolerance", event.ratio),
                Count("elements over tolerance", event.mismatched),
            ),
            (f"fused measure, compiled mode, {event.dtype}",),
        ),
        steps=(step, step) if step is not None else None,
        cause="fused",
        subject=f"fused: {name}",
    )
