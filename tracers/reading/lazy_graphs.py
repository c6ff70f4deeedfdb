"""Lazy graphs read back: why each pending graph was cut where it was, and how a run's steps were cut.

In lazy mode (``DEFER_AND_FUSE``) the runtime records ops and runs them as one
program when a value is needed. The runtime knows *how* the value was needed
(``MaterializeInfo.trigger``: ``"read"``, ``"optimizer_step"``, ...); the
user's *cause* and line come from the stack at that moment, as for transfers
(``tracers/recording/lazy_cuts.py``: a read under ``loss.item()`` is ``"item"``, under
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
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Iterable

from tpu_debug.tracers.events import MaterializationEvent, SourceLocation
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT

__all__ = ["TRIGGER_TEXT", "Cut", "LazySummary", "summarize", "trigger_text"]

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
