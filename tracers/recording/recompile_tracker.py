"""The recompile tracker: is a compile the first of its op or graph, or a recompile, and what changed.

Every compile has an *identity* (:func:`identity_of`): the eager op overload
(``mul.Tensor``), for a compiled graph the module or function dynamo compiled, in the
user's names (``"MLP 'f' compiled at train.py:18 (forward)"``, ``"step in train.py:30
(forward)"``; forward and inference graphs share one),
for a lazy fused graph where it was cut (``"graph cut by .item() at train.py:40"``).
A lazy graph's key is compared op by op (:func:`_graph_diffs`). A compile whose
identity was compiled before is a recompile. :class:`RecompileTracker` compares it
with the closest earlier key of that identity (fewest mismatches; the latest on a
tie) and keeps the differences as data, :class:`~tpu_debug.tracers.events.KeyDiff`
records (their aspects, and the prose and advice read from them after the run, are
``tracers/reading/recompile_analysis.py``'s).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Sequence
from typing import Any

from tpu_debug.core.format import format_location
from tpu_debug.core.records import CompileInfo
from tpu_debug.tracers.events import KeyDiff, SourceLocation
from tpu_debug.tracers.reading.recompile_analysis import compare_args, pretty_source, read_guard
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.recording.compiled_names import CompiledName, compiled_name, function_label
from tpu_debug.tracers.reading.lazy_graphs import trigger_text
from tpu_debug.tracers.recording.lazy_cuts import cut_site

__all__ = ["Observation", "RecompileTracker", "identity_of"]

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
    out, score = compare_args(before_args, now_args)  # the graph's inputs
    shape_only = None
    for i, (a, b) in enumerate(zip(b_ops, n_ops)):
        if a.args == b.args and a.inputs == b.inputs:
            continue
        found, _s = compare_args(a.args, b.args) if len(a.args) == len(b.args) else ([], 0)
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


def _named_args(info: CompileInfo) -> tuple:
    """A forward graph's arguments named after dynamo's sources for them, when they line up."""
    args = tuple(info.args)
    graph = info.graph
    names = graph.origin.inputs if graph is not None else ()
    if info.mode != "compiled" or graph.kind == "backward" or not names or len(names) != len(args):
        return args
    return tuple(dataclasses.replace(a, name=pretty_source(str(n))) for a, n in zip(args, names))



def _facts(info: CompileInfo) -> dict[tuple[str, str], str]:
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


def _lazy_identity(info: CompileInfo) -> tuple[Any, str]:
    """A lazy graph is known by where it is cut: the trigger and the user's line (read off
    the stack: compiles of lazy graphs are observed while the graph materializes)."""
    trigger = str(info.name).removeprefix("lazy/")
    if info.replayed:  # compiled before the trace: the stack is not the cut's
        return ("lazy", trigger, None), f"graph cut by {trigger_text(trigger)}"
    cause, loc = cut_site(trigger)
    where = f" at {format_location(loc.file, loc.line)}" if loc is not None else ""
    return ("lazy", cause, loc), f"graph cut by {trigger_text(cause)}{where}"


def identity_of(info: CompileInfo, named: CompiledName | None = None) -> tuple[Any, str]:
    """What ``info`` compiled, as a key and a label: an eager op, a lazy graph by its cut, a
    compiled graph by the module it is (``named``: its class, the name the user calls it by and
    the line that compiled it; see :mod:`.compiled_names`) or the function dynamo compiled, and
    its direction."""
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
    if named is not None:
        # one module compiled once is one identity, whichever line calls it and by which name
        where = (named.compiled_at.file, named.compiled_at.line) if named.compiled_at is not None else named.callee
        return ("module", named.cls, where, code, direction), f"{named.label()} ({direction})"
    if code is not None:  # (file, first line, name) of the function dynamo compiled
        file, line, name = code
        return ("code", file, line, name, direction), f"{function_label(name, file, line)} ({direction})"
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
        # the module each dynamo compile (its compile id) and each compiled code is, as named
        # while its forward compiled: AOTAutograd compiles the backward later, from loss.backward()
        self._named: dict[Any, CompiledName | None] = {}

    def _name_of(self, info: CompileInfo) -> CompiledName | None:
        graph = info.graph
        if info.mode != "compiled" or graph is None or info.replayed:
            return None
        origin = graph.origin
        if graph.kind != "backward":
            named = compiled_name(origin.function, depth=3)
            self._named[origin.compile_id] = self._named[origin.function] = named
            return named
        if origin.compile_id in self._named:
            return self._named[origin.compile_id]
        return self._named.get(origin.function)

    def observe(self, info: CompileInfo, *, op_locations: Sequence[SourceLocation | None] = ()) -> Observation:
        """Record compile ``info`` (a replayed one only becomes history) and say what it is.

        ``op_locations``: for a lazy graph, the user's line of each of its ops (the
        recorder's, from ``on_defer``), so a diff can say where the op that changed is.
        """
        ident, label = identity_of(info, self._name_of(info))
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
                diffs, score = compare_args(old.args, entry.args)
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
    def _with_dynamo(diffs: list[KeyDiff], previous: _Seen, entry: _Seen, info: CompileInfo) -> list[KeyDiff]:
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


