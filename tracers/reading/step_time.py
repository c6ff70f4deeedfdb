"""Where each step's time went, what bounds the run, and how much of it was goodput.

**The split.** A step's wall time (``StepEvent.seconds``, from the end of the step before
to its own end) is cut into parts that add up to it, each measured on the program's
thread (:class:`~tpu_debug.tracers.recording.step_tracker.StepTracker` counts them):

============  ============================================================================
``input``     waiting for the next batch (a ``DataLoader`` iterator's ``__next__``) and
              copying data to the device
``compile``   compiling programs (XLA compiles of eager ops, compiled graphs, lazy graphs,
              and dynamo's own work tracing the graphs it hands them), and reading programs
              back from the persistent compile cache: a warm cache makes this part shorter,
              never another part's
``sync``      waiting on the device: a read of a device value on the host (``.item()``,
              ``.cpu()``, ``print(t)``, ``if t:``) waits for the work queued before it, and
              so does ``torch.tpu.synchronize()``
``collective`` in c10d collectives: the host copies, the exchange, and waiting for the
              other ranks to arrive
``checkpoint`` saving checkpoints (``torch.save``, DCP's ``save``, ``async_save``'s
              blocking part)
``dispatch``  launching the step's programs; when the device's queue is full, the launch
              waits for the device, and on a backend that runs programs on the host (XLA
              CPU) it holds their work too
``host``      the rest: the step's Python, autograd and the runtime's host work between
              ops
============  ============================================================================

A compile or a program run inside a wait (a dataset that builds device tensors, a
collective's write-back) counts in that wait, once.

**The verdict.** The part that holds the most of a typical steady step's time (the median
share over the steady steps) bounds the run: input-, compile-, sync-, collective-, checkpoint- or host-bound, and device-bound
when it is ``dispatch`` (the programs' launch and the device's work: what a correct loop
spends its time on). The advisor's ``step_bound`` rule (``tracers/advisor/step_rules.py``)
makes a finding of it.

**Goodput** follows Google's ml-goodput-measurement: goodput is the share of the run's
wall time spent in productive steps; its badput buckets are program start-up (each
phase's first steps beyond the ideal step time, the mean of the steady steps within
median + 3 MADs, here split into the compiles made there and the rest), synchronous data
loading, and blocking checkpoint saves. Inside steady steps this adds what the library's
step timestamps cannot see: recompiles, waits for input, checkpoint saves, and what
syncs cost (an estimate: the time the host's work could have overlapped the device's,
the smaller of the step's device wait and its host time; the wait itself is the device
working). The rest of the run (after the last step, between steps) is ``other``.

This module imports neither torch nor jax: the reading verbs use it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tpu_debug.tracers.events import StepEvent
from tpu_debug.tracers.reading.step_phases import STEADY, WARMUP

__all__ = [
    "BOUNDS",
    "PARTS",
    "PART_TEXT",
    "Badput",
    "Goodput",
    "StepSplit",
    "Verdict",
    "goodput",
    "ideal_step_seconds",
    "split_step",
    "verdict",
]

PARTS = ("input", "compile", "sync", "collective", "checkpoint", "dispatch", "host")

# what each part is, for a reader
PART_TEXT = {
    "input": "waiting for input (the DataLoader's next batch, copies to the device)",
    "compile": "compiling (dynamo's tracing, XLA's compiles, or reading programs back from the compile cache)",
    "sync": "waiting on the device (reads such as .item(), .cpu(), print; synchronize)",
    "collective": "in collectives (the exchange, and waiting for the other ranks)",
    "checkpoint": "saving checkpoints (torch.save, DCP)",
    "dispatch": "running programs (their launch, and the device's work when its queue is full)",
    "host": "the rest: Python, autograd and the runtime's host work between ops",
}

# the run's bound when a part holds the most of its steady time
BOUNDS = {
    "input": "input-bound",
    "compile": "compile-bound",
    "sync": "sync-bound",
    "collective": "collective-bound",
    "checkpoint": "checkpoint-bound",
    "dispatch": "device-bound",
    "host": "host-bound",
}


@dataclasses.dataclass(frozen=True, slots=True)
class StepSplit:
    """One step's wall time in parts (seconds, in :data:`PARTS` order) that add up to ``seconds``.

    ``overlapped``: the measured parts came to more than the step's wall time (work of another
    thread counted in the step), so they were scaled down to it and ``host`` is 0.
    """

    index: int
    seconds: float
    parts: tuple[float, ...]
    overlapped: bool = False

    def part(self, name: str) -> float:
        return self.parts[PARTS.index(name)]

    def share(self, name: str) -> float:
        return self.part(name) / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(zip(PARTS, self.parts))


def split_step(step: StepEvent) -> StepSplit | None:
    """The split of ``step``, or None when its run did not record one (a run recorded before
    the split was kept, an imported log).

    Example::

        split = split_step(session.steps()[3])
        split.as_dict()   # {'input': 0.041, 'compile': 0.0, 'sync': 0.002, ..., 'host': 0.003}
    """
    waits = (step.input_seconds, step.sync_seconds, step.collective_seconds, step.checkpoint_seconds)
    if any(w is None for w in waits):
        return None
    data, sync, collective, checkpoint = (float(w) for w in waits)  # type: ignore[arg-type]
    compile_ = max(0.0, step.compile_seconds + step.read_back_seconds + step.trace_seconds
                   - step.inner_compile_seconds)
    dispatch = max(0.0, step.op_seconds - step.inner_op_seconds)
    measured = [data, compile_, sync, collective, checkpoint, dispatch]
    total = sum(measured)
    seconds = max(0.0, step.seconds)
    overlapped = total > seconds
    if overlapped:
        scale = seconds / total if total > 0 else 0.0
        measured = [m * scale for m in measured]
    host = max(0.0, seconds - sum(measured))
    return StepSplit(step.index, seconds, (*measured, host), overlapped)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What bounds the run's steady state.

    ``part`` holds the largest share of a typical steady step's time: ``share`` is the
    median over the steady steps of its share of each step (``shares`` every part's median
    share, in :data:`PARTS` order), so one step that compiles for once (an evaluation's new
    shape) does not make a run compile-bound. ``seconds`` is the part's time over the
    ``steps`` steady steps, of their ``steady_seconds``; ``bound`` its name as a bound
    (:data:`BOUNDS`). ``warmup_only``: the run had no steady step, so the verdict is over its
    warm-up steps after the first.
    """

    part: str
    share: float
    seconds: float
    steady_seconds: float
    steps: int
    shares: tuple[float, ...]
    warmup_only: bool = False

    @property
    def bound(self) -> str:
        return BOUNDS[self.part]

    def render(self) -> str:
        where = "a typical warm-up step" if self.warmup_only else "a typical steady step"
        return f"{self.bound}: {100 * self.share:.0f}% of {where} is {PART_TEXT[self.part]}"


def verdict(steps: Sequence[StepEvent], phases: Sequence[str]) -> Verdict | None:
    """The run's :class:`Verdict` over its steady steps (``phases``, per step as
    :func:`~tpu_debug.tracers.reading.step_phases.step_phases` gives them); None without a split step.

    Example::

        v = verdict(steps, step_phases(steps))
        v.bound, round(v.share, 2)      # ('input-bound', 0.83)
    """
    pairs = [(split_step(s), p) for s, p in zip(steps, phases)]
    chosen = [sp for sp, p in pairs if sp is not None and p == STEADY and sp.seconds > 0]
    warmup_only = not chosen
    if warmup_only:
        # no steady step: a run that compiles at every step is all warm-up but its first step
        ordered = sorted((sp for sp, _ in pairs if sp is not None and sp.seconds > 0), key=lambda sp: sp.index)
        chosen = ordered[1:]
    if not chosen:
        return None
    medians = [statistics.median(sp.parts[i] / sp.seconds for sp in chosen) for i in range(len(PARTS))]
    totals = [sum(sp.parts[i] for sp in chosen) for i in range(len(PARTS))]
    top = max(range(len(PARTS)), key=lambda i: (medians[i], totals[i]))
    return Verdict(PARTS[top], medians[top], totals[top], sum(sp.seconds for sp in chosen), len(chosen),
                   tuple(medians), warmup_only)


# -- goodput ---------------------------------------------------------------------------------

BADPUT_CAUSES = ("start-up", "first compiles", "recompiles", "data", "syncs", "checkpoints", "other")

_CAUSE_TEXT = {
    "start-up": "each phase's first steps beyond the ideal step time, less their compiles (building the "
                "model, first uploads, work between phases), and time before the first step",
    "first compiles": "compiles in the warm-up steps (the goodput library's program start-up)",
    "recompiles": "compiles in steady steps",
    "data": "steady steps waiting for input (the library's synchronous data loading)",
    "syncs": "what the steady steps' syncs cost: per step the smaller of its device wait and its host "
             "time, the overlap a read at every step removes (an estimate)",
    "checkpoints": "blocking checkpoint saves (torch.save, DCP)",
    "other": "the rest of the run: after the last step, between steps",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Badput:
    """Time of the run that made no training progress, by ``cause`` (:data:`BADPUT_CAUSES`)."""

    cause: str
    seconds: float
    estimated: bool = False

    @property
    def text(self) -> str:
        return _CAUSE_TEXT[self.cause]


@dataclasses.dataclass(frozen=True, slots=True)
class Goodput:
    """The run's goodput: ``goodput_seconds`` of ``total_seconds`` in productive steps, the
    ``badput`` by cause (they add up to the rest), and the ``ideal_step_seconds`` the start-up
    buckets are measured against."""

    total_seconds: float
    goodput_seconds: float
    ideal_step_seconds: float
    badput: tuple[Badput, ...]

    @property
    def share(self) -> float:
        return self.goodput_seconds / self.total_seconds if self.total_seconds > 0 else 0.0

    def badput_of(self, cause: str) -> float:
        return sum(b.seconds for b in self.badput if b.cause == cause)


def ideal_step_seconds(seconds: Sequence[float]) -> float | None:
    """The goodput library's ideal step time: the mean of the step times within the median plus
    three median absolute deviations (None for no steps)."""
    if not seconds:
        return None
    med = statistics.median(seconds)
    mad = statistics.median(abs(s - med) for s in seconds)
    return statistics.fmean(s for s in seconds if s <= med + 3 * mad)


def goodput(steps: Sequence[StepEvent], phases: Sequence[str], total_seconds: float | None,
            checkpoint_waits: Sequence[Any] = ()) -> Goodput | None:
    """The run's :class:`Goodput`, or None without a step whose split was recorded.

    Args:
        steps: the run's steps; ``phases`` their phases (``step_phases``).
        total_seconds: the run's wall time (its duration; the last step's end when None).
        checkpoint_waits: the run's checkpoint ``WaitEvent``s (those outside every step count
            as checkpoint badput too).
    """
    splits = [(s, split_step(s), p) for s, p in zip(steps, phases)]
    if not splits or any(sp is None for _, sp, _ in splits):
        return None
    ordered = sorted(splits, key=lambda t: t[0].ts)
    steady = [s.seconds for s, _, p in ordered if p == STEADY] or [s.seconds for s, _, _ in ordered[1:]]
    ideal = ideal_step_seconds(steady) or 0.0
    first = ordered[0][0].ts
    end = max(s.end for s, _, _ in ordered)
    total = max(float(total_seconds or 0.0), end)
    bad = dict.fromkeys(BADPUT_CAUSES, 0.0)
    bad["start-up"] = max(0.0, first)
    good = 0.0
    for step, sp, phase in ordered:
        if phase == WARMUP:
            excess = max(0.0, step.seconds - ideal)
            compiles = min(excess, sp.part("compile"))  # type: ignore[union-attr]
            saves = min(excess - compiles, sp.part("checkpoint"))  # type: ignore[union-attr]
            bad["first compiles"] += compiles
            bad["checkpoints"] += saves
            bad["start-up"] += excess - compiles - saves
            good += step.seconds - excess
            continue
        lost = {
            "recompiles": sp.part("compile"),  # type: ignore[union-attr]
            "data": sp.part("input"),  # type: ignore[union-attr]
            "checkpoints": sp.part("checkpoint"),  # type: ignore[union-attr]
            "syncs": min(sp.part("sync"), sp.part("host") + sp.part("dispatch")),  # type: ignore[union-attr]
        }
        for cause, seconds in lost.items():
            bad[cause] += seconds
        good += max(0.0, step.seconds - sum(lost.values()))
    for wait in checkpoint_waits:
        if wait.ts < first:  # a save before the first step: not start-up
            moved = min(wait.seconds, bad["start-up"])
            bad["start-up"] -= moved
            bad["checkpoints"] += moved
        elif not any(s.ts <= wait.ts < s.end for s, _, _ in ordered):
            bad["checkpoints"] += wait.seconds  # after the last step or between steps
    bad["other"] = max(0.0, total - good - sum(v for k, v in bad.items() if k != "other"))
    badput = tuple(Badput(cause, seconds, estimated=cause == "syncs") for cause, seconds in bad.items())
    return Goodput(total, good, ideal, badput)
