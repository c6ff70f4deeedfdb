"""Recompiles: is a compile the first of its op or graph, or a recompile, and what changed (issue 5).

Every compile has an *identity*: the eager op overload (``mul.Tensor``), or
for a compiled graph the function dynamo compiled and the graph's direction
(``"step in train.py (forward)"``; forward and inference graphs share one). A
compile whose identity was compiled before is a recompile. It is compared with
the closest earlier key of that identity (fewest mismatches; the latest on a
tie) and the differences are kept as data, :class:`~.events.KeyDiff` records:

============================  ===============================================
field                         what changed
============================  ===============================================
``arg 1 'other'``             an input's aval: ``f32[8,128]`` -> ``f32[9,128]``
``arg 1 'other' dtype``       only its dtype: ``f32`` -> ``bf16``
``arg 0 'self' stride``       a strided view's geometry (also ``offset``,
                              ``storage``, ``device``)
``static arg 'dim'``          a static argument baked into the executable
``python scalar baked in 'n'``  a Python number baked in (eager static
                              ``Scalar`` arguments; dynamo value guards)
``inputs``                    the number of inputs (both signatures shown)
``matmul precision``          ``torch.get_float32_matmul_precision()``
``grad mode``, ``graph kind``  compiled under grad / no-grad
``tensor 'x' dim 0``          a dynamo guard on an input's size (also
                              ``dtype``, ``rank``, ``stride``,
                              ``requires_grad``, ``device``)
``dynamo guard``              any other failed dynamo guard (its text)
============================  ===============================================

Prose is rendered from these at the edge (:func:`explain`,
:func:`summarize`), in the spirit of JAX's "closest seen signature has N
mismatches".
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.tracers import dynamo_events
from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation

__all__ = [
    "DEFAULT_STORM_THRESHOLD",
    "Change",
    "Observation",
    "RecompileGroup",
    "RecompileTracker",
    "aval",
    "describe",
    "diff_kind",
    "explain",
    "parse_aval",
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


_AVAL = re.compile(r"^([A-Za-z0-9_]+)\[([0-9,]*)\]$")


def parse_aval(text: str) -> tuple[str, tuple[int, ...]] | None:
    """``"f32[8,128]"`` -> ``("f32", (8, 128))``; None for anything else."""
    m = _AVAL.match(text)
    if m is None:
        return None
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return m.group(1), dims


# ---------------------------------------------------------------------------------
# Live analysis (the recorder and the guards call this at compile time)
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Seen:
    key: Any
    args: tuple
    facts: dict[str, str]
    compile_id: str | None
    event_id: int | None = None


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
    return f"arg {i}" if name == f"arg{i}" else f"arg {i} '{name}'"


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


def _arg_diffs(before: Sequence[Any], now: Sequence[Any]) -> list[KeyDiff]:
    if len(before) != len(now):
        return [KeyDiff("inputs", _render_args(before), _render_args(now))]
    out: list[KeyDiff] = []
    for i, (a, b) in enumerate(zip(before, now)):
        label = _arg_label(i, b.name)
        if a.shape is not None and b.shape is not None:
            if tuple(a.shape) != tuple(b.shape):
                out.append(KeyDiff(label, aval(a.shape, a.dtype), aval(b.shape, b.dtype)))
                continue  # a view's strides and storage follow its shape: not news
            if a.dtype != b.dtype:
                out.append(KeyDiff(f"{label} dtype", short_dtype(a.dtype), short_dtype(b.dtype)))
            la, lb = dict(getattr(a, "layout", ()) or ()), dict(getattr(b, "layout", ()) or ())
            for k in sorted(set(la) | set(lb), key=str):
                if la.get(k) != lb.get(k):
                    out.append(
                        KeyDiff(f"{label} {k}", _layout_text(k, la.get(k)), _layout_text(k, lb.get(k)))
                    )
        elif a.shape is None and b.shape is None:
            if not _same_static(a.static, b.static):
                scalar = getattr(a, "scalar", False) or getattr(b, "scalar", False)
                field = f"python scalar baked in '{b.name}'" if scalar else f"static arg '{b.name}'"
                out.append(KeyDiff(field, _static_text(a.static), _static_text(b.static)))
        else:
            text = lambda s: aval(s.shape, s.dtype) if s.shape is not None else _static_text(s.static)
            out.append(KeyDiff(label, text(a), text(b)))
    return out


def _score(before: Sequence[Any], now: Sequence[Any], diffs: list[KeyDiff]) -> int:
    """Mismatches for choosing the closest key, counting an aval's differing dims one by one;
    a different input count is as far as it gets."""
    if len(before) != len(now):
        return 1000 + max(len(before), len(now))
    score = 0
    for d in diffs:
        a, b = parse_aval(d.before), parse_aval(d.now)
        if a and b and len(a[1]) == len(b[1]):
            score += sum(x != y for x, y in zip(a[1], b[1])) + (a[0] != b[0])
        else:
            score += 1 if not (a and b) else 1 + max(len(a[1]), len(b[1]))
    return score


_SOURCE_ROOT = re.compile(r"^[LG]\['([^']+)'\]")
_SOURCE_MODULE = re.compile(r"\._(?:parameters|buffers|modules)\['([^']+)'\]")


def _pretty_source(source: str) -> str:
    """``G['m']._parameters['weight']`` -> ``m.weight``; ``L['x'].size()[0]`` -> ``x.size()[0]``."""
    return _SOURCE_MODULE.sub(r".\1", _SOURCE_ROOT.sub(r"\1", source))


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


def _facts(info: Any) -> dict[str, str]:
    facts = {str(k): str(v) for k, v in info.settings}
    graph = info.graph
    if info.mode == "compiled" and graph is not None:
        facts["grad mode"] = "enabled" if graph.origin.grad_mode else "disabled"
        if graph.kind in ("forward", "inference"):
            facts["graph kind"] = graph.kind
    return facts


def _identity(info: Any) -> tuple[Any, str]:
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

    Example:
        >>> tracker = RecompileTracker()
        >>> seen = tracker.observe(info)      # a CompileInfo from the runtime
        >>> seen.recompile, [d.render() for d in seen.diffs]
        (True, ["arg 0 'self': f32[8,128] -> f32[9,128]"])
    """

    def __init__(self) -> None:
        self._seen: dict[Any, list[_Seen]] = {}
        self._labels: dict[Any, str] = {}

    def observe(self, info: Any) -> Observation:
        """Record compile ``info`` (a replayed one only becomes history) and say what it is."""
        ident, label = _identity(info)
        known = self._labels.get(ident)
        if known is None or (known.startswith("frame ") and not label.startswith("frame ")):
            self._labels[ident] = label
        label = self._labels[ident]
        facts = _facts(info)
        compile_id = info.graph.origin.compile_id if info.graph is not None else None
        entry = _Seen(info.key, _named_args(info), facts, compile_id)
        history = self._seen.setdefault(ident, [])
        diffs: tuple[KeyDiff, ...] = ()
        previous: _Seen | None = None
        if history and not info.replayed:
            previous, found = self._closest(entry, history)
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
    def _closest(entry: _Seen, history: list[_Seen]) -> tuple[_Seen, list[KeyDiff]]:
        best: tuple[_Seen, list[KeyDiff]] | None = None
        best_score = 0
        for old in reversed(history):  # the latest wins a tie
            diffs = _arg_diffs(old.args, entry.args)
            for k in sorted(set(old.facts) | set(entry.facts)):
                if old.facts.get(k) != entry.facts.get(k):
                    diffs.append(KeyDiff(k, old.facts.get(k, "-"), entry.facts.get(k, "-")))
            score = _score(old.args, entry.args, diffs)
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
                for d in dynamo_events.guard_diffs(guard):
                    if d.field == "global state" and any(
                        x.field in ("grad mode", "graph kind") for x in diffs
                    ):
                        continue  # the graph's own facts say it better
                    out.append(d)
        out.extend(diffs)
        if not out:
            if previous.key == entry.key:
                out.append(
                    KeyDiff("key", "compiled before", "compiled again (the executable cache was cleared)")
                )
            elif info.mode == "compiled":
                before = previous.key[1] if isinstance(previous.key, tuple) and len(previous.key) > 1 else "?"
                now = entry.key[1] if isinstance(entry.key, tuple) and len(entry.key) > 1 else "?"
                out.append(KeyDiff("graph code", str(before), str(now)))
            else:
                out.append(KeyDiff("key", "an earlier key", "a key differing in an unrecorded field"))
        return out


# ---------------------------------------------------------------------------------
# Prose at the edge
# ---------------------------------------------------------------------------------

_ARG = r"arg \d+(?: '[^']*')?"
_KINDS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(rf"^({_ARG})$"), "shape"),
    (re.compile(rf"^({_ARG}) dtype$"), "dtype"),
    (re.compile(rf"^({_ARG}) (?:stride|offset|storage|device)$"), "layout"),
    (re.compile(r"^static arg '(.*)'$"), "static"),
    (re.compile(r"^python scalar baked in '(.*)'$"), "scalar"),
    (re.compile(r"^(tensor '.*') dim \d+$"), "shape"),
    (re.compile(r"^(tensor '.*') rank$"), "shape"),
    (re.compile(r"^(tensor '.*') dtype$"), "dtype"),
    (re.compile(r"^(tensor '.*') (?:stride \d+|device)$"), "layout"),
    (re.compile(r"^(tensor '.*') requires_grad$"), "grad"),
    (re.compile(r"^(?:grad mode|graph kind|global state)$"), "grad"),
    (re.compile(r"^matmul precision$"), "precision"),
    (re.compile(r"^inputs$"), "inputs"),
    (re.compile(r"^dynamo guard$"), "guard"),
)


def diff_kind(field: str) -> str:
    """The kind of a difference: shape, dtype, layout, static, scalar, grad,
    precision, inputs, guard, or other."""
    for pattern, kind in _KINDS:
        if pattern.match(field):
            return kind
    return "other"


def describe(diff: KeyDiff) -> str:
    """One difference as a line of prose."""
    if diff.field == "dynamo guard":
        return f"dynamo guard failed: {diff.before}"
    if diff.field == "global state":
        return f"dynamo guard failed: global state ({diff.before}) changed"
    if diff.now == "changed" and diff.field.startswith("python scalar baked in"):
        name = diff.field.removeprefix("python scalar baked in ")
        return f"python scalar {name} was baked in as {diff.before}; this call passed another value"
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
        >>> print(explain("mul.Tensor", [KeyDiff("arg 0 'self'", "f32[8]", "f32[9]")], compiles=2))
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
    is its :func:`diff_kind`, ``count`` how many recompiles it took part in,
    ``values`` the distinct values it took, in first-seen order.
    """

    what: str
    kind: str
    count: int
    values: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class RecompileGroup:
    """The compiles of one op or graph (one identity) in a run."""

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

    @property
    def changing(self) -> Change | None:
        """What changed most often (the storm's cause), if anything was recorded."""
        return self.changes[0] if self.changes else None


def _dim_changes(diff: KeyDiff) -> list[tuple[str, str, str, str]]:
    """(what, kind, before, now) items of one difference, by dimension for shapes."""
    kind = diff_kind(diff.field)
    if kind == "shape":
        m = re.match(r"^(tensor '.*') dim (\d+)$", diff.field)
        if m:
            return [(f"dim {m.group(2)} of {m.group(1)}", kind, diff.before, diff.now)]
        a, b = parse_aval(diff.before), parse_aval(diff.now)
        if a and b and len(a[1]) == len(b[1]):
            return [
                (f"dim {d} of {diff.field}", kind, str(x), str(y))
                for d, (x, y) in enumerate(zip(a[1], b[1]))
                if x != y
            ]
        return [(f"rank of {diff.field}", kind, diff.before, diff.now)]
    if kind == "scalar":
        return [
            (
                f"python scalar {diff.field.removeprefix('python scalar baked in ')}",
                kind,
                diff.before,
                diff.now,
            )
        ]
    if kind == "inputs":
        return [("the inputs", kind, diff.before, diff.now)]
    return [(diff.field, kind, diff.before, diff.now)]


def _advice(change: Change, mode: str | None) -> str:
    what = change.what
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
        return f"{what} keeps changing; make the input contiguous (.contiguous()) or keep the slicing fixed"
    if change.kind == "precision":
        return "the float32 matmul precision changes between calls; set it once at start-up"
    if change.kind == "grad":
        return (
            "the function runs under grad and no-grad (or with inputs that do and do not require "
            "grad): one program per mode is expected, more means the mode toggles per step"
        )
    if change.kind == "inputs":
        return "the number or kind of inputs changes between calls (a graph break, or dynamic shapes); see the diffs"
    return f"{what} keeps changing: {', '.join(change.values[:4])}"


def _arg_changes(items: Sequence[CompileEvent], scalars: set[str]) -> list[Change]:
    """What varied across a group's keys, read from the compiled arguments themselves:
    every dimension, dtype and static value that took more than one value."""
    labels: dict[str, str] = {}
    dims: dict[tuple[str, int], dict[str, None]] = {}
    ranks: dict[str, dict[str, None]] = {}
    dtypes: dict[str, dict[str, None]] = {}
    statics: dict[str, dict[str, None]] = {}
    for c in items:
        for i, a in enumerate(c.args):
            # names line up across keys; positions only among keys with as many inputs
            key = a.name if a.name != f"arg{i}" else f"{len(c.args)}:{a.name}"
            labels.setdefault(key, _arg_label(i, a.name))
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
            out.append(Change(f"dim {d} of {labels[key]}", "shape", len(values) - 1, tuple(values)))
            shape_values.add(frozenset(values))
    for key, values in ranks.items():
        if len(values) > 1:
            out.append(Change(f"rank of {labels[key]}", "shape", len(values) - 1, tuple(values)))
    for key, values in dtypes.items():
        if len(values) > 1:
            out.append(Change(f"dtype of {labels[key]}", "dtype", len(values) - 1, tuple(values)))
    for key, values in statics.items():
        if len(values) < 2 or any(len(set(values) & dim) >= max(2, len(values) - 1) for dim in shape_values):
            continue  # constant, or a symbolic size passed beside its tensor (the dim says it)
        if key in scalars:
            out.append(Change(f"python scalar '{key}'", "scalar", len(values) - 1, tuple(values)))
        else:
            out.append(Change(f"static arg '{key}'", "static", len(values) - 1, tuple(values)))
    return out


_FROM_ARGS = ("shape", "dtype", "static", "scalar", "inputs")


def _shows(change: Change, diff: KeyDiff) -> bool:
    """``diff`` is an instance of ``change`` (the dimension itself changed, for a shape)."""
    m = re.match(r"^dim (\d+) of (.+)$", change.what)
    if m and change.kind == "shape":
        if diff.field == m.group(2):
            a, b = parse_aval(diff.before), parse_aval(diff.now)
            d = int(m.group(1))
            return bool(a and b and len(a[1]) == len(b[1]) > d and a[1][d] != b[1][d])
        return False
    quoted = re.search(r"'[^']*'", change.what)
    return (quoted.group(0) in diff.field) if quoted else change.what in diff.field


def summarize(
    compiles: Iterable[CompileEvent], *, storm_threshold: int = DEFAULT_STORM_THRESHOLD
) -> list[RecompileGroup]:
    """Group a run's compiles by identity; most recompiled first.

    A group recompiled more than ``storm_threshold`` times is a storm. Its
    ``changes`` name what kept changing, most values first: every dimension,
    dtype or static argument that took several values across the group's
    keys, then what only the diffs know (dynamo guards, grad mode,
    precision, view layout). ``advice`` says what to do about the top one.
    """
    groups: dict[tuple[str | None, str], list[CompileEvent]] = {}
    for c in compiles:
        groups.setdefault((c.mode, c.identity or c.name), []).append(c)
    out = []
    for (mode, identity), items in groups.items():
        re_items = [c for c in items if c.diffs]
        scalars = {
            d.field.removeprefix("python scalar baked in ").strip("'")
            for c in re_items
            for d in c.diffs
            if diff_kind(d.field) == "scalar"
        }
        changes_list = _arg_changes(items, scalars) if re_items else []
        tally: dict[tuple[str, str], list] = {}
        for c in re_items:  # what the keys' arguments cannot show
            seen_here = set()
            for d in c.diffs:
                for what, kind, before, now in _dim_changes(d):
                    arg_field = re.match(rf"^(?:dim \d+ of |rank of )?{_ARG}", what) or what.startswith(
                        ("static arg", "python scalar")
                    )
                    if (kind in _FROM_ARGS and arg_field) or kind == "inputs" and changes_list:
                        continue
                    slot = tally.setdefault((what, kind), [0, {}])
                    if (what, kind) not in seen_here:
                        slot[0] += 1
                        seen_here.add((what, kind))
                    for v in (before, now):
                        slot[1].setdefault(v, None)
        changes_list += [Change(what, kind, n, tuple(vals)) for (what, kind), (n, vals) in tally.items()]
        changes = tuple(sorted(changes_list, key=lambda ch: (-ch.count, ch.kind != "shape", ch.what)))
        where = collections.Counter(c.location for c in re_items)
        storm = len(re_items) > storm_threshold
        advice: tuple[str, ...] = ()
        example: tuple[KeyDiff, ...] = re_items[-1].diffs if re_items else ()
        if changes:
            top = changes[0]
            advice = (_advice(top, mode),)
            second = next((ch for ch in changes[1:] if ch.kind not in (top.kind, "inputs", "other")), None)
            if second is not None and 2 * second.count >= top.count:
                advice += (_advice(second, mode),)
            for c in reversed(re_items):  # the latest recompile the top change shows in
                if any(_shows(top, d) for d in c.diffs):
                    example = c.diffs
                    break
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
            )
        )
    out.sort(key=lambda g: (-g.recompiles, -g.compiles, g.identity))
    return out
