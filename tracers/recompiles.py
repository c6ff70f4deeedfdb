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
import difflib
import itertools
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_location
from tpu_debug.tracers import dynamo_events
from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation
from tpu_debug.tracers.lazy_graphs import cut_site, trigger_text

__all__ = [
    "DEFAULT_STORM_THRESHOLD",
    "Change",
    "Observation",
    "RecompileGroup",
    "RecompileTracker",
    "arg_diffs",
    "aval",
    "by_call_site",
    "describe",
    "explain",
    "guard_subject",
    "length_guard",
    "read_guard",
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


# ---------------------------------------------------------------------------------
# Live analysis (the recorder and the guards call this at compile time)
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Seen:
    key: Any
    args: tuple
    facts: dict[tuple[str, str], str]
    compile_id: str | None
    event_id: int | None = None
    graph: Any = None  # a lazy graph's GraphInfo (its ops and outputs)


@dataclasses.dataclass(slots=True)
class Observation:
    """What :meth:`RecompileTracker.observe` concluded about one compile.

    ``previous_event`` is the run-store id of the closest earlier compile
    (None when it happened before the trace, or for a first compile).
    ``args`` are the compile's arguments, a compiled graph's named after
    dynamo's sources (``x``, ``x.size()[0]``, ``m.weight``) when known.
    ``bind(event_id)`` tells the tracker which event this compile became.
    """

    identity: str
    recompile: bool
    diffs: tuple[KeyDiff, ...]
    previous_event: int | None
    compiles: int
    _entry: _Seen

    @property
    def args(self) -> tuple:
        return self._entry.args

    def bind(self, event_id: int) -> None:
        self._entry.event_id = event_id


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
    return _arg_diffs(before, now)[0]


def _arg_diffs(before: Sequence[Any], now: Sequence[Any]) -> tuple[list[KeyDiff], float]:
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
                    before_text, now_text = _layout_text(k, la.get(k)), _layout_text(k, lb.get(k))
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


def _at(locations: Sequence[Any], i: int) -> str:
    loc = locations[i] if 0 <= i < len(locations) else None
    return f" at {format_location(loc.file, loc.line)}" if loc is not None else ""


def _op_list(names: Sequence[str]) -> str:
    if not names:
        return "-"
    return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def _step_of(value: str) -> int | None:
    """The op index of a lazy graph value's name (``n12``, ``n12.1``), or None (an input)."""
    if not value.startswith("n"):
        return None
    head = value[1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _graph_diffs(
    before_args: Sequence[Any], before: Any, now_args: Sequence[Any], now: Any, locations: Sequence[Any] = ()
) -> tuple[list[KeyDiff], int]:
    """How a lazy graph's key differs from an earlier one's, and how far apart they are.

    The ops first: where their sequence first differs (an op inserted, removed or
    replaced: Python control flow that changed what a step records), with the op's
    line. With the same ops: the graph inputs whose shape or dtype changed (a new
    batch size), then the first op whose static arguments or baked-in scalars
    changed, then the values the graph returns (a tensor kept alive that was not
    before, e.g. a loss appended to a list each step, is one more program output).
    """
    b_ops, n_ops = tuple(before.ops), tuple(now.ops)
    b_names, n_names = [o.name for o in b_ops], [o.name for o in n_ops]
    if b_names != n_names:
        matcher = difflib.SequenceMatcher(a=b_names, b=n_names, autojunk=False)
        changes = [c for c in matcher.get_opcodes() if c[0] != "equal"]
        _tag, i1, i2, j1, j2 = changes[0]
        out = [KeyDiff("graph", _op_list(b_names[i1:i2]), _op_list(n_names[j1:j2]),
                       detail=f"op {j1}{_at(locations, j1)}")]
        if len(b_ops) != len(n_ops):
            out.append(KeyDiff("graph", f"{len(b_ops)} ops", f"{len(n_ops)} ops", detail="ops"))
        return out, 100 + sum(max(i2 - i1, j2 - j1) for _t, i1, i2, j1, j2 in changes)
    out, score = _arg_diffs(before_args, now_args)  # the graph's inputs
    shape_only = None
    for i, (a, b) in enumerate(zip(b_ops, n_ops)):
        if a.args == b.args and a.inputs == b.inputs:
            continue
        found, _s = _arg_diffs(a.args, b.args) if len(a.args) == len(b.args) else ([], 0)
        label = f"op {i} {a.name}{_at(locations, i)}"
        found = [dataclasses.replace(d, arg_index=None, arg_name=f"{label}: {d.arg_name}") for d in found]
        if a.inputs != b.inputs:
            found.append(KeyDiff("graph", ", ".join(a.inputs), ", ".join(b.inputs), detail=f"{label} inputs"))
        decisive = [d for d in found if d.aspect != "shape"]
        if decisive:
            out.extend(decisive)
            score += len(decisive)
            break
        if shape_only is None and found:
            shape_only = found
    else:
        if not out and shape_only:  # shapes changed with no input or setting to explain them
            out.extend(shape_only)
            score += len(shape_only)
    b_out, n_out = tuple(before.outputs), tuple(now.outputs)
    if b_out != n_out:
        added = [v for v in n_out if v not in b_out]
        extra = []
        for v in added[:2]:
            step = _step_of(v)
            if step is not None and step < len(n_ops):
                extra.append(f"{v} {n_ops[step].name}{_at(locations, step)}")
        more = f" (new: {'; '.join(extra)})" if extra else ""
        out.append(KeyDiff("graph", f"{len(b_out)} values", f"{len(n_out)} values{more}", detail="outputs"))
        score += 1
    return out, score


_SOURCE_ROOT = re.compile(r"^[LG]\['([^']+)'\]")
_SOURCE_MODULE = re.compile(r"\._(?:parameters|buffers|modules)\['([^']+)'\]")


def _pretty_source(source: str) -> str:
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
        name = _pretty_source(m["tensor"])
        source = f"{m['tensor']}.size()[{m['dim']}]"
        return KeyDiff("shape", m["value"], now(source), arg_name=name, dims=(int(m["dim"]),), source="guard")
    m = _VALUE_GUARD.match(text)
    if m:
        return KeyDiff("scalar", m["value"], now(m["source"]), arg_name=_pretty_source(m["source"]), source="guard")
    return diff


_LENGTH_GUARD = re.compile(r"^len\((?P<source>[^()]+)\) == (?P<value>\d+)$")


def length_guard(text: str) -> tuple[str, int] | None:
    """(the container, its length) of a guard on a Python container's length, which dynamo
    adds when a compiled function reads a list, tuple or dict it iterates or measures
    (``len(self.queue) == 7`` -> ``("self.queue", 7)``); None for any other guard."""
    m = _LENGTH_GUARD.match(text.strip())
    return (_pretty_source(m["source"]), int(m["value"])) if m else None


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
    best = min(reversed(same), key=lambda o: _arg_diffs(o.args, c.args)[1])  # the latest on a tie
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


def _named_args(info: Any) -> tuple:
    """A forward graph's arguments named after dynamo's sources for them, when they line up."""
    args = tuple(info.args)
    graph = info.graph
    names = graph.origin.inputs if graph is not None else ()
    if info.mode != "compiled" or graph.kind == "backward" or not names or len(names) != len(args):
        return args
    return tuple(dataclasses.replace(a, name=_pretty_source(str(n))) for a, n in zip(args, names))


def _layout_text(key: str, value: Any) -> str:
    if value is None:
        return "tpu" if key == "device" else "contiguous"
    return repr(value) if isinstance(value, tuple) else str(value)


def _facts(info: Any) -> dict[tuple[str, str], str]:
    """What the key holds beyond the arguments, per (aspect, detail) of a :class:`KeyDiff`."""
    facts = {
        ("precision" if str(k) == "matmul precision" else "config", str(k)): str(v)
        for k, v in info.settings
    }
    graph = info.graph
    if info.mode == "compiled" and graph is not None:
        facts[("grad", "grad mode")] = "enabled" if graph.origin.grad_mode else "disabled"
        if graph.kind in ("forward", "inference"):
            facts[("grad", "graph kind")] = graph.kind
    return facts


def _lazy_identity(info: Any) -> tuple[Any, str]:
    """A lazy graph is known by where it is cut: the trigger and the user's line (read off
    the stack: compiles of lazy graphs are observed while the graph materializes)."""
    trigger = str(info.name).removeprefix("lazy/")
    if info.replayed:  # compiled before the trace: the stack is not the cut's
        return ("lazy", trigger, None), f"graph cut by {trigger_text(trigger)}"
    cause, loc = cut_site(trigger)
    where = f" at {format_location(loc.file, loc.line)}" if loc is not None else ""
    return ("lazy", cause, loc), f"graph cut by {trigger_text(cause)}{where}"


def _identity(info: Any) -> tuple[Any, str]:
    if info.mode == "lazy":
        return _lazy_identity(info)
    if info.mode != "compiled":
        return ("eager", str(info.name)), str(info.name)
    graph = info.graph
    if graph is None:
        return ("graph", str(info.name)), str(info.name)
    direction = "backward" if graph.kind == "backward" else "forward"
    frame = graph.origin.frame
    code = graph.origin.function
    if code is not None:  # (file, first line, name) of the function dynamo compiled
        file, line, name = code
        label = f"{dynamo_events.pretty_function(name)} in {os.path.basename(file)} ({direction})"
        return ("code", file, line, name, direction), label
    if frame is None:
        return ("graph", str(info.name)), str(info.name)
    # keyed by dynamo's frame id (one per code object), so graphs compiled before
    # anyone listened to dynamo still match; the label names the function when known
    fn = dynamo_events.frame_function(frame)
    if fn is None:
        return ("frame", frame, direction), f"frame {frame} ({direction})"
    name, file = fn
    return ("frame", frame, direction), f"{name} in {os.path.basename(file)} ({direction})"


class RecompileTracker:
    """Remembers every key compiled per identity and explains each new one.

    Example::

        tracker = RecompileTracker()
        seen = tracker.observe(info)      # a CompileInfo from the runtime
        seen.recompile, [d.render() for d in seen.diffs]
        # (True, ["arg 0 'self': f32[8,128] -> f32[9,128]"])
    """

    def __init__(self) -> None:
        self._seen: dict[Any, list[_Seen]] = {}
        self._labels: dict[Any, str] = {}

    def observe(self, info: Any, *, op_locations: Sequence[SourceLocation | None] = ()) -> Observation:
        """Record compile ``info`` (a replayed one only becomes history) and say what it is.

        ``op_locations``: for a lazy graph, the user's line of each of its ops (the
        recorder's, from ``on_defer``), so a diff can say where the op that changed is.
        """
        ident, label = _identity(info)
        known = self._labels.get(ident)
        if known is None or (known.startswith("frame ") and not label.startswith("frame ")):
            self._labels[ident] = label
        label = self._labels[ident]
        facts = _facts(info)
        compile_id = info.graph.origin.compile_id if info.graph is not None else None
        entry = _Seen(info.key, _named_args(info), facts, compile_id)
        if info.mode == "lazy" and info.graph is not None:
            entry.graph = info.graph
        history = self._seen.setdefault(ident, [])
        diffs: tuple[KeyDiff, ...] = ()
        previous: _Seen | None = None
        if history and not info.replayed:
            previous, found = self._closest(entry, history, op_locations)
            diffs = tuple(self._with_dynamo(found, previous, entry, info))
        history.append(entry)
        return Observation(
            label,
            previous is not None,
            diffs,
            previous.event_id if previous is not None else None,
            len(history),
            entry,
        )

    def compiles(self, identity: str) -> int:
        """How many keys of ``identity`` (its label) were seen."""
        return sum(len(h) for k, h in self._seen.items() if self._labels.get(k) == identity)

    @staticmethod
    def _closest(entry: _Seen, history: list[_Seen], op_locations: Sequence[Any] = ()) -> tuple[_Seen, list[KeyDiff]]:
        best: tuple[_Seen, list[KeyDiff]] | None = None
        best_score = 0
        for old in reversed(history):  # the latest wins a tie
            if entry.graph is not None and old.graph is not None:
                diffs, score = _graph_diffs(old.args, old.graph, entry.args, entry.graph, op_locations)
            else:
                diffs, score = _arg_diffs(old.args, entry.args)
            for aspect, detail in sorted(set(old.facts) | set(entry.facts), key=lambda k: k[1]):
                before, now = old.facts.get((aspect, detail), "-"), entry.facts.get((aspect, detail), "-")
                if before != now:
                    diffs.append(KeyDiff(aspect, before, now, detail=detail))
                    score += 1
            if best is None or score < best_score:
                best, best_score = (old, diffs), score
                if not diffs:
                    break
        assert best is not None
        return best

    @staticmethod
    def _with_dynamo(diffs: list[KeyDiff], previous: _Seen, entry: _Seen, info: Any) -> list[KeyDiff]:
        out: list[KeyDiff] = []
        if (
            info.mode == "compiled"
            and entry.compile_id is not None
            and entry.compile_id != previous.compile_id
        ):
            failure = dynamo_events.guard_failure(entry.compile_id)
            guard = failure.for_entry(previous.compile_id) if failure is not None else None
            if guard:
                for d in dynamo_events.guard_diffs(guard, failure):
                    if d.detail == "global state" and any(
                        x.aspect == "grad" and x.detail in ("grad mode", "graph kind") for x in diffs
                    ):
                        continue  # the graph's own facts say it better
                    out.append(read_guard(d, failure))
        out.extend(diffs)
        if not out:
            if previous.key == entry.key:
                out.append(
                    KeyDiff("key", "compiled before", "compiled again (the executable cache was cleared)")
                )
            elif info.mode == "compiled":
                before = previous.key[1] if isinstance(previous.key, tuple) and len(previous.key) > 1 else "?"
                now = entry.key[1] if isinstance(entry.key, tuple) and len(entry.key) > 1 else "?"
                out.append(KeyDiff("key", str(before), str(now), detail="graph code"))
            else:
                out.append(KeyDiff("key", "an earlier key", "a key differing in an unrecorded field"))
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


def _advice(change: Change, mode: str | None) -> str:
    what = change.what
    if change.kind == "shape" and change.detail == "rank":
        return (
            f"{what} changes at this line (it took {len(change.values)} values): each rank is a "
            "program of its own; keep the input's rank fixed"
        )
    if change.grows:
        return (
            f"{what} grows at every call ({change.values[0]} -> {change.values[-1]}): a sequence "
            "extended one step at a time (a KV cache, the generated tokens) compiles once per "
            "length; allocate it at its final length once (for a KV cache: a static cache) or grow it in buckets"
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
                f"{subject} is a view of a tensor that grows at every call ({tail[0]} .. {tail[-1]}): a "
                "sequence extended one step at a time (generated token ids, a dynamic KV "
                "cache) compiles once per length; allocate it once at its final length, or grow it in buckets"
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
            advice = (_advice(top, mode),)
            second = next(
                (ch for ch in changes[1:] if ch.kind not in (top.kind, "inputs", "config", "key")), None
            )
            if second is not None and 2 * second.count >= top.count:
                advice += (_advice(second, mode),)
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
