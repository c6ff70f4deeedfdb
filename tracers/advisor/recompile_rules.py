"""The advisor's rules for recompiles: shapes that keep changing (padding fixes them), recompiles
by their other causes, and functions that hit dynamo's recompile limit.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_seconds
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import index_span, listing, most_common_line, plural
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, KeyDiff
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
    kinds = listing(sorted({f"{short_dtype(t[0])} of rank {t[1]}" for _, t in grown if t is not None}), 3)
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
                f"({listing([str(v) for v in values])}): {plural(len(shaped), 'new program' if read_back else 'recompile')} of "
                f"{plural(len(ops), 'op')} in {plural(len(steps), 'step')}, {format_seconds(seconds)} "
                + ("reading them back from the compile cache" if read_back else "compiling")
            ),
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                most_common_line(c.location for c in members[0][4]),
                (
                    Count("sizes", len(values)),
                    Count("ops", len(ops)),
                    Count("recompiles in steady state", len(shaped)),
                    Count("steady steps with recompiles", len(steps)),
                    Count("compile time", seconds, "s"),
                ),
                (f"ops: {listing(ops)}", *([f"e.g. {example}"] if example else []), *others),
            ),
            steps=index_span(steps),
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
    shown = f" ({listing(values, 3)})" if len(values) > 1 else ""
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
    shown = f"{lengths[0]}..{lengths[-1]}" if grows else listing([str(n) for n in lengths], 4)
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
    what = f"{plural(n, 'recompile')} of {listing(ops, 3)} in {plural(steps, 'steady step')}"
    shown = listing(values, 4)
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
                most_common_line(c.location for c in events),
                (
                    Count("recompiles in steady state", len(events)),
                    Count("steady steps with recompiles", len(steps)),
                    Count("ops", len(ops)),
                    Count("compile time", seconds, "s"),
                ),
                (f"ops: {listing(ops)}", *(f"e.g. {describe(d)}" for d in events[-1].diffs[:3])),
            ),
            steps=index_span(steps),
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


