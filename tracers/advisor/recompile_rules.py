"""The advisor's rules for recompiles: shapes that keep changing (padding fixes them), recompiles
by their other causes, and functions that hit dynamo's recompile limit.
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_seconds
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Consequence, Count, Evidence, Finding
from tpu_debug.tracers.advisor.prose import index_span, listing, most_common_line, plural
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation
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


# -- sizes that change: one finding per cause ---------------------------------------------------
#
# A size that changes reaches many programs: the compiled module fed the batch recompiles (forward
# and backward), the loss's eager ops around it recompile, the factory that makes the input is
# compiled for each new size, and once dynamo gives up compiling the module its ops recompile
# eagerly. Each of these is a *track*: one dimension (or one element of a static size argument)
# of one op or graph, with the values it took per step. Tracks that take the same values in the
# same steps (or a fixed multiple of them: the flattened batch x length, a mean's divisor) are
# one size; so is a recompile-limit hit on a size guard and the tracks holding the size it failed
# on. One size is one finding, at the line where it enters the step's work, and the rest are its
# consequences.


@dataclasses.dataclass(slots=True)
class _Track:
    """One size of one op or graph that takes new values in steady state."""

    identity: str
    mode: str | None
    what: str  # "dim 0 of arg 2 'x'", "element 0 of static arg 'size'"
    shape: bool  # a tensor's dimension (False: a static argument's value, such as a factory's size)
    change: Change | None
    values: list[int]
    by_step: dict[int, set[int]]
    events: list[CompileEvent]  # its steady recompiles
    arg: str | None = None  # a static argument's name
    shown: tuple[str, ...] = ()  # a static argument's values, as compiled, in order


@dataclasses.dataclass(slots=True)
class _SizeCause:
    """Tracks (and recompile-limit hits) that are one size."""

    tracks: list[_Track]
    hits: list[Any]


def _ints(text: str) -> list[int] | None:
    """A static argument's value as integers: ``"[16, 32]"`` -> [16, 32], ``"128"`` -> [128]."""
    parts = [p.strip() for p in text.strip().strip("[]()").split(",") if p.strip()]
    try:
        return [int(p) for p in parts] if parts else None
    except ValueError:
        return None


def _dim_values(c: CompileEvent, change: Change) -> set[int]:
    """The sizes ``change``'s dimension has in compile ``c``."""
    if change.detail == "storage":
        out = set()
        for d in c.diffs:
            if _storage_moved(d) and d.arg_name == change.arg_name and change.dim is not None:
                now = storage_sizes(d.now)
                if now is not None and change.dim < len(now):
                    out.add(now[change.dim])
        return out
    named = change.arg_name is not None and change.arg_name != f"arg{change.arg_index}"
    for i, a in enumerate(c.args):
        if (a.name == change.arg_name) if named else (i == change.arg_index):
            if a.shape is not None and change.dim is not None and change.dim < len(a.shape):
                return {int(a.shape[change.dim])}
            return set()
    return set()


def _by_step(facts: RunFacts, events: Sequence[CompileEvent], values: Any) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for c in events:
        step = facts.step_of(c.ts)
        found = values(c)
        if step is not None and found:
            out.setdefault(step, set()).update(found)
    return out


def _tracks(facts: RunFacts) -> list[_Track]:
    """The run's sizes that change in steady state: a dimension of each op or graph that takes
    three or more sizes in two steady steps or more, and each element of a static argument
    (a factory's size) that takes new values in two steady steps or more."""
    compiles = _read_compiles(facts)
    history: dict[tuple[str | None, str], list[CompileEvent]] = {}
    for c in compiles:
        history.setdefault((c.mode, c.identity or c.name), []).append(c)
    out = []
    for (mode, identity), items in _steady_recompiles(facts).items():
        shaped = [c for c in items if _cause(c.diffs)[0] == "shape"]
        steps = facts.steady_steps_of(shaped)
        member = _shape_member(compiles, mode, identity, shaped) if len(steps) >= 2 else None
        if member is not None:
            change, values = member
            by_step = _by_step(facts, history[(mode, identity)], lambda c, ch=change: _dim_values(c, ch))
            out.append(_Track(identity, mode, change.what, True, change, values, by_step, shaped))
        statics = [c for c in items if _cause(c.diffs)[0] == "static"]
        names = dict.fromkeys(d.arg_name for c in statics for d in c.diffs if d.aspect == "static" and d.arg_name)
        for name in names:
            def element(c: CompileEvent, k: int, name: str = name) -> set[int]:
                arg = next((a for a in c.args if a.name == name and a.shape is None), None)
                found = _ints(str(arg.static)) if arg is not None else None
                return {found[k]} if found is not None and k < len(found) else set()
            mine = [c for c in statics if any(d.arg_name == name for d in c.diffs)]
            if len(facts.steady_steps_of(mine)) < 2:
                continue
            width = max((len(_ints(str(a.static)) or ()) for c in mine for a in c.args if a.name == name), default=0)
            for k in range(width):
                by_step = _by_step(facts, history[(mode, identity)], lambda c, k=k: element(c, k))
                values = sorted(set().union(*by_step.values())) if by_step else []
                if len(values) >= 3:
                    shown = tuple(dict.fromkeys(str(a.static) for c in history[(mode, identity)]
                                                for a in c.args if a.name == name and a.shape is None))
                    out.append(_Track(identity, mode, f"element {k} of static arg '{name}'", False, None, values,
                                      by_step, mine, name, shown))
    return out


def _same_size(a: _Track, b: _Track) -> bool:
    """``a`` and ``b`` are one size: they take the same values in the steps where both compiled
    (two at least, over two values at least), or move in lockstep with it, a fixed multiple of
    it (the flattened batch x length, a mean's divisor) or a fixed offset from it (a sequence
    and its shifted targets, ``tokens[:, :-1]``) in three steps at least and three of four."""
    common = sorted(set(a.by_step) & set(b.by_step))
    if len(common) >= 2 and all(a.by_step[s] & b.by_step[s] for s in common):
        if len({min(a.by_step[s] & b.by_step[s]) for s in common}) >= 2:
            return True
    single = [(next(iter(a.by_step[s])), next(iter(b.by_step[s]))) for s in common
              if len(a.by_step[s]) == len(b.by_step[s]) == 1]
    if len(single) < 3:
        return False
    relations: collections.Counter[tuple] = collections.Counter()
    for x, y in single:
        relations[("offset", x - y)] += 1
        if x > 0 and y > 0:
            r = fractions.Fraction(x, y)
            if r.denominator == 1 or r.numerator == 1:
                relations[("ratio", r)] += 1
    for relation, n in relations.items():
        agreeing = {x for x, y in single if (x - y if relation[0] == "offset" else fractions.Fraction(x, y)) == relation[1]}
        if n >= 3 and 4 * n >= 3 * len(single) and len(agreeing) >= 3:
            return True
    return False


def _size_guard(hit: Any) -> tuple[str, int, int] | None:
    """(tensor, dim, the size that failed the guard) of a recompile-limit hit on a size guard."""
    m = _SIZE_MISMATCH.match(hit.reason.strip())
    if m:
        return m["tensor"], int(m["dim"]), int(m["actual"])
    return None


_SIZE_MISMATCH = re.compile(
    r"^tensor '(?P<tensor>.+?)' size mismatch at index (?P<dim>\d+)\. expected (?P<expected>\d+), actual (?P<actual>\d+)$"
)


def _hit_targets(facts: RunFacts, hit: Any) -> tuple[str, ...]:
    """The identities of the compiles of the function a recompile-limit hit is about."""
    if getattr(hit, "identity", None):
        base = hit.identity.rsplit(" (", 1)[0]
        return tuple(dict.fromkeys(c.identity for c in facts.compiles
                                   if c.identity and c.identity.rsplit(" (", 1)[0] == base))
    return tuple(
        dict.fromkeys(c.identity for c in facts.compiles if c.identity and c.identity.startswith(f"{hit.name} in "))
    )


def _size_causes(facts: RunFacts) -> list[_SizeCause]:
    return facts.memo("size_causes", lambda: _find_size_causes(facts))


def _find_size_causes(facts: RunFacts) -> list[_SizeCause]:
    tracks = _tracks(facts)
    hits = [h for h in facts.recompile_limits if _size_guard(h) is not None]
    parent = list(range(len(tracks) + len(hits)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    for i, a in enumerate(tracks):
        for j in range(i + 1, len(tracks)):
            if _same_size(a, tracks[j]):
                union(i, j)
    for h, hit in enumerate(hits):
        _, _, size = _size_guard(hit)  # type: ignore[misc]
        step = facts.step_of(hit.ts)
        targets = set(_hit_targets(facts, hit))
        for i, t in enumerate(tracks):
            if t.identity in targets or (step is not None and size in t.by_step.get(step, ())):
                union(len(tracks) + h, i)
    groups: dict[int, _SizeCause] = {}
    for i, t in enumerate(tracks):
        groups.setdefault(find(i), _SizeCause([], [])).tracks.append(t)
    for h, hit in enumerate(hits):
        root = find(len(tracks) + h)
        if root in groups:
            groups[root].hits.append(hit)
    # a size some op's dimension takes is a cause; static values alone stay the recompile rule's
    return [g for g in groups.values() if any(t.shape for t in g.tracks)]


def _claimed(facts: RunFacts) -> tuple[set[int], set[int]]:
    """The compile events and the recompile-limit hits (their ids) a size cause accounts for."""
    causes = _size_causes(facts)
    return ({c.id for g in causes for t in g.tracks for c in t.events}, {h.id for g in causes for h in g.hits})


def _majority(cause: _SizeCause) -> dict[int, int]:
    """Per step, the size most of the cause's dimensions hold (the smaller on a tie)."""
    out = {}
    for s in sorted({s for t in cause.tracks if t.shape for s in t.by_step}):
        counts = collections.Counter(v for t in cause.tracks if t.shape for v in t.by_step.get(s, ()))
        out[s] = max(counts, key=lambda v: (counts[v], -v))
    return out


def _primary(facts: RunFacts, cause: _SizeCause) -> _Track:
    """The track the finding is about. A compiled module's or function's forward graph: the
    size enters the step where it is called. Else, among the ops at the line the size reaches
    first in most steps, the one whose sizes are most often the cause's (not a multiple or an
    offset of it)."""
    shaped = [t for t in cause.tracks if t.shape]
    graphs = [t for t in shaped if t.mode == "compiled" and not t.identity.endswith("(backward)")]
    if graphs:
        return min(graphs, key=lambda t: min(c.id for c in t.events))
    per_step: dict[int, list[CompileEvent]] = {}
    for t in shaped:
        for c in t.events:
            step = facts.step_of(c.ts)
            if step is not None:
                per_step.setdefault(step, []).append(c)
    lines = collections.Counter(
        _line_of(min(events, key=lambda c: (c.ts, c.id)).location) for events in per_step.values()
    )
    line = max(lines, key=lambda k: lines[k]) if lines else None
    here = [t for t in shaped if any(_line_of(c.location) == line for c in t.events)] or shaped
    sizes = _majority(cause)
    # the ops after the user's tensor may see a multiple of its size (a batch x length flattened
    # for a matmul), and there can be more of them: a size that is a multiple of another of the
    # line's in a step is not the size as the user's tensor has it

    def multiples(t: _Track) -> int:
        return sum(1 for s, vs in t.by_step.items()
                   if any(v % w == 0 and v // w >= 2 for v in vs for o in here if o is not t
                          for w in o.by_step.get(s, ()) if w > 0))

    return max(here, key=lambda t: (-multiples(t), sum(1 for s, v in t.by_step.items() if sizes.get(s) in v),
                                    -max(t.values), -min(c.id for c in t.events)))


def _line_of(loc: SourceLocation | None) -> tuple[str, int] | None:
    return (loc.file, loc.line) if loc is not None else None


def _grows_each_step(track: _Track) -> bool:
    """Its size grows at every step it compiles in: larger than at every earlier step."""
    seq = [max(track.by_step[s]) for s in sorted(track.by_step)]
    return len(seq) >= 4 and all(b > a for a, b in zip(seq, seq[1:]))


_CATS = ("cat", "concat", "concatenate")


def _concatenated(facts: RunFacts, sizes: dict[int, int]) -> bool:
    """A ``torch.cat`` compiled in the steps where the size grew makes a tensor of that size or
    one less: the size grows by concatenating onto a tensor (generated tokens, a KV cache)."""
    for c in facts.compiles:
        if c.mode != "eager" or (c.identity or c.name).split(".")[0] not in _CATS:
            continue
        step = facts.step_of(c.ts)
        size = sizes.get(step) if step is not None else None
        if size is not None and any(a.shape and (size in a.shape or size - 1 in a.shape) for a in c.args):
            return True
    return False


def _size_fix(facts: RunFacts, primary: _Track, cause: _SizeCause, values: list[int],
              compiled: bool) -> tuple[str, bool]:
    """The fix for a size that changes, from what the run shows it is, and whether it is only a
    decoding loop's integer bookkeeping (an info, see :func:`_growing_fix`)."""
    change = primary.change
    assert change is not None
    grows = _grows_each_step(primary)
    sizes = {s: max(v) for s, v in primary.by_step.items()}
    if grows and _concatenated(facts, sizes):
        # a sequence extended one step at a time by concatenation (generated tokens, a KV cache)
        members = [(t.identity, t.mode, t.change, t.values, t.events) for t in cause.tracks if t.shape]
        return _growing_fix(change, primary.identity, values, members)
    multiple, padded = _buckets(values)
    mark = (
        "; torch._dynamo.mark_dynamic(t, dim) (or torch.compile(..., dynamic=True)) stops dynamo from tracing "
        "again, but XLA still compiles one program per size" if compiled else ""
    )
    # padding is offered where the run's sizes show it helps: fewer programs than sizes
    bucket = (
        f"pad it up to a multiple of {multiple} where the data is made: its {len(values)} sizes "
        f"({values[0]}..{values[-1]}) become {len(padded)} ({', '.join(map(str, padded))}), so each program "
        f"compiles {len(padded)} times instead of {len(values)}"
    ) if len(padded) < len(values) else (
        f"pad it to one size where the data is made ({max(values)} covers every size seen) and mask the padding out"
    )
    rows = change.dim == 0 and change.detail is None
    if grows:
        what = (f"{change.what} of {primary.identity} grows at every step ({values[0]}..{values[-1]}) and nothing "
                "in the step concatenates onto it: the size comes from where the input is made")
        return (f"{what}; keep it one size at every step (make the input at its final size once, or a "
                f"fixed size each step), or {bucket}{mark}"), False
    if rows:
        what = f"{change.what} of {primary.identity}, the rows of each call, takes {len(values)} sizes"
        return (f"{what}: give every call the same number of rows (batch the data to one size: fill a short "
                f"batch with rows the loss ignores, or drop it), or {bucket}{mark}"), False
    return (f"{change.what} of {primary.identity} takes {len(values)} sizes: {bucket}, where the data is batched; "
            f"mask the padding out of the result (ignore_index in the loss, an attention mask){mark}"), False


def _consequences(facts: RunFacts, cause: _SizeCause, primary: _Track | None) -> tuple[Consequence, ...]:
    """What the size led to beside the primary's own recompiles: the other graphs and ops it
    recompiled (by line), the factory that made the input at each size, the recompile limit
    it made a function hit."""
    out = []
    by_where: dict[tuple, list[_Track]] = {}
    for t in cause.tracks:
        if t is primary:
            continue
        loc = most_common_line(c.location for c in t.events)
        key = ("graph", t.identity.rsplit(" (", 1)[0]) if t.mode == "compiled" else (t.mode, t.shape, loc)
        by_where.setdefault(key, []).append(t)
    for key, tracks in by_where.items():
        events = list({c.id: c for t in tracks for c in t.events}.values())
        seconds = sum(c.seconds for c in events)
        names = list(dict.fromkeys(t.identity for t in tracks))
        loc = most_common_line(c.location for c in events)
        steps = facts.steady_steps_of(events)
        if key[0] == "graph":
            text = f"{listing(names, 3)}: {plural(len(events), 'new program')} in {plural(len(steps), 'steady step')}"
        elif not tracks[0].shape:
            shown = listing(list(dict.fromkeys(v for t in tracks for v in t.shown)), 4)
            text = (f"{listing(names, 3)} makes its output at each new size ({shown}): "
                    f"{plural(len(events), 'recompile')} in {plural(len(steps), 'steady step')}")
        else:
            text = (f"eager {listing(names, 4)}: {plural(len(events), 'new program')} "
                    f"in {plural(len(steps), 'steady step')}")
        out.append(Consequence("recompile" if not tracks[0].shape else "dynamic_shape", text, loc, seconds,
                               tuple(names)))
    for hit in cause.hits:
        step = facts.step_of(hit.ts)
        out.append(Consequence(
            "recompile_limit",
            f"{hit.name} hit dynamo's {hit.limit_type} ({hit.limit})" + (f" in step {step}" if step is not None else "")
            + ": it runs uncompiled from then on, its ops compiled eagerly for each new size",
            hit.location, 0.0, _hit_targets(facts, hit),
        ))
    return tuple(out)


def _cause_sizes(facts: RunFacts, cause: _SizeCause, primary: _Track) -> list[int]:
    """The size at each step it took a new one, in step order, once each: the primary's, and in
    steps the primary did not compile (a module run uncompiled after dynamo's limit) the value
    most of the cause's tracks hold."""
    out: dict[int, None] = {}
    majority = _majority(cause)
    for s, size in majority.items():
        for v in sorted(primary.by_step.get(s, {size})):
            out.setdefault(v, None)
    return list(out)


def _limited_compiles(facts: RunFacts, cause: _SizeCause, seen: set[int]) -> list[CompileEvent]:
    """The steady recompiles of the functions ``cause`` made hit dynamo's limit, not in ``seen``."""
    targets = {t for h in cause.hits for t in _hit_targets(facts, h)}
    return [c for c in facts.compiles
            if c.identity in targets and c.diffs and c.id not in seen and facts.phase(c.ts) == "steady"]


def _compiled_sizes(facts: RunFacts, cause: _SizeCause, what: str) -> list[int]:
    """The sizes, in compile order, that the functions ``cause`` made hit dynamo's limit were
    compiled for, of the input dimension ``what`` (``dim 0 of input 'x'``) names."""
    m = re.match(r"dim (\d+) of input '(.+)'$", what)
    if m is None:
        return []
    dim, name = int(m[1]), m[2]
    targets = {t for h in cause.hits for t in _hit_targets(facts, h)}
    out: dict[int, None] = {}
    for c in facts.compiles:
        if c.identity in targets:
            for a in c.args:
                if a.name == name and a.shape is not None and dim < len(a.shape):
                    out.setdefault(int(a.shape[dim]), None)
    return list(out)


def _entered_by_hit(cause: _SizeCause, primary: _Track) -> tuple[str, str, SourceLocation] | None:
    """Where the size enters the step when the compiled function it reached recompiled only
    before the steady steps and then hit dynamo's limit: its size guard names the input and the
    dimension, and the hit is at the line that calls the function (the eager ops that recompile
    after it are what running it uncompiled makes). None when a compiled graph is the primary."""
    if primary.mode == "compiled" or not cause.hits:
        return None
    hit = cause.hits[0]
    guard = _size_guard(hit)
    if guard is None or hit.location is None:
        return None
    tensor, dim, _ = guard
    name = tensor[3:-2] if tensor.startswith("L['") and tensor.endswith("']") else tensor
    return f"dim {dim} of input '{name}'", hit.name, hit.location


def _size_text(track: _Track) -> str:
    """The size in the user's words: a compiled graph's input by its name (``dim 0 of input 'x'``),
    never by its place among the parameters AOTAutograd lifted before it."""
    change = track.change
    assert change is not None
    name = change.arg_name
    if track.mode == "compiled" and name and name != f"arg{change.arg_index}" and change.dim is not None:
        return f"dim {change.dim} of input '{name}'"
    return change.what


@rule("dynamic_shape", about="a size that takes new values in steady state, recompiling every program it reaches (one finding per size)", view="recompiles")
def dynamic_shape(facts: RunFacts) -> Iterable[Finding]:
    for cause in _size_causes(facts):
        primary = _primary(facts, cause)
        change, values = primary.change, _cause_sizes(facts, cause, primary)
        assert change is not None
        change = dataclasses.replace(change, what=_size_text(primary))
        events = list({c.id: c for t in cause.tracks for c in t.events}.values())
        shaped = [c for t in cause.tracks if t.shape for c in t.events]
        # the function that hit the limit recompiled for the size before it stopped, in steady
        # steps too few to be a track of their own: those compiles are this cause's
        limited = _limited_compiles(facts, cause, {c.id for c in events})
        events += limited
        shaped += limited
        steps = sorted({*facts.steady_steps_of(shaped), *facts.steady_steps_of(cause.hits)})
        seconds = sum(c.seconds for c in events)
        ops = list(dict.fromkeys([primary.identity, *(t.identity for t in cause.tracks)]))
        compiled = any(t.mode == "compiled" for t in cause.tracks) or bool(cause.hits)
        who, location = primary.identity, most_common_line(c.location for c in primary.events)
        consequences = _consequences(facts, cause, primary)
        entered = _entered_by_hit(cause, primary)
        if entered is not None:
            # the finding is the compiled function's input; the eager op it was read from is one
            # of the ops running it uncompiled recompiled
            what, who, location = entered
            change = dataclasses.replace(change, what=what)
            consequences = _consequences(facts, cause, None)
            m = _SIZE_MISMATCH.match(cause.hits[0].reason.strip())
            example = f"input '{m['tensor']}' dim {m['dim']}: {m['expected']} -> {m['actual']}" if m else None
            # the sizes the function was compiled for before it stopped are the cause's first ones
            earlier = _compiled_sizes(facts, cause, what)
            values = [*(v for v in earlier if v not in values), *values]
            ops = list(dict.fromkeys([who, *ops]))
        fix, bookkeeping = _size_fix(facts, dataclasses.replace(primary, change=change, identity=who), cause,
                                     sorted(values), compiled)
        if entered is None:
            example = next((describe(d) for c in reversed(primary.events) for d in c.diffs if _diff_cause(d) == "shape"),
                           None)
        read_back = all(getattr(c, "from_cache", False) for c in events)
        severity = "error" if cause.hits else ("info" if bookkeeping else "warning")
        yield Finding(
            kind="dynamic_shape",
            severity=severity,
            title=(
                f"{change.what} of {who} takes a new size in steady state "
                f"({listing([str(v) for v in sorted(values)])}): {plural(len(events), 'new program' if read_back else 'recompile')} "
                f"of {plural(len(ops), 'op')} in {plural(len(steps), 'step')}, {format_seconds(seconds)} "
                + ("reading them back from the compile cache" if read_back else "compiling")
                + ("; dynamo stopped compiling it" if cause.hits else "")
            ),
            fix=fix,
            cost_seconds=seconds,
            evidence=Evidence(
                location,
                (
                    Count("sizes", len(set(values))),
                    Count("ops", len(ops)),
                    Count("recompiles in steady state", len(events)),
                    Count("steady steps with recompiles", len(steps)),
                    Count("compile time", seconds, "s"),
                ),
                (f"ops: {listing(ops)}", *([f"e.g. {example}"] if example else [])),
            ),
            steps=index_span(steps),
            cause="shape",
            subject=f"{who}: {change.what}",
            targets=tuple(ops),
            consequences=consequences,
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
    claimed, _ = _claimed(facts)
    for (mode, identity), items in _steady_recompiles(facts).items():
        for c in items:
            cause, diff = _cause(c.diffs)
            if cause == "shape" or c.id in claimed:
                continue  # the dynamic_shape rule's: a size that changes, with what it reaches
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
    _, claimed = _claimed(facts)
    for hit in facts.recompile_limits:
        if hit.id in claimed:
            continue  # a size that changes made it hit the limit: a consequence of that finding
        step = facts.step_of(hit.ts)
        targets = _hit_targets(facts, hit)
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


