"""Ranks whose compiled programs differ: the first place their sequences of compiles part.

Under ``torchrun`` each rank compiles its own graphs (``torch.compile``), and ranks that
should run alike can compile different programs: a batch of another size on one rank
(a recompile there only), a branch on the rank inside the compiled code, a dynamo guard
on a rank-dependent value. The collectives inside such programs then pair up wrongly or
hang, and a rank that recompiles when the others do not falls behind them every step.
tlparse's ``--all-ranks-html`` flags such ranks from their TORCH_TRACE logs; here each
rank's run holds its ``compile`` events, each naming the graph, its input signature, the
content hash of its HLO (with ``hlo=True``), the step it was compiled in and, for a
recompile, why (:class:`~.events.KeyDiff`).

:func:`first_program_difference` compares the ranks' compiled-mode compiles in order and
returns the first one they do not share, with each rank's side.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence

from tpu_debug.tracers.events import CompileEvent
from tpu_debug.tracers.reading.view import RunView

__all__ = ["ProgramDifference", "ProgramSide", "compiled_programs", "first_program_difference"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramSide:
    """One rank's n-th compiled program: the graph's ``name``, its ``program`` hash (None
    when HLO was not recorded), input ``signature``, the ``step`` it was compiled in (None
    outside steps), its user's ``line`` and, for a recompile, ``why`` (its differences)."""

    name: str
    program: str | None
    signature: str
    step: int | None
    line: str | None
    why: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """What two ranks must share to run the same program."""
        return self.name, self.program or self.signature

    def text(self) -> str:
        program = f"program {self.program[:12]}, " if self.program else ""
        at = f" at step {self.step}" if self.step is not None else ""
        why = f", a recompile ({self.why})" if self.why else ""
        line = f" at {self.line}" if self.line else ""
        return f"{self.name} ({program}{self.signature}){at}{why}{line}"


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramDifference:
    """The ``index``-th compiled program (from 1), which the ranks do not share; ``sides``:
    each rank's program there (None: it compiled fewer)."""

    index: int
    sides: tuple[tuple[int, ProgramSide | None], ...]

    def render(self) -> str:
        parts = [f"rank {r}: {s.text() if s is not None else 'no such compile (it compiled fewer programs)'}"
                 for r, s in self.sides]
        return f"the ranks' compiled programs differ at compile #{self.index}: " + "; ".join(parts)


def compiled_programs(session: RunView) -> list[ProgramSide]:
    """The graphs a rank's run compiled (compiled mode, the program read back from the
    persistent cache included), in order, each with its step."""
    steps = sorted(session.events("step"), key=lambda s: s.ts)
    starts = [s.ts for s in steps]
    out = []
    for c in session.events("compile"):
        if not isinstance(c, CompileEvent) or c.mode != "compiled":
            continue
        i = bisect.bisect_right(starts, c.ts) - 1
        step = steps[i].index if i >= 0 and c.ts <= steps[i].end else None
        why = "; ".join(d.render() for d in c.diffs)
        out.append(ProgramSide(c.name, c.program, c.signature, step,
                               str(c.location) if c.location is not None else None, why))
    return out


def first_program_difference(per_rank: Mapping[int, Sequence[ProgramSide]]) -> ProgramDifference | None:
    """The first compiled program the ranks do not share, or None when they compiled the
    same ones in the same order (or only one rank compiled)."""
    ranks = sorted(per_rank)
    if len(ranks) < 2 or not any(per_rank.values()):
        return None
    for i in range(max(len(per_rank[r]) for r in ranks)):
        here = [(r, per_rank[r][i] if i < len(per_rank[r]) else None) for r in ranks]
        if any(s is None for _, s in here) or len({s.key for _, s in here if s is not None}) > 1:
            return ProgramDifference(i + 1, tuple(here))
    return None
