"""Recompiles: is a compile the first of its op or graph, or a recompile, and what changed.

Every compile has an *identity*: the eager op overload (``mul.Tensor``),
for a compiled graph the function dynamo compiled and the graph's direction
(``"step in train.py (forward)"``; forward and inference graphs share one),
for a lazy fused graph where it was cut (``"graph cut by .item() at
train.py:40"``). A lazy graph's key is compared op by op (:func:`_graph_diffs`). A
compile whose identity was compiled before is a recompile. It is compared with
the closest earlier key of that identity (fewest mismatches; the latest on a
tie) and the differences are kept as data, :class:`~.events.KeyDiff` records
whose ``aspect`` says what changed:

=============  ================================================  =================================
aspect         what changed                                      rendered as
=============  ================================================  =================================
``shape``      an input's aval (``dims``: which dimensions)      ``arg 1 'other'``
``dtype``      only an input's dtype                             ``arg 1 'other' dtype``
``layout``     how a view is read (``detail``: view, storage;    ``arg 0 'self' view``
               its offset is an operand, never in the key), a
               host scalar (device), a dynamo stride guard
``static``     a static argument baked into the executable       ``static arg 'dim'``
``scalar``     a Python number baked in (eager static            ``python scalar baked in 'n'``
               ``Scalar`` arguments; dynamo value guards)
``inputs``     the number of inputs (both signatures shown)      ``inputs``
``precision``  ``torch.get_float32_matmul_precision()``          ``matmul precision``
``grad``       compiled under grad / no-grad (``detail``)        ``grad mode``, ``graph kind``
``guard``      any other failed dynamo guard (its text)          ``dynamo guard``
``graph``      a lazy fused graph's ops: the first op that       ``op 12 at train.py:40``,
               differs (with its line), their number, the        ``ops``, ``outputs``
               values it returns
=============  ================================================  =================================

A failed dynamo guard on an input gives the same aspects with ``source="guard"``
and no ``arg_index`` (``tensor 'x' dim 0``, ``tensor 'x' dtype``, ``tensor 'x'
stride 1``, ``tensor 'x' requires_grad``).

Prose is rendered from these at the edge (:func:`describe`, :func:`explain`,
:func:`summarize`), in the spirit of JAX's "closest seen signature has N
mismatches".

After the run, what changed is read by what it is, not by how it was first
rendered: a failed guard's text by what it tests (:func:`read_guard`: a value
guard on ``self.param_groups[0]['lr']`` is that Python value; :func:`guard_subject`:
a guard without its values), and an eager recompile against the keys of its
own line (:func:`by_call_site`: two lines' constants are no constant that changes).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation

__all__ = [
    "DEFAULT_STORM_THRESHOLD",
    "Change",
    "RecompileGroup",
    "arg_diffs",
    "aval",
    "by_call_site",
    "compare_args",
    "describe",
    "explain",
    "guard_subject",
    "layout_text",
    "length_guard",
    "pretty_source",
    "read_guard",
    "short_dtype",
    "storage_sizes",
    "summarize",
]

DEFAULT_STORM_THRESHOLD = 5

_SHORT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
    "complex64": "c64",
    "complex128": "c128",
    "float8_e4m3fn": "f8e4m3fn",
    "float8_e5m2": "f8e5m2",
}


def short_dtype(dtype: str | None) -> str:
    """``float32`` -> ``f32`` (as JAX prints avals); unknown names pass through."""
    text = str(dtype).removeprefix("torch.")
    return _SHORT.get(text, text)


def aval(shape: Sequence[int] | None, dtype: str | None) -> str:
    """``f32[8,128]``."""
    return f"{short_dtype(dtype)}[{','.join(str(int(d)) for d in (shape or ()))}]"


def _arg_label(i: int, name: str) -> str:
    return KeyDiff("shape", "", "", arg_index=i, arg_name=name).subject


def _static_text(value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _same_static(a: Any, b: Any) -> bool:
    # 1, 1.0 and True are equal in Python but are different keys (and programs)
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - exotic statics compare by identity
        return a is b


def _render_args(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        parts.append(aval(a.shape, a.dtype) if a.shape is not None else _static_text(a.static))
    return "(" + ", ".join(parts) + ")"


def arg_diffs(before: Sequence[Any], now: Sequence[Any]) -> list[KeyDiff]:
    """How the arguments ``now`` of a compile differ from ``before`` (``ArgInfo`` or
    ``ArgSpec`` records): one :class:`KeyDiff` per differing input.

    Example:
        >>> from tpu_debug.tracers.events import ArgInfo
        >>> arg_diffs([ArgInfo("self", (8,), "float32")], [ArgInfo("self", (9,), "float32")])[0].render()
        "arg 0 'self': f32[8] -> f32[9]"
    """
    return compare_args(before, now)[0]


def layout_text(key: str, value: Any) -> str:
    if value is None:
        return "tpu" if key == "device" else "contiguous"
    return repr(value) if isinstance(value, tuple) else str(value)


def compare_args(before: Sequence[Any], now: Sequence[Any]) -> tuple[list[KeyDiff], float]:
    """The differences, and how far apart the two keys are (for choosing the closest): an
    aval's differing dims count one by one; a different input count is as far as it gets."""
    if len(before) != len(now):
        return [KeyDiff("inputs", _render_args(before), _render_args(now))], 1000 + max(len(before), len(now))
    out: list[KeyDiff] = []
    score = 0.0
    for i, (a, b) in enumerate(zip(before, now)):
        name = b.name
        if a.shape is not None and b.shape is not None:
            sa, sb = tuple(a.shape), tuple(b.shape)
            if sa != sb:
                if len(sa) == len(sb):
                    dims = tuple(d for d, (x, y) in enumerate(zip(sa, sb)) if x != y)
                    detail = None
                    score += len(dims) + (short_dtype(a.dtype) != short_dtype(b.dtype))
                else:
                    dims, detail = (), "rank"
                    score += 1 + max(len(sa), len(sb))
                out.append(
                    KeyDiff(
                        "shape",
                        aval(sa, a.dtype),
                        aval(sb, b.dtype),
                        arg_index=i,
                        arg_name=name,
                        dims=dims,
                        detail=detail,
                    )
                )
                continue  # a view's strides and storage follow its shape: not news
            if a.dtype != b.dtype:
                out.append(
                    KeyDiff("dtype", short_dtype(a.dtype), short_dtype(b.dtype), arg_index=i, arg_name=name)
                )
                score += 1
            la, lb = dict(getattr(a, "layout", ()) or ()), dict(getattr(b, "layout", ()) or ())
            moved = False
            for k in sorted(set(la) | set(lb), key=str):
                if la.get(k) != lb.get(k):
                    before_text, now_text = layout_text(k, la.get(k)), layout_text(k, lb.get(k))
                    out.append(
                        KeyDiff("layout", before_text, now_text, arg_index=i, arg_name=name, detail=str(k))
                    )
                    moved = True
            # a view read at another place of its storage (its offset and the storage's size
            # move together as a sequence grows) is closer than any change of shape: the
            # same aval, the same program but for where it reads
            score += 0.5 if moved else 0
        elif a.shape is None and b.shape is None:
            if not _same_static(a.static, b.static):
                scalar = getattr(a, "scalar", False) or getattr(b, "scalar", False)
                before_text, now_text = _static_text(a.static), _static_text(b.static)
                aspect = "scalar" if scalar else "static"
                out.append(KeyDiff(aspect, before_text, now_text, arg_index=i, arg_name=name))
                score += 1
        else:  # a tensor where a static value was, or the reverse
            text = lambda s: aval(s.shape, s.dtype) if s.shape is not None else _static_text(s.static)
            out.append(KeyDiff("shape", text(a), text(b), arg_index=i, arg_name=name))
            score += 1
    return out, score


_SOURCE_ROOT = re.compile(r"^[LG]\['([^']+)'\]")
_SOURCE_MODULE = re.compile(r"\._(?:parameters|buffers|modules)\['([^']+)'\]")


def pretty_source(source: str) -> str:
    """``G['m']._parameters['weight']`` -> ``m.weight``; ``L['x'].size()[0]`` -> ``x.size()[0]``."""
    return _SOURCE_MODULE.sub(r".\1", _SOURCE_ROOT.sub(r"\1", source))


# what a failed dynamo guard compares a Python value with: a number, a bool, None, a string
_LITERAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|True|False|None|-?inf|nan|'[^']*'"
# a source: a name with attributes and subscripts (``L['self'].param_groups[0]['lr']``), no call
_VALUE_GUARD = re.compile(rf"^(?P<source>[A-Za-z_]\w*(?:\.\w+|\[[^\]]*\])*) == (?P<value>{_LITERAL})$")
_SIZE_GUARD = re.compile(r"^(?P<tensor>\S+)\.size\(\)\[(?P<dim>\d+)\] == (?P<value>\d+)$")
# a number the guard compares with, but no index (``[0]``) or part of a name
_GUARD_NUMBER = re.compile(r"(?<![\w\[.'])-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?(?![\w\]'])")


def read_guard(diff: KeyDiff, failure: Any = None) -> KeyDiff:
    """A failed dynamo guard kept as its text, read as what it tests when its form says so.

    A value guard on any source (``self.param_groups[0]['lr'] == 0.003``, where
    an optimizer's learning rate is read; ``G['cfg'].scale == 2``) is the Python
    scalar named by its source (the value is the one it was compiled for); a
    size guard (``L['x'].size()[0] == 8``) is that dimension. Its new value is the
    one ``failure`` (the :class:`~.dynamo_events.GuardFailure` it came from) read
    from the call, else ``"changed"``. Any other diff comes back unchanged.

    Example:
        >>> read_guard(KeyDiff("guard", "self.param_groups[0]['lr'] == 0.003", "failed", source="guard")).field
        "python scalar baked in 'self.param_groups[0]['lr']'"
    """
    if diff.aspect != "guard":
        return diff
    text = diff.before.strip()

    def now(source: str) -> str:
        value = failure.value_of(source) if failure is not None else None
        return "changed" if value is None else value

    m = _SIZE_GUARD.match(text)
    if m:
        name = pretty_source(m["tensor"])
        source = f"{m['tensor']}.size()[{m['dim']}]"
        return KeyDiff("shape", m["value"], now(source), arg_name=name, dims=(int(m["dim"]),), source="guard")
    m = _VALUE_GUARD.match(text)
    if m:
        return KeyDiff("scalar", m["value"], now(m["source"]), arg_name=pretty_source(m["source"]), source="guard")
    return diff


_LENGTH_GUARD = re.compile(r"^len\((?P<source>[^()]+)\) == (?P<value>\d+)$")


def length_guard(text: str) -> tuple[str, int] | None:
    """(the container, its length) of a guard on a Python container's length, which dynamo
    adds when a compiled function reads a list, tuple or dict it iterates or measures
    (``len(self.queue) == 7`` -> ``("self.queue", 7)``); None for any other guard."""
    m = _LENGTH_GUARD.match(text.strip())
    return (pretty_source(m["source"]), int(m["value"])) if m else None


def guard_subject(text: str) -> str:
    """What a failed guard tests, without the values it compares with: the guard
    failing at every step for a new value is one thing that changes, not one per value.

    Example:
        >>> guard_subject("___check_obj_id(L['m'], 140234)")
        "___check_obj_id(L['m'], ...)"
    """
    return _GUARD_NUMBER.sub("...", text.strip())


def storage_sizes(text: str) -> tuple[int, ...] | None:
    """The sizes of a view's storage as a layout diff renders them (``(1, 22)``), or None."""
    m = re.fullmatch(r"\((\d+(?:,\s*\d+)*),?\)", text.strip())
    return tuple(int(v) for v in m.group(1).split(",")) if m else None


def _constants(c: CompileEvent) -> tuple:
    """What a call site fixes in its key: static values, and each tensor's dtype and rank."""
    return tuple(
        (a.name, a.static) if a.shape is None else (a.name, a.dtype, len(a.shape)) for a in c.args
    )


def _site_bound(d: KeyDiff) -> bool:
    # what one call site holds fixed (a constant, how it reads a view), compared across two sites
    return d.source == "key" and d.aspect in ("static", "scalar", "layout")


def _layouts(c: CompileEvent) -> dict[tuple[str | None, str | None], str]:
    """How ``c`` reads its inputs, as far as its recorded layout diffs show (their ``now`` side)."""
    return {(d.arg_name, d.detail): d.now for d in c.diffs if d.aspect == "layout"}


def _layout_kind(detail: str | None, value: str) -> str:
    # a storage of any size, a view read the same way at any strides: the same kind of input
    if detail == "storage":
        return "sized" if storage_sizes(value) is not None else value
    return value.split(" ", 1)[0]


def _same_kind(c: CompileEvent, o: CompileEvent, layouts: dict[int, dict]) -> bool:
    """``o`` reads its inputs as ``c`` does, as far as is known: the key ``c`` was recorded
    against differs in its layout, and so does any whose own layout is of another kind."""
    mine = layouts.get(c.id, {})
    if mine and o.id == c.previous:
        return False
    theirs = layouts.get(o.id, {})
    return all(
        _layout_kind(k[1], theirs[k]) == _layout_kind(k[1], v) for k, v in mine.items() if k in theirs
    )


def _at_site(c: CompileEvent, here: Sequence[CompileEvent], layouts: dict[int, dict]) -> CompileEvent:
    """``c`` with its diffs read against the earlier keys of its own line (see :func:`by_call_site`)."""
    if not here:
        return dataclasses.replace(c, diffs=(), previous=None)  # the line's first program
    same = [o for o in here if _constants(o) == _constants(c) and _same_kind(c, o, layouts)]
    if not same:
        return c  # a constant or a way of reading an input that changed at this line
    best = min(reversed(same), key=lambda o: compare_args(o.args, c.args)[1])  # the latest on a tie
    found = arg_diffs(best.args, c.args)
    if found:
        return dataclasses.replace(c, diffs=tuple(found), previous=best.id)
    # the same avals at this line: a view of the same kind, read from a storage of another size
    # than the last time this line made one, is that size changing
    moved = []
    for (name, detail), now in layouts.get(c.id, {}).items():
        if detail != "storage" or storage_sizes(now) is None:
            continue
        earlier = (layouts[o.id][name, detail] for o in reversed(same) if (name, detail) in layouts.get(o.id, {}))
        before = next(earlier, None)
        if before is not None and before != now and len(storage_sizes(before)) == len(storage_sizes(now)):
            diff = next(
                d for d in c.diffs if d.aspect == "layout" and d.detail == "storage" and d.arg_name == name
            )
            moved.append(dataclasses.replace(diff, before=before))
    if moved:
        return dataclasses.replace(c, diffs=tuple(moved))
    layout = tuple(d for d in c.diffs if d.aspect == "layout")
    return dataclasses.replace(c, diffs=layout or c.diffs)


def by_call_site(compiles: Iterable[CompileEvent]) -> list[CompileEvent]:
    """The compiles, each eager recompile read against the keys compiled at its own line.

    The closest earlier key of an op may come from another line: the forward's
    ``pow(x, 2)`` and its backward's ``pow(x, 1.0)`` on a tensor of a new length
    are a shape change at two lines, yet the closest key of the second is the
    first (same shape), which reads as a Python number that changes. A recompile
    whose diffs name a constant or a view's layout is therefore compared again,
    with the earlier keys of its line that have the same constants (the same
    static values, dtypes and ranks): its diffs become the sizes that changed
    there. The first key of a line is a first compile of that line (no diffs).
    Other compiles (compiled graphs, lazy graphs, keys with no line) are kept.
    """
    sites: dict[tuple, list[CompileEvent]] = {}
    layouts: dict[int, dict] = {}
    out = []
    for c in compiles:
        here = sites.setdefault((c.mode, c.identity or c.name, _line(c)), [])
        layouts[c.id] = _layouts(c)
        if c.mode == "eager" and c.location is not None and any(_site_bound(d) for d in c.diffs):
            c = _at_site(c, here, layouts)
        here.append(c)
        out.append(c)
    return out


# ---------------------------------------------------------------------------------
# Prose at the edge
# ---------------------------------------------------------------------------------


def describe(diff: KeyDiff) -> str:
    """One difference as a line of prose."""
    if diff.aspect == "guard":
        return f"dynamo guard failed: {diff.before}"
    if diff.source == "guard" and diff.detail == "global state":
        return f"dynamo guard failed: global state ({diff.before}) changed"
    if diff.source == "guard" and diff.aspect == "scalar":
        passed = "another value" if diff.now == "changed" else diff.now
        return f"python scalar '{diff.arg_name}' was baked in as {diff.before}; this call passed {passed}"
    return diff.render()


def explain(
    identity: str,
    diffs: Sequence[KeyDiff],
    *,
    location: SourceLocation | None = None,
    compiles: int | None = None,
) -> str:
    """JAX-style prose for one recompile.

    Example:
        >>> diff = KeyDiff("shape", "f32[8]", "f32[9]", arg_index=0, arg_name="self", dims=(0,))
        >>> print(explain("mul.Tensor", [diff], compiles=2))
        mul.Tensor recompiled (compile 2 of it): the closest earlier key has 1 mismatch:
          arg 0 'self': f32[8] -> f32[9]
    """
    where = f" at {location}" if location is not None else ""
    nth = f" (compile {compiles} of it)" if compiles else ""
    n = len(diffs)
    head = f"{identity} recompiled{where}{nth}: the closest earlier key has {n} mismatch{'es' if n != 1 else ''}:"
    return "\n".join([head, *(f"  {describe(d)}" for d in diffs)])


# ---------------------------------------------------------------------------------
# After the run: groups, changing dimensions, storms, advice
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One thing that kept changing across a group's recompiles.

    ``what`` names it ("dim 1 of arg 0 'self'", "python scalar 'lr'"), ``kind``
    is the :class:`KeyDiff` aspect, ``count`` how many recompiles it took part in,
    ``values`` the distinct values it took, in first-seen order. ``arg_index``,
    ``arg_name``, ``dim`` and ``detail`` say which input, dimension or setting it
    is, as in :class:`KeyDiff`. ``location`` is the line where it changed most.
    An argument's changes are read among the compiles of one line: an eager op
    called from several lines (each linear layer of a model) sees different
    shapes there without any of them changing.
    """

    what: str
    kind: str
    count: int
    values: tuple[str, ...]
    arg_index: int | None = None
    arg_name: str | None = None
    dim: int | None = None
    detail: str | None = None
    location: SourceLocation | None = None

    @property
    def grows(self) -> bool:
        """A size that got larger at every compile (three or more): a sequence extended
        one step at a time, such as a KV cache or the generated tokens."""
        if self.kind != "shape" or self.detail == "rank" or len(self.values) < 3:
            return False
        try:
            sizes = [int(v) for v in self.values]
        except ValueError:
            return False
        return all(b > a for a, b in itertools.pairwise(sizes))


@dataclasses.dataclass(frozen=True, slots=True)
class RecompileGroup:
    """The compiles of one op or graph (one identity) in a run.

    Everything but ``read_backs`` is about what XLA compiled; ``read_backs`` counts the
    executables read back from the persistent compile cache instead, which are neither
    compiles nor recompiles.
    """

    identity: str
    mode: str | None
    compiles: int
    recompiles: int
    seconds: float
    changes: tuple[Change, ...]
    locations: tuple[tuple[SourceLocation | None, int], ...]
    last_diffs: tuple[KeyDiff, ...]  # of the latest recompile the top change took part in
    storm: bool
    advice: tuple[str, ...]
    read_backs: int = 0

    @property
    def changing(self) -> Change | None:
        """What changed most often (the storm's cause), if anything was recorded."""
        return self.changes[0] if self.changes else None


def _diff_changes(diff: KeyDiff) -> list[tuple[Change, str, str]]:
    """The changes one difference the arguments cannot show stands for, each with its
    before/now values: a dynamo guard's dimension or rank, a layout, a setting, a guard."""
    if diff.aspect == "shape" and diff.arg_index is None and diff.arg_name is not None:
        if diff.detail == "rank":
            what = f"rank of {diff.subject}"
            return [(Change(what, "shape", 0, (), None, diff.arg_name, None, "rank"), diff.before, diff.now)]
        return [
            (
                Change(f"dim {d} of {diff.subject}", "shape", 0, (), None, diff.arg_name, d),
                diff.before,
                diff.now,
            )
            for d in diff.dims
        ] or [(Change(diff.field, "shape", 0, (), None, diff.arg_name), diff.before, diff.now)]
    if diff.aspect == "inputs":
        return [(Change("the inputs", "inputs", 0, ()), diff.before, diff.now)]
    change = Change(diff.field, diff.aspect, 0, (), diff.arg_index, diff.arg_name, None, diff.detail)
    return [(change, diff.before, diff.now)]


def _advice(change: Change, mode: str | None, concatenated: bool = False) -> str:
    """What to do about ``change``; ``concatenated``: the run recompiled a ``torch.cat`` too, the
    mark of a sequence extended one step at a time (generated tokens, a KV cache), which is
    only then named."""
    what = change.what
    if change.kind == "shape" and change.detail == "rank":
        return (
            f"{what} changes at this line (it took {len(change.values)} values): each rank is a "
            "program of its own; keep the input's rank fixed"
        )
    if change.grows and concatenated:
        return (
            f"{what} grows at every call ({change.values[0]} -> {change.values[-1]}): a sequence "
            "extended one step at a time (a KV cache, the generated tokens) compiles once per "
            "length; allocate it at its final length once (for a KV cache: a static cache) or grow it in buckets"
        )
    if change.grows:
        return (
            f"{what} grows at every call ({change.values[0]} -> {change.values[-1]}), and each size is a "
            "program of its own: give it one size at every call (make it at its final size once), or round "
            "it up to a few fixed sizes"
            + ("; torch._dynamo.mark_dynamic(t, dim) stops dynamo from retracing, but XLA still compiles one "
               "program per distinct size" if mode == "compiled" else "")
        )
    if change.kind == "shape":
        text = (
            f"pad or bucket {what} (it took {len(change.values)} values): round it up to a multiple "
            "of 64 or to one of a few fixed sizes, so a handful of programs serve every step"
        )
        if mode == "compiled":
            text += (
                "; torch._dynamo.mark_dynamic(t, dim) stops dynamo from retracing, but XLA still "
                "compiles one program per distinct size"
            )
        return text
    if change.kind == "scalar" and "param_groups" in (change.arg_name or "") and "'lr'" in (change.arg_name or ""):
        return (
            f"the optimizer's learning rate ({change.arg_name}) is a Python float that changes (an LR scheduler) "
            "and dynamo guards on its value: create the optimizer with lr=torch.tensor(lr) (and capturable=True "
            "for Adam, AdamW and the others that have it), so the scheduler updates the tensor in place"
        )
    if change.kind == "scalar":
        return (
            f"hoist the {what} into a tensor on the device (torch.tensor(v, device='tpu')): as a "
            "Python number it is baked into the program, and every new value compiles again"
        )
    if change.kind == "static":
        return f"{what} is compiled into the program; keep it fixed across steps, each value is a new program"
    if change.kind == "dtype":
        return f"{what} alternates dtypes ({', '.join(change.values[:4])}); cast once, before the loop"
    if change.kind == "layout":
        return _layout_advice(change)
    if change.kind == "precision":
        return "the float32 matmul precision changes between calls; set it once at start-up"
    if change.kind == "grad":
        return (
            "the function runs under grad and no-grad (or with inputs that do and do not require "
            "grad): one program per mode is expected, more means the mode toggles per step"
        )
    if change.kind == "inputs":
        return "the number or kind of inputs changes between calls (a graph break, or dynamic shapes); see the diffs"
    if change.kind == "graph" and change.detail == "outputs":
        return (
            "the lazy graph returns other values than before: every tensor still referenced when it runs "
            "is an output of its program (a loss appended to a list, a tensor kept for logging); keep "
            "the same tensors alive each step, e.g. store loss.item() after the step instead of the tensor"
        )
    if change.kind == "graph":
        return (
            "the ops recorded for the lazy graph differ between steps (Python control flow on values or "
            "shapes): each variant is a program of its own; record the same ops every step, or cut the "
            "graph with torch.tpu.synchronize() around the part that varies"
        )
    return f"{what} keeps changing: {', '.join(change.values[:4])}"


def _layout_advice(change: Change) -> str:
    """What to do about a layout that kept changing. A view's storage offset is an operand
    of the program that reads it (``x[i]`` for every ``i`` runs one program), so only
    how a view is read and the size of what it views can be the cause."""
    what = change.what
    subject = KeyDiff(change.kind, "", "", arg_index=change.arg_index, arg_name=change.arg_name).subject or what
    if change.detail == "view":
        return (
            f"{subject} is a view read in different ways ({', '.join(change.values[:3])}): each way (a "
            "contiguous slice, a permuted block, a gather with its own strides) is its own program; take the "
            "view the same way each step, or make it .contiguous() before the op (where the view starts "
            "does not matter)"
        )
    if change.detail == "storage":
        # the latest sizes (a prefill's or a first call's view may come before them)
        tail = [s for s in map(storage_sizes, change.values) if s is not None][-5:]
        if len(tail) >= 3 and all(
            len(a) == len(b) and a != b and all(x <= y for x, y in zip(a, b)) for a, b in itertools.pairwise(tail)
        ):
            return (
                f"{subject} is a view of a tensor that grows at every call ({tail[0]} .. {tail[-1]}): each "
                "length of it is a program of its own; allocate it once at its final length and slice from "
                "it, or grow it in buckets"
            )
        # a copy (.contiguous()) would only move the recompile to the copy, which reads the same view
        return (
            f"{subject} is a view of tensors of different sizes: the storage it is read from is part of the "
            "program; slice it from one fixed-size buffer"
        )
    if change.detail == "device":
        return f"{subject} is a CPU scalar tensor on some calls and a tpu tensor on others; keep it on one device"
    return f"{what} keeps changing ({', '.join(change.values[:3])}); make the input contiguous (.contiguous()) before the call"


def _line(c: CompileEvent) -> tuple[str, int] | None:
    return (c.location.file, c.location.line) if c.location is not None else None


def _arg_changes(items: Sequence[CompileEvent], scalars: set[str]) -> list[Change]:
    """What varied across a group's keys, line by line (see :class:`Change`): the same
    dimension changing at two lines is two changes, each with its own values."""
    sites: dict[tuple[str, int] | None, list[CompileEvent]] = {}
    for c in items:
        sites.setdefault(_line(c), []).append(c)
    return [
        dataclasses.replace(change, location=site_items[0].location)
        for site_items in sites.values()
        for change in _site_arg_changes(site_items, scalars)
    ]


def _tally_count(change: Change, recompiles: int, values: dict) -> int:
    """How many recompiles a change from the diffs accounts for. A layout that took two
    values (a key's contiguous input against a value's transposed view, both at one line)
    shows in the diff of every recompile that compared the two, yet explains one program:
    like a dimension, it counts as its values less one."""
    if change.kind == "layout":
        return min(recompiles, max(1, len(values) - 1))
    return recompiles


def _site_recompiles(items: Sequence[CompileEvent]) -> int:
    """The most recompiles of a group at one line."""
    per_line = collections.Counter(_line(c) for c in items if c.diffs)
    return max(per_line.values(), default=0)


def _site_arg_changes(items: Sequence[CompileEvent], scalars: set[str]) -> list[Change]:
    """What varied across keys compiled at one line, read from the compiled arguments
    themselves: every dimension, dtype and static value that took more than one value."""
    labels: dict[str, tuple[str, int, str]] = {}  # key -> (label, position, name)
    dims: dict[tuple[str, int], dict[str, None]] = {}
    ranks: dict[str, dict[str, None]] = {}
    dtypes: dict[str, dict[str, None]] = {}
    statics: dict[str, dict[str, None]] = {}
    for c in items:
        for i, a in enumerate(c.args):
            # names line up across keys; positions only among keys with as many inputs
            key = a.name if a.name != f"arg{i}" else f"{len(c.args)}:{a.name}"
            labels.setdefault(key, (_arg_label(i, a.name), i, a.name))
            if a.shape is None:
                statics.setdefault(key, {}).setdefault(str(a.static), None)
                continue
            ranks.setdefault(key, {}).setdefault(str(len(a.shape)), None)
            dtypes.setdefault(key, {}).setdefault(short_dtype(a.dtype), None)
            for d, n in enumerate(a.shape):
                dims.setdefault((key, d), {}).setdefault(str(n), None)
    out = []
    shape_values = set()
    for (key, d), values in dims.items():
        if len(values) > 1 and len(ranks[key]) == 1:
            label, i, name = labels[key]
            out.append(Change(f"dim {d} of {label}", "shape", len(values) - 1, tuple(values), i, name, d))
            shape_values.add(frozenset(values))
    for key, values in ranks.items():
        if len(values) > 1:
            label, i, name = labels[key]
            out.append(
                Change(f"rank of {label}", "shape", len(values) - 1, tuple(values), i, name, None, "rank")
            )
    for key, values in dtypes.items():
        if len(values) > 1:
            label, i, name = labels[key]
            out.append(Change(f"dtype of {label}", "dtype", len(values) - 1, tuple(values), i, name))
    for key, values in statics.items():
        if len(values) < 2 or any(len(set(values) & dim) >= max(2, len(values) - 1) for dim in shape_values):
            continue  # constant, or a symbolic size passed beside its tensor (the dim says it)
        _label, i, name = labels[key]
        if key in scalars:
            out.append(Change(f"python scalar '{key}'", "scalar", len(values) - 1, tuple(values), i, name))
        else:
            out.append(Change(f"static arg '{key}'", "static", len(values) - 1, tuple(values), i, name))
    return out


def _from_args(diff: KeyDiff) -> bool:
    """The compiled arguments themselves show this difference (``_arg_changes`` counts it); a
    value a dynamo guard tests is not among them."""
    return diff.source == "key" and diff.aspect in ("static", "scalar") or (
        diff.aspect in ("shape", "dtype") and diff.arg_index is not None
    )


def _same_input(change: Change, diff: KeyDiff) -> bool:
    if change.arg_name is not None and change.arg_name != f"arg{change.arg_index}":
        return diff.arg_name == change.arg_name  # a name identifies it across keys and guards
    return change.arg_index is not None and diff.arg_index == change.arg_index


def _shows(change: Change, diff: KeyDiff) -> bool:
    """``diff`` is an instance of ``change`` (the dimension itself changed, for a shape)."""
    if change.kind == "shape" and change.dim is not None:
        return diff.aspect == "shape" and _same_input(change, diff) and change.dim in diff.dims
    if change.arg_name is not None or change.arg_index is not None:
        return _same_input(change, diff)
    return diff.aspect == change.kind and diff.detail == change.detail


def summarize(
    compiles: Iterable[CompileEvent], *, storm_threshold: int = DEFAULT_STORM_THRESHOLD, read_backs_apart: bool = True
) -> list[RecompileGroup]:
    """Group a run's compiles by identity; most recompiled first.

    ``read_backs_apart=False`` counts executables read back from the persistent compile cache
    among the group's programs: what the programs are (the shapes they took), not what XLA
    compiled in this run, which is what the advisor judges a program by.

    A group recompiled more than ``storm_threshold`` times at one line is a storm (an
    eager op meets one shape per layer of a model, once each: that is no storm). Its
    ``changes`` name what kept changing, most values first: every dimension,
    dtype or static argument that took several values across the group's
    keys, then what only the diffs know (dynamo guards, grad mode,
    precision, view layout). ``advice`` says what to do about the top one.
    """
    groups: dict[tuple[str | None, str], list[CompileEvent]] = {}
    read_backs: collections.Counter[tuple[str | None, str]] = collections.Counter()
    for c in compiles:
        groups.setdefault((c.mode, c.identity or c.name), [])
        if c.from_cache and read_backs_apart:  # XLA compiled nothing: counted apart, never a compile or a recompile
            read_backs[(c.mode, c.identity or c.name)] += 1
        else:
            groups[(c.mode, c.identity or c.name)].append(c)
    # a torch.cat recompiled for new sizes: something in the run is extended by concatenation
    concatenated = any((c.identity or c.name).split(".")[0] in ("cat", "concat", "concatenate") and c.diffs
                       for c in compiles)
    out = []
    for (mode, identity), items in groups.items():
        re_items = [c for c in items if c.diffs]
        scalars = {d.arg_name for c in re_items for d in c.diffs if d.aspect == "scalar" and d.arg_name}
        changes_list = _arg_changes(items, scalars) if re_items else []
        tally: dict[str, list] = {}  # what -> [change, recompiles, values, lines]
        for c in re_items:  # what the keys' arguments cannot show
            seen_here = set()
            for d in map(read_guard, c.diffs):
                if _from_args(d) or (d.aspect == "inputs" and changes_list):
                    continue
                for change, before, now in _diff_changes(d):
                    slot = tally.setdefault(change.what, [change, 0, {}, collections.Counter()])
                    if change.what not in seen_here:
                        slot[1] += 1
                        slot[3][c.location] += 1
                        seen_here.add(change.what)
                    # a failed guard knows the value it was compiled for; the one that failed it
                    # only when it was read from the call
                    unread = d.source == "guard" and d.aspect == "scalar" and now == "changed"
                    for v in (before,) if unread else (before, now):
                        slot[2].setdefault(v, None)
        changes_list += [
            dataclasses.replace(
                change,
                count=_tally_count(change, n, vals),
                values=tuple(vals),
                location=lines.most_common(1)[0][0],
            )
            for change, n, vals, lines in tally.values()
        ]
        changes = tuple(sorted(changes_list, key=lambda ch: (-ch.count, ch.kind != "shape", ch.what)))
        where = collections.Counter(c.location for c in re_items)
        storm = _site_recompiles(items) > storm_threshold
        advice: tuple[str, ...] = ()
        example: tuple[KeyDiff, ...] = re_items[-1].diffs if re_items else ()
        if changes:
            top = changes[0]
            advice = (_advice(top, mode, concatenated),)
            second = next(
                (ch for ch in changes[1:] if ch.kind not in (top.kind, "inputs", "config", "key")), None
            )
            if second is not None and 2 * second.count >= top.count:
                advice += (_advice(second, mode, concatenated),)
            # the latest recompile the top change shows in, at its line if one there does
            shown = [c for c in re_items if any(_shows(top, d) for d in c.diffs)]
            there = [c for c in shown if top.location is None or c.location == top.location]
            if there or shown:
                example = (there or shown)[-1].diffs
        out.append(
            RecompileGroup(
                identity,
                mode,
                len(items),
                len(re_items),
                sum(c.seconds for c in items),
                changes,
                tuple(where.most_common(3)),
                example,
                storm,
                advice,
                read_backs[(mode, identity)],
            )
        )
    out.sort(key=lambda g: (-g.recompiles, -g.compiles, -g.read_backs, g.identity))
    return out
