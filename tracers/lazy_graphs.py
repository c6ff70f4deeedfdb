"""Lazy graphs: why a pending graph was cut where it was, and how a run's steps were cut.

In lazy mode (``DEFER_AND_FUSE``) the runtime records ops and runs them as one
program when a value is needed. The runtime knows *how* the value was needed
(``MaterializeInfo.trigger``: ``"read"``, ``"optimizer_step"``, ...); the
user's *cause* and line come from the stack at that moment, as for transfers
(:func:`~.transfers.classify`: a read under ``loss.item()`` is ``"item"``, under
``if t:`` ``"bool"``, inside ``print(t)`` ``"print"``).

=======================  ======================================================
trigger                  what needed the values
=======================  ======================================================
``item``, ``float``...   a host read: ``.item()``, ``float(t)``, ``int(t)``,
                         ``.tolist()``, ``.numpy()``, a tensor as an index
``print``                ``print(t)``, ``repr(t)``, ``f"{t}"``
``bool``                 ``if t:``, ``while t:``, ``bool(t)``
``cpu``, ``to``, ``copy``  an explicit copy to the host
``read``                 another reader (a compiled program's input, a storage copy)
``synchronize``          ``torch.tpu.synchronize()``
``optimizer_step``       the end of ``optimizer.step()``
``size_limit``           the graph reached ``config.lazy_graph_limit`` ops
``mode_change``          leaving ``DEFER_AND_FUSE``
``fallback:<op>``        an op with no lowering ran on CPU
``data_dependent:<op>``  an op whose output shape depends on values (``nonzero``)
=======================  ======================================================

:func:`summarize` reads a run's materialization events: graphs per step (a
step ends at each ``optimizer.step()``), and the cuts by trigger and line, so
the report can say which line cuts a step's graph in pieces.

This module imports neither torch nor jax.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import sys
from collections.abc import Iterable, Iterator
from types import CodeType, FrameType

from tpu_debug.tracers.events import MaterializationEvent, SourceLocation
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.transfers import CAUSE_TEXT, _frame_kind, classify

__all__ = ["TRIGGER_TEXT", "Cut", "LazySummary", "StepFrames", "cut_site", "summarize", "trigger_text"]

# runtime triggers that are not host reads: their cause is the trigger itself
_OWN = ("synchronize", "optimizer_step", "size_limit", "mode_change")

TRIGGER_TEXT = {
    **CAUSE_TEXT,
    "read": "value read",
    "synchronize": "torch.tpu.synchronize()",
    "optimizer_step": "optimizer.step()",
    "size_limit": "graph size limit",
    "mode_change": "leaving DEFER_AND_FUSE",
}


def trigger_text(trigger: str) -> str:
    """How the report names a trigger: ``.item()``, ``optimizer.step()``, ``CPU fallback of nonzero``."""
    if trigger.startswith("fallback:"):
        return f"CPU fallback of {trigger.removeprefix('fallback:')}"
    if trigger.startswith("data_dependent:"):
        return f"data-dependent {trigger.removeprefix('data_dependent:')}"
    return TRIGGER_TEXT.get(trigger, trigger)


def cut_site(trigger: str, depth: int = 1) -> tuple[str, SourceLocation | None]:
    """(cause, user line) of a materialization the runtime reports with ``trigger``,
    read from the stack of the thread materializing (call it there).

    Example::

        cut_site("read")        # under `loss.item()` in train.py
        # ('item', SourceLocation('train.py', 20, 'train'))
    """
    if trigger in _OWN or trigger.startswith("fallback:"):
        return trigger, user_location(depth + 1)
    cause, _implicit, location = classify(trigger, depth + 1)
    return cause, location


def _user_frames() -> Iterator[FrameType]:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if _frame_kind(frame.f_code) == "user":
            yield frame
        frame = frame.f_back


class StepFrames:
    """Where the user's code stood at the last ``optimizer.step()``, to tell whether a later
    read is written after that call (call both methods on the thread that materializes).

    The innermost of the user's frames that is still running from the step to the read is
    the code both are in: the loop's frame for a read after ``opt.step()`` in the loop body
    or after an inner loop, the caller's frame when ``opt.step()`` is inside a
    ``train_step()`` it calls. The read comes after the step when that frame has moved on
    past the line it was at. A frame is known by its id and code (no reference is kept: a
    frame holds its locals, tensors among them, alive).
    """

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[int, tuple[CodeType, int]] = {}

    def step_ended(self) -> None:
        self._lines = {id(f): (f.f_code, f.f_lineno) for f in _user_frames()}

    def read_after_step(self) -> bool:
        for f in _user_frames():
            seen = self._lines.get(id(f))
            if seen is not None and seen[0] is f.f_code:
                return f.f_lineno > seen[1]
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class Cut:
    """The materializations of one trigger at one line, added up.

    ``count``: how many; ``compiled``: how many compiled their program (the rest found
    it cached); ``ops``: mean ops per graph; ``seconds``: total time materializing
    (compiles included); ``steps``: in how many optimizer steps it cut the graph.
    """

    trigger: str
    location: SourceLocation | None
    count: int
    compiled: int
    ops: float
    seconds: float
    steps: int

    @property
    def text(self) -> str:
        return trigger_text(self.trigger)


@dataclasses.dataclass(frozen=True, slots=True)
class LazySummary:
    """How a run's lazy graphs were cut.

    ``graphs``: materializations that ran a program; ``empty``: those that found
    nothing still referenced; ``programs``: distinct programs run; ``compiles``:
    materializations that compiled; ``steps``: optimizer steps seen;
    ``per_step``: graphs run in each complete step (step order); ``cuts``: by
    trigger and line, most frequent first; ``split_steps``: steps whose work was
    cut into more than one graph; ``extra_cuts``: within those steps, the cuts other
    than the step's end (what splits them), most frequent first. A read written
    after ``optimizer.step()`` (a metric, a read after the loop) runs a graph of its
    own in the next step without cutting that step's work, and is neither.
    """

    graphs: int
    empty: int
    programs: int
    compiles: int
    ops: float
    steps: int
    per_step: tuple[int, ...]
    cuts: tuple[Cut, ...]
    split_steps: int
    extra_cuts: tuple[Cut, ...]

    @property
    def graphs_per_step(self) -> float | None:
        return statistics.median(self.per_step) if self.per_step else None


def _cuts(events: list[MaterializationEvent]) -> tuple[Cut, ...]:
    groups: dict[tuple, list[MaterializationEvent]] = collections.defaultdict(list)
    for e in events:
        groups[(e.trigger, e.location)].append(e)
    out = [
        Cut(trigger, location, len(items), sum(e.compiled for e in items),
            sum(e.ops for e in items) / len(items), sum(e.seconds for e in items),
            len({e.step for e in items}))
        for (trigger, location), items in groups.items()
    ]
    out.sort(key=lambda c: (-c.count, -c.seconds, c.trigger))
    return tuple(out)


def summarize(events: Iterable[MaterializationEvent]) -> LazySummary:
    """Graphs per step and cuts by trigger and line, from a run's materialization events."""
    events = sorted(events, key=lambda e: e.id)
    ran = [e for e in events if e.outputs]
    steps = sum(1 for e in events if e.trigger == "optimizer_step")
    by_step: dict[int, list[MaterializationEvent]] = collections.defaultdict(list)
    for e in ran:
        by_step[e.step].append(e)
    # a complete step is one ended by an optimizer step
    ends = {e.step: e for e in events if e.trigger == "optimizer_step"}
    complete = sorted(ends)
    per_step = tuple(len(by_step.get(s, ())) for s in complete)
    extra = [e for s in complete for e in by_step.get(s, ()) if e.trigger != "optimizer_step" and not e.after_step]
    split = sorted({e.step for e in extra})
    return LazySummary(
        graphs=len(ran),
        empty=len(events) - len(ran),
        programs=len({e.program or e.graph for e in ran}),
        compiles=sum(e.compiled for e in ran),
        ops=(sum(e.ops for e in ran) / len(ran)) if ran else 0.0,
        steps=steps,
        per_step=per_step,
        cuts=_cuts(ran),
        split_steps=len(split),
        extra_cuts=_cuts(extra),
    )
