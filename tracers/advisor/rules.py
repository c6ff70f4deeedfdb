"""The advisor's rules: one function per kind of finding (see the package docstring).

Every rule looks at steady state first: a cost paid once while the program
warms up is not worth a finding, a cost paid at every step is. "In every
step" means in at least half of the steady steps and in two of them at
least; a run without steps (no ``optimizer.step()``, no ``tpu_debug.step()``
and no loop found) counts a line that repeats :data:`REPEATS` times instead.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_bytes, format_location, format_seconds
from tpu_debug.core.hlo_text import parse_sharding
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, KeyDiff, ShardingRematEvent, SourceLocation
from tpu_debug.tracers.reading.recompile_analysis import (
    Change,
    by_call_site,
    describe,
    guard_subject,
    length_guard,
    read_guard,
    short_dtype,
    storage_sizes,
    summarize,
)
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT, CallSite, advice_for, user_caused

__all__ = [
    "DISPATCH_SHARE",
    "REPEATS",
    "TINY_ELEMENTS",
    "TINY_OPS_MIN",
    "TINY_SHARE",
    "UPLOAD_MIN_BYTES",
    "UPLOAD_SHARE",
]

# a run without steps: a line that does something this many times sits in a loop
REPEATS = 3
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
# a per-step upload of a new batch is worth overlapping when it is this big and takes
# this share of the steady step's time
UPLOAD_MIN_BYTES = 64 * 1024
UPLOAD_SHARE = 0.25


# ---------------------------------------------------------------------------------
# Prose helpers (findings are the only place the advisor's prose is made)
# ---------------------------------------------------------------------------------


def _where(loc: SourceLocation | None) -> str:
    return format_location(loc.file, loc.line) if loc is not None else "an unknown line"


def _site(loc: SourceLocation | None) -> str:
    """A line as a stable subject: ``train.py:41 in step``."""
    return format_location(loc.file, loc.line, loc.function) if loc is not None else "-"


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


def _storage_moved(d: KeyDiff) -> bool:
    """A view whose storage took another size (same rank): the tensor it is sliced from grew or shrank."""
    if d.aspect != "layout" or d.detail != "storage":
        return False
    before, now = storage_sizes(d.before), storage_sizes(d.now)
    return before is not None and now is not None and len(before) == len(now) and before != now


def _diff_cause(d: KeyDiff) -> str:
    if d.aspect == "shape":
        if d.detail == "rank":
            return "rank"
        return "shape" if d.dims else "inputs"
    if _storage_moved(d):
        return "shape"  # a size, of the tensor the view reads: padding applies as to any size
    if d.aspect == "key":
        return "cache" if d.before == "compiled before" else "other"
    return d.aspect if d.aspect in _CAUSES else "other"


def _cause(diffs: Sequence[KeyDiff]) -> tuple[str, KeyDiff | None]:
    # dynamo compiles a function again because one of its guards failed: the shapes of the new
    # graph are what that change made (a list that grew adds an input), so the guard is the cause
    guards = [d for d in diffs if d.source == "guard"]
    diffs = guards or diffs
    found = [(_CAUSES.index(_diff_cause(d)), i, d) for i, d in enumerate(diffs)]
    if not found:
        return "other", None
    _, _, d = min(found)
    return _diff_cause(d), d


def _read_compiles(facts: RunFacts) -> list[CompileEvent]:
    """The run's compiles, each eager recompile read against its own call site, and each failed
    dynamo guard read as what it tests (a value guard is the Python scalar it names)."""
    out = []
    for c in by_call_site(facts.compiles):
        if any(d.aspect == "guard" for d in c.diffs):
            c = dataclasses.replace(c, diffs=tuple(read_guard(d) for d in c.diffs))
        out.append(c)
    return out


def _first_repeat(facts: RunFacts, compiles: Sequence[CompileEvent]) -> int | None:
    """The first step (its index) that only repeats work earlier steps did: it compiles nothing
    for an op, a graph or a line that had no program yet (recompiling one that had is allowed:
    a value that changes at every step does that). The steps before it are warm-up."""
    new_work = {facts.step_of(c.ts) for c in compiles if not c.diffs}
    return next((s.index for s in facts.steps if s.index not in new_work), None)


def _steady_recompiles(facts: RunFacts) -> dict[tuple[str | None, str], list[CompileEvent]]:
    """Recompiles in steady steps from the first repeated step on, per (mode, identity), but
    for the eager ops of a function run uncompiled after a growing container made it hit
    dynamo's recompile limit (see :func:`_container_storm`)."""
    compiles = _read_compiles(facts)
    first = _first_repeat(facts, compiles)
    out: dict[tuple[str | None, str], list[CompileEvent]] = {}
    if first is None:
        return out
    storm = _container_storm(facts)
    for c in compiles:
        step = facts.step_of(c.ts)
        if storm is not None and c.mode == "eager" and step is not None and step >= storm:
            continue
        if c.diffs and step is not None and step >= first and facts.phase(c.ts) == "steady":
            out.setdefault((c.mode, c.identity or c.name), []).append(c)
    return out


def _container_storm(facts: RunFacts) -> int | None:
    """The first step in which a compiled function hit dynamo's recompile limit on a guard of a
    Python container's length, or None. From then on the function runs uncompiled on the
    container's contents, and the eager ops' new shapes are what the container's growth makes:
    padding them fixes nothing; the recompile_limit finding gives the fix."""
    steps = [facts.step_of(h.ts) for h in facts.recompile_limits if length_guard(h.reason) is not None]
    steps = [s for s in steps if s is not None]
    return min(steps) if steps else None


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
    """A size that grew by the same amount at each of four or more compiles (6, 7, 8, 9: three
    equal steps, which batches of varying size do not make): a sequence extended one step at a
    time, such as a dynamic KV cache, which padding does not fix. Fewer sizes, or uneven
    steps, read as batches of varying size."""
    if not change.grows or len(change.values) < 4:
        return False
    sizes = [int(v) for v in change.values]
    return len({b - a for a, b in zip(sizes, sizes[1:])}) == 1


def _storage_change(items: Sequence[CompileEvent]) -> Change | None:
    """The storage dimension that changed most across ``items`` (views of a tensor that
    changes size), as a change of that size, or None."""
    sizes: dict[tuple[int | None, str | None, int], dict[str, None]] = {}
    for c in items:
        for d in c.diffs:
            if _storage_moved(d):
                before, now = storage_sizes(d.before), storage_sizes(d.now)
                for k, (a, b) in enumerate(zip(before, now)):
                    if a != b:
                        seen = sizes.setdefault((d.arg_index, d.arg_name, k), {})
                        seen.setdefault(str(a), None)
                        seen.setdefault(str(b), None)
    if not sizes:
        return None
    (index, name, k), values = max(sizes.items(), key=lambda kv: len(kv[1]))
    subject = KeyDiff("layout", "", "", arg_index=index, arg_name=name).subject or "an input"
    return Change(
        f"dim {k} of the tensor viewed by {subject}", "shape", len(values) - 1, tuple(values), index, name, k, "storage"
    )


def _grown_tensor(change: Change, items: Sequence[CompileEvent]) -> tuple[str, int] | None:
    """The dtype and rank of the tensor whose size ``change`` is (a view's storage has the view's dtype)."""
    for c in reversed(items):
        for i, a in enumerate(c.args):
            if a.shape is None or not (a.name == change.arg_name or (change.arg_name is None and i == change.arg_index)):
                continue
            if change.detail == "storage":
                sizes = next((storage_sizes(d.now) for d in c.diffs if _storage_moved(d) and d.arg_name == a.name), None)
                return str(a.dtype), len(sizes) if sizes is not None else len(a.shape)
            return str(a.dtype), len(a.shape)
    return None


def _shape_member(facts_compiles: Sequence[CompileEvent], mode: str | None, identity: str, shaped: list[CompileEvent]) -> tuple[Change, list[int]] | None:
    """What size changed for one op or graph, and its values: a dimension of an input, or of
    the tensor an input is a view of; None when fewer than three sizes."""
    history = [c for c in facts_compiles if c.mode == mode and (c.identity or c.name) == identity]
    # the sizes the op's programs took, whether XLA compiled them in this run or the persistent
    # compile cache held them from an earlier one: the cache changes what a size costs, not the sizes
    group = summarize(history, read_backs_apart=False)[0]
    changes = [ch for ch in group.changes if ch.kind == "shape" and ch.dim is not None]
    change = changes[0] if changes else _storage_change(shaped)
    values = _numeric(change.values) if change is not None else None
    if change is None or values is None or len(values) < 3:
        return None
    return change, values


def _growing_fix(change: Change, identity: str, values: list[int], members: Sequence[Any]) -> tuple[str, bool]:
    """The fix for a size that grows by one step at every call, chosen by what grows with it:
    the model's own work (floating-point tensors: attention over a growing KV cache, a model
    run again on the whole sequence), or only integer bookkeeping such as the token ids, which a
    static cache does not fix; and whether it is only that bookkeeping (small ops of the decoding
    loop, compiled once per length and reused by later calls with the same lengths: worth
    knowing, not a warning)."""
    head = f"{change.what} of {identity} grows at every call ({values[0]}..{values[-1]}): a sequence extended one step at a time"
    grown = [(m[2], _grown_tensor(m[2], m[4])) for m in members]
    # a graph (compiled or lazy) that takes the growing input computes on it: the model's work
    if any(m[1] != "eager" for m in members) or any(t is not None and "float" in t[0] for _, t in grown):
        return (
            f"{head}, such as a dynamic KV cache; allocate it once at its final length and write each step "
            "into it (Hugging Face: generate(..., cache_implementation='static')), so every step has the same shapes"
        ), False
    kinds = _listing(sorted({f"{short_dtype(t[0])} of rank {t[1]}" for _, t in grown if t is not None}), 3)
    return (
        f"{head}; no floating-point tensor grows with it, so the model's work, and its KV cache if there is one, "
        f"keep their size already and a static cache changes nothing: what grows are small tensors ({kinds}), such as the "
        "token ids and attention mask generate() extends with torch.cat at each new token. Keep them in buffers "
        "allocated once at prompt + max_new_tokens and write each token in place (ids[:, pos] = token), or keep "
        "prompt lengths and max_new_tokens to a few fixed values, so later calls reuse the programs the first compiled"
    ), True


@rule("dynamic_shape", about="a dimension that takes new sizes in steady state, recompiling at each (padding fixes it)", view="recompiles")
def dynamic_shape(facts: RunFacts) -> Iterable[Finding]:
    # ops whose shape recompiles fall in the same steps change with one size (a sequence
    # length, and the flattened batch x length after it): one finding, about that size
    groups: dict[frozenset[int], list[tuple[str, str | None, Any, list[int], list[CompileEvent]]]] = {}
    compiles = _read_compiles(facts)
    for (mode, identity), items in _steady_recompiles(facts).items():
        shaped = [c for c in items if _cause(c.diffs)[0] == "shape"]
        steps = facts.steady_steps_of(shaped)
        member = _shape_member(compiles, mode, identity, shaped) if len(steps) >= 2 else None
        if member is not None:
            groups.setdefault(frozenset(steps), []).append((identity, mode, member[0], member[1], shaped))
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
        bookkeeping = False
        if _grows_by_steps(change):
            # a sequence extended one step at a time: padding each step is the wrong fix
            fix, bookkeeping = _growing_fix(change, identity, values, members)
        elif any(m[1] == "compiled" for m in members):
            fix += (
                "; torch._dynamo.mark_dynamic(t, dim) stops dynamo from retracing, but XLA still compiles "
                "one program per size"
            )
        others = [f"changes with it: {m[2].what} of {m[0]} ({m[3][0]}..{m[3][-1]})" for m in members[1:4]]
        read_back = all(getattr(c, "from_cache", False) for c in shaped)
        yield Finding(
            kind="dynamic_shape",
            severity="info" if bookkeeping else "warning",
            title=(
                f"{change.what} of {identity} takes a new size in steady state "
                f"({_listing([str(v) for v in values])}): {_plural(len(shaped), 'new program' if read_back else 'recompile')} of "
                f"{_plural(len(ops), 'op')} in {_plural(len(steps), 'step')}, {format_seconds(seconds)} "
                + ("reading them back from the compile cache" if read_back else "compiling")
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


# optimizers of torch.optim (by the file their step is in) whose tensor lr needs capturable=True
# (or fused=True) beside the foreach implementation they default to on a tpu device
_CAPTURABLE = ("adam", "adamw", "adamax", "adadelta", "asgd", "nadam", "radam", "rmsprop", "rprop")
_LR = re.compile(r"(?:^|[.\['\"])(?:lr|learning_rate)['\"\]]*$")


def _lr_fix(name: str, values: list[str], identity: str) -> str:
    """A learning rate dynamo guards on as a Python float, e.g. an optimizer's
    ``param_groups[0]['lr']`` that an LR scheduler changes at every step."""
    shown = f" ({_listing(values, 3)})" if len(values) > 1 else ""
    m = re.match(r"step in (\w+)\.py", identity)
    optimizer = m.group(1) if m else None
    if optimizer in _CAPTURABLE:
        idiom = (
            "create the optimizer with lr=torch.tensor(lr) and capturable=True (PyTorch's optimizer docs: a "
            "tensor lr needs capturable=True or fused=True)"
        )
    elif optimizer is not None and optimizer.isidentifier():
        idiom = "create the optimizer with lr=torch.tensor(lr)"
    else:
        idiom = (
            "create the optimizer with lr=torch.tensor(lr) (Adam, AdamW and the other optimizers with a "
            "capturable option also need capturable=True)"
        )
    if "group" not in name:  # a learning rate of the user's own, passed to a compiled function
        return (
            f"pass the learning rate '{name}' in as a tensor (torch.tensor(lr, device='tpu'), updated in place "
            f"with fill_): as a Python float dynamo guards on its value and compiles again for each new one{shown}"
        )
    return (
        f"the learning rate '{name}' is a Python float that changes between steps{shown}, as an LR scheduler "
        "changes it, and dynamo guards on its value, so the compiled optimizer step is compiled again for each one: "
        f"{idiom}; the scheduler then writes each new value into that tensor in place and one compiled step serves "
        "every learning rate"
    )


def _recompile_fix(cause: str, diff: KeyDiff | None, values: list[str], mode: str | None, identity: str = "") -> str:
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
    if cause == "scalar" and _LR.search(name):
        return _lr_fix(name, values, identity)
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
        return _layout_fix(diff, subject)
    if cause == "guard" and diff is not None and length_guard(diff.before) is not None:
        return _container_fix(length_guard(diff.before)[0])  # type: ignore[index]
    if cause == "guard":
        guard = diff.before if diff is not None else "?"
        return (
            f"keep what dynamo's failed guard checks fixed across calls ({guard_subject(guard)}): a Python value, "
            "global or attribute read inside the compiled function; pass a changing value in as a tensor"
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


def _container_fix(container: str) -> str:
    return (
        f"keep what {container} holds in a fixed-size tensor buffer allocated once (in a module, "
        "self.register_buffer('queue', torch.zeros(N, ...))) and write each new entry at an index that "
        "wraps around (buffer[ptr] = item, or index_copy_ for a batch of rows; ptr = (ptr + 1) % N, kept "
        f"as a tensor): the compiled function then reads one shape at every call. As a Python container, "
        f"{container} is traced element by element, so each new length is a new graph"
    )


def _container_title(container: str, lengths: list[int], what: str) -> str:
    grows = len(lengths) > 1 and lengths == sorted(lengths)
    shown = f"{lengths[0]}..{lengths[-1]}" if grows else _listing([str(n) for n in lengths], 4)
    return (
        f"{container}, a Python container the compiled function reads, {'grows' if grows else 'changes length'} "
        f"between calls (length {shown}) and dynamo guards on its length: {what}"
    )


def _layout_fix(diff: KeyDiff | None, subject: str) -> str:
    """By what the layout is: how a view is read, what it is a view of, or a device."""
    detail = diff.detail if diff is not None else None
    if detail == "device":
        return f"keep {subject} on one device: it is a CPU scalar tensor on some calls and a tpu tensor on others"
    if detail == "storage":
        return (
            f"{subject} is a view of tensors of different kinds at this line (a whole tensor, a slice of another): "
            "take it the same way at every step, from one fixed-size buffer"
        )
    return f"take {subject} the same way at every step (the same slicing), or make it contiguous (.contiguous()) before the call"


def _recompile_title(cause: str, diff: KeyDiff | None, ops: list[str], n: int, steps: int, values: list[str]) -> str:
    what = f"{_plural(n, 'recompile')} of {_listing(ops, 3)} in {_plural(steps, 'steady step')}"
    shown = _listing(values, 4)
    subject = (diff.subject if diff is not None else "") or "an input"
    if cause == "rank":
        return f"the rank of {subject} changes between steps ({shown}): {what}"
    if cause == "dtype":
        return f"the dtype of {subject} changes between steps ({shown}): {what}"
    if cause == "scalar" and diff is not None and diff.source == "guard":
        return f"dynamo guards on the Python value '{diff.arg_name}', which changes ({shown}): {what}"
    if cause == "scalar":
        return f"the Python number '{diff.arg_name if diff else '?'}' is baked into the program and changes ({shown}): {what}"
    if cause == "static":
        return f"the argument '{diff.arg_name if diff else '?'}' changes ({shown}): {what}"
    if cause == "precision":
        return f"the matmul precision changes between steps ({shown}): {what}"
    if cause == "cache":
        return f"executables are evicted and compiled again: {what}"
    if cause == "guard" and diff is not None and length_guard(diff.before) is not None:
        return _container_title(length_guard(diff.before)[0], _lengths(values), what)  # type: ignore[index]
    if cause == "guard":
        return f"a dynamo guard fails again in steady state ({guard_subject(diff.before) if diff else '?'}): {what}"
    return f"{what}: {describe(diff) if diff is not None else 'the key changed'}"


def _lengths(guards: Sequence[str]) -> list[int]:
    """The lengths a container's failed length guards were compiled for, in order, once each."""
    found = (length_guard(g) for g in guards)
    return list(dict.fromkeys(g[1] for g in found if g is not None))


def _number(text: str) -> str:
    """A float as a person writes it (``0.09000000000000001`` -> ``0.09``); anything else as it is."""
    try:
        value = float(text)
    except ValueError:
        return text
    return text if "." not in text and "e" not in text else f"{value:.6g}"


def _values(d: KeyDiff) -> tuple[str, ...]:
    # a failed dynamo guard knows the value it was compiled for, not the one that failed it
    values = (d.before,) if d.source == "guard" else (d.before, d.now)
    return tuple(map(_number, values)) if d.aspect == "scalar" else values


def _group_label(cause: str, diff: KeyDiff | None) -> str:
    """What the recompiles of a group have in common: the input, value or guard that changes,
    never the values themselves (a guard on a value that changes at every step is one group)."""
    if diff is None:
        return cause
    if cause in ("scalar", "static"):
        return f"{cause} {diff.arg_name}"
    if cause in ("rank", "dtype", "layout", "inputs"):
        return f"{cause} {diff.subject}"
    if cause == "guard":
        return f"guard {guard_subject(diff.before)}"
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
            fix=_recompile_fix(cause, diff, values, mode, ops[0]),
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
        targets = tuple(
            dict.fromkeys(c.identity for c in facts.compiles if c.identity and c.identity.startswith(f"{hit.name} in "))
        )
        fix = (
            "remove what makes it recompile (its other findings and the recompiles view name it); "
            "raising torch._dynamo.config.recompile_limit only delays this"
        )
        guard = read_guard(KeyDiff("guard", hit.reason, "failed", source="guard"))
        container = length_guard(hit.reason)
        if container is not None:
            fix = _container_fix(container[0]) + "; raising torch._dynamo.config.recompile_limit only delays this"
        elif guard.aspect == "scalar":  # the value the last failed guard checks is what keeps changing
            values = [
                d.before for c in _read_compiles(facts) if c.identity in targets
                for d in c.diffs if d.aspect == "scalar" and d.arg_name == guard.arg_name
            ]
            values = list(dict.fromkeys(map(_number, [*values, guard.before])))
            fix = _recompile_fix("scalar", guard, values, "compiled", targets[0] if targets else "") + (
                "; raising torch._dynamo.config.recompile_limit only delays this"
            )
        yield Finding(
            kind="recompile_limit",
            severity="error",
            title=(
                f"{hit.name} hit dynamo's {hit.limit_type} ({hit.limit})"
                + (f" on the length of {container[0]}, a Python container it reads," if container else "")
                + " and runs uncompiled from then on"
            ),
            fix=fix,
            cost_seconds=0.0,
            evidence=Evidence(hit.location, (Count("limit", hit.limit),), (f"last failed guard: {hit.reason}",)),
            steps=(step, step) if step is not None else None,
            cause="guard",
            subject=hit.name,
            targets=targets,
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


def _every_nth(steps: Sequence[int]) -> int | None:
    """N when ``steps`` (sorted step indexes) are evenly spaced N >= 2 apart, else None."""
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    return gaps.pop() if len(gaps) == 1 and min(gaps) >= 2 else None


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
        if _every_nth(steps) is not None:
            # A read at a fixed cadence (``if step % N == 0: print(loss.item())``) is logging the
            # user chose, and it is the fix this rule gives. Each sync drains the device queue
            # once; at one sync per N steps the host loses its lead over the device on 1/N of
            # the steps, and how much that costs depends on the step's host/device balance,
            # which a read count does not show. Only a read at every step is certain to cost
            # at every step.
            continue
        seconds = sum(t.seconds for t in chosen)
        nbytes = sum(t.nbytes for t in chosen)
        site = CallSite(location, direction, op, True, len(chosen), nbytes, seconds, ())
        what = CAUSE_TEXT.get(op, op)
        library = _library_frame(chosen)
        caused = user_caused(library)
        title = f"{what} at {_where(location)} waits for the device {_how_often(facts, steps, chosen)}"
        fix = advice_for(site)
        notes = (f"{direction} copies made by {what}",)
        if caused is not None:
            # the read is in library code, but the user's argument or cadence asks for it: the
            # line to change and the fix are the user's
            title = (f"{caused.what}: at {_where(location)} it waits for the device "
                     f"{_how_often(facts, steps, chosen)}")
            fix = caused.fix
            notes += (f"library frame: {library}", f"caused by the call's {caused.cause}")
            library = None
        elif library is not None:
            # the sync is the library's own code (transformers' generate() checking its stopping
            # criteria, say): the user's line is what reached it, and the fix is not theirs to make
            title = (f"{what} inside library code ({library}), reached from {_where(location)}, "
                     f"waits for the device {_how_often(facts, steps, chosen)}")
            fix = (f"the read is in {library}, not in this script: it syncs where the library needs "
                   "the value; call the library less often per step, or use an API of it that does not read")
            notes += (f"library frame: {library}",)
        yield Finding(
            kind="implicit_sync",
            severity="info" if library is not None else "warning",
            title=title,
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                location,
                (
                    Count("syncs", len(chosen)),
                    Count("steady steps", len(steps)),
                    Count("bytes", nbytes, "B"),
                    Count("time", seconds, "s"),
                ),
                notes,
            ),
            steps=_span(steps),
            cause="library" if library is not None else (caused.cause if caused is not None else op),
            subject=f"{_site(location)} ({op})",
        )


def _library_frame(events: Sequence[Any]) -> str | None:
    """The library frame every one of ``events`` was made in (its ``context``), None when any
    was the user's own line (a run recorded before contexts were kept has none)."""
    frames = {getattr(e, "context", None) for e in events}
    if len(frames) != 1 or None in frames:
        return None
    return frames.pop()


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


def _payload(events: Sequence[Any]) -> str:
    """``"same"`` when every copy carried the same bytes, ``"new"`` when the bytes changed,
    ``"unknown"`` when a copy has no fingerprint (the runtime takes none of a large payload,
    so a batch is never taken for a constant)."""
    digests = {getattr(t, "digest", None) for t in events}
    if None in digests:
        return "unknown"
    return "same" if len(digests) == 1 else "new"


# factories whose result is a random draw (the others make the same values from the same arguments)
_RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
    "multinomial", "poisson", "uniform", "choice", "permutation", "random", "integers", "standard_normal",
})
# factory -> its _like form's arguments beside the tensor it takes the shape of
_LIKE = {"rand": "x", "randn": "x", "randint": "x, low, high", "ones": "x", "zeros": "x", "full": "x, value"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Upload:
    """One line's uploads in steady state, as the h2d rule weighs them."""

    op: str
    location: SourceLocation | None
    aval: str
    per_step: float  # bytes
    seconds: float  # the copies' measured time, on this machine
    steps: tuple[int, ...]
    payload: str  # "same", "new" or "unknown" (see _payload)
    origin: str | None  # the host factory that made the data, when the line shows one


def _on_tpu(facts: RunFacts, nbytes: float, steps: Sequence[int]) -> tuple[float, float] | None:
    """(the copies' time, the steps' time) on the run's TPU target, estimated: ``nbytes`` over
    its host link, and the steps' programs as its compiles estimate them; None without a
    target, or when a step has no estimate."""
    target = facts.target
    if target is None or not target.host_bandwidth_per_device:
        return None
    step_seconds = [facts.target_seconds.get(i) for i in steps]
    if not steps or any(t is None for t in step_seconds):
        return None
    return nbytes / target.host_bandwidth_per_device, sum(step_seconds)  # type: ignore[arg-type]


def _host_made_text(u: _Upload, facts: RunFacts) -> tuple[str, str]:
    made = u.origin or "a factory"
    name = made.rpartition(".")[2]
    title = (
        f"{made}(...) at {_where(u.location)} {'draws' if name in _RANDOM else 'makes'} {u.aval} on the host, "
        f"copied to the device in {len(u.steps)} of {len(facts.steady)} steady steps"
    )
    if made.startswith("torch."):
        like = f", or torch.{name}_like({_LIKE[name]}) for a tensor shaped like x" if name in _LIKE else ""
        instead = f"torch.{name}(..., device=x.device){like}"
    else:
        instead = "torch's own function (torch.rand, torch.randn, torch.randint, torch.arange) with device=x.device"
    fix = (
        f"make it on the device, where it is used: {instead}; nothing is then made on the host or copied. "
        "The copy waits on the host at every step: on a TPU, whose step is far shorter than this "
        "machine's, that is a larger share of the step than here"
    )
    return title, fix


def _h2d_text(u: _Upload, facts: RunFacts, batches: bool) -> tuple[str, str] | None:
    """(title, fix) of a line that uploads at every steady step, or None when it is no finding.
    ``batches``: a line uploads data that changes and no factory made (a batch) in these steps."""
    n, steady = len(u.steps), len(facts.steady)
    what = CAUSE_TEXT.get(u.op, u.op)
    if u.payload == "same" and u.seconds > 0:
        # the same bytes every step: the copy buys nothing, whatever its share of the step
        title = (
            f"{what} at {_where(u.location)} uploads the same {format_bytes(u.per_step)} ({u.aval}) to the device "
            f"in {n} of {steady} steady steps, {format_seconds(u.seconds / n)} per step"
        )
        fix = (
            "the data is identical at every step: create it once on the device before the loop "
            "(the same expression, hoisted above the loop) and reuse that tensor"
        )
        return title, fix
    if u.op == "tensor" and u.payload != "new":
        title = (
            f"torch.tensor(...) at {_where(u.location)} builds a {u.aval} from Python data on the device "
            f"in {n} of {steady} steady steps"
        )
        fix = (
            "build it once, before the loop, when its values do not change; otherwise make it on the "
            "device (torch.arange, torch.full, indexing a tensor made once) instead of from a Python list"
        )
        return title, fix
    if u.origin is not None and batches:
        # data the step makes beside its batch (noise, timesteps, a mask): whatever its share of
        # this machine's step, it could be made on the device and copy nothing. A step whose
        # every upload is made by a factory is a program's stand-in for loading data: not judged.
        return _host_made_text(u, facts)
    return _batch_text(u, facts, what)


def _batch_text(u: _Upload, facts: RunFacts, what: str) -> tuple[str, str] | None:
    """A new batch copied synchronously: a finding when it is large and takes UPLOAD_SHARE of
    the steps' time, on the run's TPU target when there is one (estimated), else on this machine."""
    if u.per_step < UPLOAD_MIN_BYTES:
        return None
    tpu = _on_tpu(facts, u.per_step * len(u.steps), u.steps)
    if tpu is not None:
        seconds, step_seconds = tpu
        where = f"of their time on a {facts.target} (estimated: its host link and the steps' programs compiled for it)"
    else:
        seconds, step_seconds = u.seconds, sum(s.seconds for s in facts.steady)
        where = "of their time on this machine (no TPU target: run with --target to weigh it on a TPU)"
    if step_seconds <= 0 or seconds < UPLOAD_SHARE * step_seconds:
        return None
    title = (
        f"{what} at {_where(u.location)} copies {format_bytes(u.per_step)} ({u.aval}) to the "
        f"device in {len(u.steps)} steady steps, {100 * seconds / step_seconds:.0f}% {where}"
    )
    overlap = (
        "overlap the copy with the step: DataLoader(..., pin_memory=True) with "
        ".to('tpu', non_blocking=True), or prefetch the next batch while this one runs"
    )
    if u.payload == "new":  # the fingerprints differ: hoisting it out of the loop is no fix
        return title, f"the data changes at every step (a batch): {overlap}"
    return title, (
        "if the data is the same every step, move it to the device once, before the loop; "
        f"if it is a new batch, {overlap}"
    )


def _h2d_sites(facts: RunFacts) -> dict[tuple, list[Any]]:
    """The explicit uploads of steady steps by (line, op, shape, dtype), of the lines that
    upload in every steady step."""
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.direction == "h2d" and not t.implicit:
            sites.setdefault((t.location, t.op, t.shape, t.dtype), []).append(t)
    out = {}
    for key, events in sites.items():
        steady = facts.in_steady(events)
        steps = facts.steady_steps_of(steady)
        if len(steps) >= max(REPEATS, len(facts.steady) - 1) and sum(t.nbytes for t in steady):
            out[key] = steady
    return out


@rule("h2d_every_step", about="the same host-to-device copy at every step (identical data uploaded again, a tensor rebuilt from Python data, data made on the host that could be made on the device, a batch copied synchronously)", view="transfers")
def h2d_every_step(facts: RunFacts) -> Iterable[Finding]:
    if len(facts.steady) < REPEATS:
        return
    sites = _h2d_sites(facts)
    # a batch: data that changes, made by no factory the user's line shows (a dataset's slice)
    batches = any(all(getattr(t, "origin", None) is None for t in events) and _payload(events) != "same"
                  for events in sites.values())
    for (location, op, shape, dtype), steady in sites.items():
        steps = facts.steady_steps_of(steady)
        origins = {getattr(t, "origin", None) for t in steady}
        u = _Upload(op, location, f"{dtype}[{','.join(map(str, shape))}]", sum(t.nbytes for t in steady) / len(steps),
                    sum(t.seconds for t in steady), tuple(steps), _payload(steady),
                    origins.pop() if len(origins) == 1 else None)
        text = _h2d_text(u, facts, batches)
        if text is None:
            continue
        yield _h2d_finding(u, steady, text, facts)


def _h2d_finding(u: _Upload, steady: Sequence[Any], text: tuple[str, str], facts: RunFacts) -> Finding:
    same = u.payload == "same"
    host_made = u.origin is not None and not same
    facts_text = f"{u.aval} by {CAUSE_TEXT.get(u.op, u.op)}"
    if same:
        facts_text += f", identical bytes in all {len(steady)} steady copies"
    if host_made:
        facts_text += f", made on the host by {u.origin}"
    title, fix = text
    library = _library_frame(steady)
    if library is not None:
        # the library builds and uploads it (transformers making position ids, say): the fix
        # is not the user's to make, and the user's line is what reached it
        title = f"inside library code ({library}): {title}"
        fix = f"the copy is made in {library}, not in this script; {fix}"
        facts_text += f"; library frame: {library}"
    n = len(u.steps)
    counts = [
        Count("copies", len(steady)),
        Count("steady steps", n),
        Count("bytes per step", u.per_step, "B"),
        Count("time per step", u.seconds / n, "s"),
        Count("time", u.seconds, "s"),
    ]
    tpu = _on_tpu(facts, u.per_step * n, u.steps)
    if tpu is not None:
        counts.append(Count(f"copy time per step on {facts.target} (estimated)", tpu[0] / n, "s"))
        counts.append(Count(f"step time on {facts.target} (estimated)", tpu[1] / n, "s"))
    return Finding(
        kind="h2d_every_step",
        severity="info" if library is not None else "warning",
        title=title,
        fix=fix,
        cost_seconds=u.seconds,
        evidence=Evidence(u.location, tuple(counts), (facts_text,)),
        steps=_span(u.steps),
        cause="same_data" if same else ("host_made" if host_made else u.op),
        subject=f"{_site(u.location)} ({u.op})",
    )


@rule("d2h_every_step", about="a copy to the host at every step (.cpu(), .to('cpu')), which waits for the device each time", view="transfers")
def d2h_every_step(facts: RunFacts) -> Iterable[Finding]:
    sites: dict[tuple, list[Any]] = {}
    for t in facts.transfers:
        if t.direction == "d2h" and not t.implicit and not t.op.startswith("fallback:"):
            sites.setdefault((t.location, t.op), []).append(t)
    for (location, op), events in sites.items():
        found = _repeated(facts, events)
        if found is None:
            continue
        chosen, steps = found
        if _every_nth(steps) is not None:
            continue  # a copy every N steps is what this rule's fix asks for
        yield _d2h_finding(facts, location, op, chosen, steps)


def _d2h_finding(facts: RunFacts, location: SourceLocation | None, op: str, chosen: Sequence[Any],
                 steps: Sequence[int]) -> Finding:
    seconds = sum(t.seconds for t in chosen)
    nbytes = sum(t.nbytes for t in chosen)
    per = len(steps) or len(chosen)
    avals = _listing(list(dict.fromkeys(f"{t.dtype}[{','.join(map(str, t.shape))}]" for t in chosen)), 3)
    what = CAUSE_TEXT.get(op, op)
    library = _library_frame(chosen)
    title = (
        f"{what} at {_where(location)} copies {format_bytes(nbytes / per)} ({avals}) to the host "
        f"{_how_often(facts, steps, chosen)}: each copy waits for the device to finish the work queued before it"
    )
    fix = (
        "keep the work on the device: accumulate what the host reads in a device tensor (correct += "
        "(pred == y).sum(), total += loss.detach()) and copy it every N steps or once after the loop; "
        "a copy at every step makes the host wait for the device at every step, so it cannot queue the "
        "next step while the device runs this one"
    )
    notes = [f"{avals} by {what}, measured on this machine: {format_seconds(seconds)} in all"]
    if library is not None:
        title = f"inside library code ({library}): {title}"
        fix = f"the copy is made in {library}, not in this script; {fix}"
        notes.append(f"library frame: {library}")
    counts = [Count("copies", len(chosen)), Count("steady steps", len(steps)), Count("bytes", nbytes, "B"),
              Count("time", seconds, "s")]
    target = facts.target
    if target is not None and target.host_bandwidth_per_device:
        counts.append(Count(f"copy time on {target} (estimated)", nbytes / target.host_bandwidth_per_device, "s"))
    return Finding(
        kind="d2h_every_step",
        severity="info" if library is not None else "warning",
        title=title,
        fix=fix,
        cost_seconds=seconds,
        evidence=Evidence(location, tuple(counts), tuple(notes)),
        steps=_span(steps),
        cause=op,
        subject=f"{_site(location)} ({op})",
    )


# ---------------------------------------------------------------------------------
# Compiled mode, eager dispatch, float64, numerics
# ---------------------------------------------------------------------------------


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
        return f"dynamo splits {name} at {_where(location)}, the backward inside it", (
            f"{backward}; each break costs a program launch and a return to Python per call"
        )
    if not context:
        return f"dynamo splits {name} at {_where(location)}", (
            "move the call dynamo cannot trace (named in the reason) out of the compiled function, or "
            "replace it: keep values as tensors (torch.where instead of if on a tensor, no .item() or "
            "print inside); each break costs a program launch and a return to Python per call"
        )
    file, _, rest = context.rpartition(":")
    library = f"{os.path.basename(file)}:{rest}"
    return f"dynamo splits the compiled code that {_where(location)} runs, inside library code ({library})", (
        f"the break is in library code ({library}), not on your line: the line cannot be made traceable; "
        f"call what {_where(location)} reaches outside the compiled function, or compile only the code "
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
    if not _every_step(facts, [s.index for s in ran]):
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
                f"{what}; each of {len(ran)} steady steps runs {_plural(runs, 'compiled program')} "
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
            steps=_span([s.index for s in ran]),
            cause="library" if context else ("backward" if backward else "graph_break"),
            subject=f"{name}: {_site(location)}",
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
    where = _most_common(c.location for c in facts.compiles if c.mode == "eager" and c.location is not None)
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
        steps=_span([s.index for s in steady]),
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
            facts_text += (f"first float64 op: {first.name} at {_where(first.location)}",)
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
    ``tracers/recording/divergence/precision.py``): one finding per op and line, from its first event."""
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
                f"{name} at {_where(event.location)} decides otherwise at the TPU's precision: {changed} differ "
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
            subject=f"decision: {name} {_site(event.location)}",
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
                f"{op} in {name} at {_where(first.location)}: XLA gathers the whole tensor"
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
            subject=f"{name}: {op} {_site(first.location)}",
            targets=(name,),
        )
