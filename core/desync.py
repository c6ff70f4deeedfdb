"""When the ranks of a c10d group stop calling the same collectives: the difference, its
cause and its fix, as data and as one text.

c10d pairs a group's collectives by their order: the n-th collective of one rank runs
with the n-th of every other. A rank that calls another collective there, with other
sizes, another dtype or reduction, or none at all, makes the group hang or mix data.
Two readers see it: the live check of the `tpu` process group
(``runtime/distributed/c10d.py``, before a collective enters gloo) and the reader of
recorded ``collective_call`` events (``tracers/collective_calls.py``, after a job was
killed). Both describe what each rank did with :class:`RankCall` and tell it through
:func:`describe`, so the error a rank raises, the finding in its run and the
after-the-fact analysis say the same thing.

Plain data and text: this module imports neither torch nor jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tpu_debug.core.collective_kinds import ROOTED, SAME_SHAPES
from tpu_debug.core.format import format_location

__all__ = [
    "CAUSES",
    "REASONS",
    "RankCall",
    "cause_of",
    "describe",
    "differ",
    "fix_for",
    "rank_line",
]


#: why the ranks' calls differ, in the order they are tested
REASONS = ("missing", "op", "device", "shapes", "dtype", "reduce_op", "root")

#: what made them differ: each cause's one-line name
CAUSES = {
    "rank_zero": "a collective only rank 0 calls (under `if rank == 0:`)",
    "branch": "a rank-dependent branch: the ranks called other collectives, or in another order",
    "uneven_batch": "an uneven last batch: the ranks ran the loop a different number of times, or its last "
                    "step with other sizes",
    "sizes": "rank-dependent sizes: the ranks gave tensors of other sizes to one collective",
    "dtype": "rank-dependent dtypes: the ranks gave tensors of other dtypes to one collective",
    "device": "tensors of other devices: the ranks gave one collective tensors on other devices",
    "died": "a rank died",
    "late": "a rank did not arrive: it is stuck elsewhere, or slow",
}

# what a rank that did not call the collective was doing instead
_STATES = ("called", "missing", "ended", "died")


@dataclasses.dataclass(frozen=True, slots=True)
class RankCall:
    """What one rank (``rank``, global) did at a group's collective.

    With ``state == "called"`` the fields describe the collective it called there.
    Otherwise it did not call it: ``"missing"`` (it did not arrive: still alive, or its
    calls simply end there), ``"ended"`` (its process left), ``"died"`` (its process is
    gone without leaving); the fields then describe the last collective of the group it
    did call (``seq`` None: none known).
    """

    rank: int
    state: str = "called"
    op: str | None = None
    seq: int | None = None
    shapes: tuple[str, ...] = ()
    dtype: str = ""
    reduce_op: str | None = None
    peer: int | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    device: str = ""  # the tensors' device type ("tpu", "cpu"; "" when not known)

    def __post_init__(self) -> None:
        if self.state not in _STATES:
            raise ValueError(f"RankCall state {self.state!r}; use one of {', '.join(_STATES)}")

    @property
    def where(self) -> str | None:
        """The user's line, ``train.py:12 in step``, or None."""
        return format_location(self.file, self.line, self.function) if self.file else None

    def call_text(self) -> str:
        """``allreduce([4]; float32, SUM) at train.py:12 in step``."""
        shapes = ", ".join(self.shapes) or "no tensors"
        extra = f", {self.reduce_op}" if self.reduce_op else ""
        if self.op in ROOTED and self.peer is not None:
            extra += f", root {self.peer}"
        where = f" at {self.where}" if self.where else ""
        on = f" on {self.device}" if self.device and self.device != "tpu" else ""
        return f"{self.op}({shapes}; {self.dtype or '-'}{extra}){on}{where}"


def differ(calls: Sequence[RankCall]) -> str | None:
    """Why the ranks' calls of one collective differ (one of :data:`REASONS`), or None when
    they agree."""
    if any(c.state != "called" for c in calls):
        return "missing"
    if not calls:
        return None
    first = calls[0]
    if any(c.op != first.op for c in calls):
        return "op"
    if all(c.device for c in calls) and any(c.device != first.device for c in calls):
        return "device"
    if first.op in SAME_SHAPES and any(c.shapes != first.shapes for c in calls):
        return "shapes"
    if any(c.dtype != first.dtype for c in calls):
        return "dtype"
    if any(c.reduce_op != first.reduce_op for c in calls):
        return "reduce_op"
    if first.op in ROOTED and any(c.peer != first.peer for c in calls):
        return "root"
    return None


def cause_of(reason: str, calls: Sequence[RankCall], *, repeated: bool = False) -> str:
    """The likeliest cause (a key of :data:`CAUSES`) of a difference.

    Args:
        reason: what differs (:func:`differ`).
        calls: each rank's call there.
        repeated: the line the calling ranks are at ran before with every rank agreeing
            (the collective sits in a loop).
    """
    called = [c for c in calls if c.state == "called"]
    others = [c for c in calls if c.state != "called"]
    if any(c.state == "died" for c in others):
        return "died"
    if reason == "missing":
        sites = {c.where for c in called}
        if any(c.where is not None and c.where in sites for c in others):
            return "uneven_batch"  # the others' last call was this line: one pass of the loop fewer
        if any(c.state == "missing" for c in others) and not all(c.seq is None for c in others):
            return "late"
        ranks = sorted(c.rank for c in calls)
        return "rank_zero" if [c.rank for c in called] == ranks[:1] else "branch"
    if reason in ("dtype", "device"):
        return reason
    if len({(c.file, c.line) for c in called}) > 1:
        return "branch"  # the ranks are at different lines: each took its own way there
    if reason == "shapes":
        return "uneven_batch" if repeated and len({c.where for c in calls}) == 1 else "sizes"
    return "branch"


def _ranks(calls: Sequence[RankCall]) -> str:
    ranks = [str(c.rank) for c in calls]
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(ranks)


def fix_for(cause: str, calls: Sequence[RankCall], seq: int, *, timeout: float | None = None) -> str:
    """What to do about a difference of ``cause`` at collective ``seq``, naming the ranks and lines."""
    called = [c for c in calls if c.state == "called"]
    others = [c for c in calls if c.state != "called"]
    if cause == "died":
        dead = [c for c in others if c.state == "died"]
        return (
            f"{_ranks(dead)} died: its own output or the launcher's says why (out of memory, a signal, a "
            "crash). The group cannot go on without it: restart the job from its last checkpoint "
            "(torchrun --max-restarts restarts every rank)."
        )
    if cause == "rank_zero":
        site = called[0].where or "its line"
        return (
            f"{_ranks(called)} alone called collective #{seq} at {site}: a collective under `if rank == 0:` "
            "(a metric, logging, saving) waits for ranks that never call it. Call it on every rank of the "
            "group and use its result on rank 0 only, or do rank 0's work without a collective."
        )
    if cause == "uneven_batch":
        return (
            "Give every rank the same number of batches, of the same sizes: "
            "DistributedSampler(dataset, drop_last=True) or DataLoader(..., drop_last=True), or pad the last "
            "batch; DDP's `with model.join():` lets ranks with fewer batches finish."
        )
    if cause == "sizes":
        return (
            "Give the collective tensors of the same size on every rank: the size depends on the rank there. "
            "Pad to a common size, or use all_to_all_single with split sizes (or all_gather_object) for "
            "uneven pieces."
        )
    if cause == "dtype":
        return "Give the collective tensors of one dtype on every rank: cast before the call (.to(dtype))."
    if cause == "device":
        kinds = "; ".join(f"rank {c.rank}: {c.device}" for c in called)
        return (f"Give the collective tensors on the tpu device on every rank ({kinds}): move them with "
                ".to(\"tpu\") before the call.")
    if cause == "late":
        wait = f" within {timeout:g} s" if timeout is not None else ""
        return (
            f"{_ranks(others)} did not call collective #{seq}{wait}. It is either stuck elsewhere (a "
            "branch on the rank sent it to another collective, of this group or of another group that "
            "waits for this rank, or into a loop) or only slow (rank-0-only evaluation or checkpointing): "
            "if it is only slow, raise TPU_DEBUG_COLLECTIVE_TIMEOUT; otherwise `py-spy dump --pid` on it "
            "shows where it is."
        )
    sites = "; ".join(f"rank {c.rank} called {c.call_text()}" for c in called)
    return (
        f"Every rank of a group must call the same collectives in the same order ({sites}): make the "
        "branch that chose between them the same on every rank (a condition on the rank, or on data that "
        "differs per rank), or move the collectives out of it."
    )


def rank_line(call: RankCall, seq: int, *, timeout: float | None = None) -> str:
    """One rank's part of :func:`describe`: what it did at collective ``seq``, and where."""
    if call.state == "called":
        return f"rank {call.rank}: {call.call_text()}"
    last = (f"its last collective of the group was #{call.seq} {call.call_text()}"
            if call.seq is not None else "it called no collective of the group")
    if call.state == "died":
        return f"rank {call.rank}: died (its process is gone); {last}"
    if call.state == "ended":
        return f"rank {call.rank}: ended (its process left the group); {last}"
    wait = f" within {timeout:g} s" if timeout is not None else ""
    return f"rank {call.rank}: did not call collective #{seq}{wait}; {last}"


def describe(group: str, seq: int, reason: str, cause: str, calls: Sequence[RankCall], *,
             timeout: float | None = None) -> str:
    """The difference as text: which collective, what each rank did there and where, the
    cause and the fix.

    Example::

        group 0, collective #3: the ranks differ (missing)
          rank 0: allreduce([4]; float32, SUM) at train.py:20 in main
          rank 1: ended (its process left the group); its last collective of the group was #2 ...
        Cause: a collective only rank 0 calls (under `if rank == 0:`).
        Fix: rank 0 alone called collective #3 at train.py:20 in main: ...
    """
    lines = [f"group {group}, collective #{seq}: the ranks differ ({reason})"]
    lines += [f"  {rank_line(c, seq, timeout=timeout)}" for c in calls]
    lines.append(f"Cause: {CAUSES.get(cause, cause)}.")
    lines.append(f"Fix: {fix_for(cause, calls, seq, timeout=timeout)}")
    return "\n".join(lines)
