"""Steps read back: which step an event is in, which steps are warm-up and which steady state.

Every event belongs to the step whose time span holds its timestamp
(:class:`StepIndex`; the run store needs no step column for that), and
:func:`step_phases` says which steps are warm-up and which are steady state.
Warm-up is the first steps of a run, and of each new phase of it (another
optimizer, an evaluation loop), until a step compiles nothing: there every op
and graph is compiled for the first time, and an op compiled for several shapes
at once (one per layer) is shape polymorphism, not a problem. A compile in
steady state is one the program pays again and again. The steps themselves are
cut while recording (``tracers/recording/step_tracker.py``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from tpu_debug.tracers.events import CompileEvent, StepEvent

__all__ = [
    "STEADY",
    "WARMUP",
    "WARMUP_MAX",
    "PhaseTotals",
    "StepIndex",
    "StepSummary",
    "phase_of",
    "step_phases",
    "summarize_steps",
]

# a run (or a new phase of it) may compile for this many steps and still be warming up
WARMUP_MAX = 3



class StepIndex:
    """Finds the step an event belongs to by its timestamp.

    Example::

        index = StepIndex(session.events("step"))
        index.step_of(compile_event.ts)     # its step's index, or None outside every step
        # 3
    """

    def __init__(self, steps: Sequence[StepEvent]) -> None:
        self.steps = sorted(steps, key=lambda s: (s.ts, s.index))
        self._starts = [s.ts for s in self.steps]

    def position(self, ts: float) -> int | None:
        """The position in :attr:`steps` of the step holding ``ts``."""
        i = bisect.bisect_right(self._starts, ts) - 1
        if i < 0:
            return None
        step = self.steps[i]
        return i if ts < step.end or (ts == step.end == step.ts) else None

    def step_of(self, ts: float) -> int | None:
        """The index of the step holding ``ts``; None before the first step, after the
        last or between two (a loop's steps need not be contiguous with the run's start)."""
        i = self.position(ts)
        return self.steps[i].index if i is not None else None

    def __len__(self) -> int:
        return len(self.steps)


WARMUP, STEADY = "warm-up", "steady"


def step_phases(steps: Sequence[StepEvent], *, warmup_max: int = WARMUP_MAX) -> list[str]:
    """``"warm-up"`` or ``"steady"`` for each step (in the order given, by index).

    Steps that compile come in runs. A run is warm-up when it opens the
    program (the first steps) or a new phase of it: the first step after it
    that compiles nothing runs a sequence of programs no earlier step ran
    (another optimizer, an evaluation loop), so the compiles made programs
    for work that then repeats. A warm-up run longer than ``warmup_max``
    steps is warm-up only in its first step: compiling step after step is not
    warming up. Every other step is steady state; compiles there (an input
    whose shape changes again, an executable evicted and compiled again)
    cost time at every recurrence.

    Example::

        [s.compiles for s in steps]
        # [37, 4, 0, 0, 0, 6, 0]
        step_phases(steps)
        # ['warm-up', 'warm-up', 'steady', 'steady', 'steady', 'steady', 'steady']
    """
    ordered = sorted(range(len(steps)), key=lambda i: steps[i].index)
    out = [STEADY] * len(steps)
    seen: set[str] = set()
    k = 0
    while k < len(ordered):
        step = steps[ordered[k]]
        if not (step.compiles or step.read_backs):
            seen.add(step.sequence)
            k += 1
            continue
        j = k
        while j < len(ordered) and (steps[ordered[j]].compiles or steps[ordered[j]].read_backs):
            j += 1
        settled = steps[ordered[j]] if j < len(ordered) else None
        # a run still compiling when the steps end cannot show whether it would settle
        opens = k == 0 or settled is None or settled.sequence not in seen
        if opens:
            last = j if j - k <= warmup_max else k + 1
            for m in range(k, last):
                out[ordered[m]] = WARMUP
        for m in range(k, j):
            seen.add(steps[ordered[m]].sequence)
        k = j
    return out


def phase_of(index: StepIndex, phases: dict[int, str], ts: float) -> str:
    """Where ``ts`` falls: ``"setup"`` (before the first step), ``"warm-up"``,
    ``"steady"``, ``"tail"`` (after the last step), or ``"between"`` (a gap
    between two steps), or ``"unstepped"`` when the run has no steps."""
    if not len(index):
        return "unstepped"
    i = index.position(ts)
    if i is not None:
        return phases[index.steps[i].index]
    if ts < index.steps[0].ts:
        return "setup"
    if ts >= index.steps[-1].end:
        return "tail"
    return "between"


@dataclasses.dataclass(frozen=True, slots=True)
class PhaseTotals:
    """Compiles in one part of a run (before the steps, warm-up, steady state, after them);
    ``read_backs`` the executables read back from the persistent compile cache there instead
    (counted apart: nothing compiled), taking ``read_back_seconds``."""

    compiles: int = 0
    recompiles: int = 0
    seconds: float = 0.0
    read_backs: int = 0
    read_back_seconds: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class StepSummary:
    """A run's steps at a glance: how many, how found, which warmed up, what steady state costs.

    ``detected`` is how the steps were found (``"optimizer"``, ``"explicit"``,
    ``"loop"``; None without steps). ``warmup`` holds the warm-up steps' indexes.
    ``step_seconds``, ``ops_per_step`` and ``op_seconds`` are medians over the
    steady steps (None without any). ``setup``, ``warm``, ``steady_compiles`` and
    ``tail`` count the compiles before the first step, in warm-up steps, in
    steady steps and after the last step.
    """

    steps: int
    detected: str | None
    warmup: tuple[int, ...]
    steady: int
    step_seconds: float | None
    ops_per_step: float | None
    op_seconds: float | None
    setup: PhaseTotals
    warm: PhaseTotals
    steady_compiles: PhaseTotals
    tail: PhaseTotals

    def warmup_ranges(self) -> list[tuple[int, int]]:
        """The warm-up steps as (first, last) runs: [(0, 1), (100, 101)]."""
        out: list[tuple[int, int]] = []
        for i in self.warmup:
            if out and out[-1][1] == i - 1:
                out[-1] = (out[-1][0], i)
            else:
                out.append((i, i))
        return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


_NONE = (0, 0, 0.0, 0, 0.0)


def summarize_steps(steps: Sequence[StepEvent], compiles: Sequence[CompileEvent]) -> StepSummary:
    """The :class:`StepSummary` of a run's steps and its compile events."""
    phases = dict(zip((s.index for s in steps), step_phases(steps)))
    index = StepIndex(steps)
    totals: dict[str, list] = {}
    for c in compiles:
        t = totals.setdefault(phase_of(index, phases, c.ts), [0, 0, 0.0, 0, 0.0])
        if c.from_cache:  # read back from the persistent cache: nothing compiled
            t[3] += 1
            t[4] += c.seconds
            continue
        t[0] += 1
        t[1] += int(bool(c.diffs))
        t[2] += c.seconds
    steady = [s for s in steps if phases[s.index] == STEADY]
    detected = sorted({s.detected for s in steps})
    return StepSummary(
        steps=len(steps),
        detected=("+".join(detected) if detected else None),
        warmup=tuple(sorted(i for i, p in phases.items() if p == WARMUP)),
        steady=len(steady),
        step_seconds=_median([s.seconds for s in steady]),
        ops_per_step=_median([float(s.ops) for s in steady]),
        op_seconds=_median([s.op_seconds for s in steady]),
        setup=PhaseTotals(*totals.get("setup", ())),
        warm=PhaseTotals(*totals.get(WARMUP, ())),
        steady_compiles=PhaseTotals(*totals.get(STEADY, ())),
        tail=PhaseTotals(*[sum(x) for x in zip(*(totals.get(k, _NONE) for k in ("tail", "between", "unstepped")))]),
    )
