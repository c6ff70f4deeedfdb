"""When the ranks of a c10d group stop calling the same collectives: the difference, its
cause and its fix, as data and as one text.

c10d pairs a group's collectives by their order: the n-th collective of one rank runs
with the n-th of every other. A rank that calls another collective there, with other
sizes, another dtype or reduction, or none at all, makes the group hang or mix data.
Two readers see it: the live check of the `tpu` process group
(``runtime/distributed/c10d/live_check.py``, before a collective enters gloo) and the reader of
recorded ``collective_call`` events (``tracers/reading/collective_calls.py``, after a job was
killed). Both describe what each rank did with :class:`RankCall` and tell it through
:func:`describe`, so the error a rank raises, the finding in its run and the
after-the-fact analysis say the same thing.

Plain data and text: this module imports neither torch nor jax.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import signal
from collections.abc import Iterable, Sequence

from tpu_debug.core.collective_kinds import RECEIVES, ROOTED, SAME_SHAPES, SENDS
from tpu_debug.core.format import format_location

__all__ = [
    "CAUSES",
    "REASONS",
    "RankCall",
    "cause_of",
    "describe",
    "describe_exit",
    "differ",
    "fix_for",
    "left_loop",
    "p2p_subject",
    "rank_line",
    "shape_texts",
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
    "raised": "a rank raised an exception and left the group",
    "late": "a rank did not arrive: it is still running elsewhere",
    "p2p_sizes": "a send and its receive of other sizes or dtypes",
    "p2p_order": "point-to-point calls that wait for each other: each rank receives before it sends",
    "unmatched": "a send or receive its peer never posts: the peers' point-to-point calls differ in number or "
                 "order",
}

# what a rank that did not call the collective was doing instead
_STATES = ("called", "missing", "ended", "raised", "died")


def shape_texts(shapes: Iterable[Iterable[int]]) -> tuple[str, ...]:
    """How a call's tensor shapes are written and compared across ranks: ``("[4, 2]", "[3]")``."""
    return tuple(str(list(s)) for s in shapes)


@dataclasses.dataclass(frozen=True, slots=True)
class RankCall:
    """What one rank (``rank``, global) did at a group's collective.

    With ``state == "called"`` the fields describe the collective it called there.
    Otherwise it did not call it: ``"missing"`` (it did not arrive: still alive, or its
    calls simply end there), ``"ended"`` (its process left), ``"raised"`` (its process left
    with an exception: ``error``, and ``stack`` ends at the line that raised), ``"died"``
    (its process is gone without leaving: ``exit_status`` as ``subprocess`` gives it, the
    exit code or minus the signal, when known); the fields then describe the last
    collective of the group it did call (``seq`` None: none known). ``stack`` of a
    ``"missing"`` rank is where it is now (``file:line in function``, innermost last).
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
    error: str = ""
    stack: tuple[str, ...] = ()
    exit_status: int | None = None

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
        # a point-to-point call's line names its peer: the pair is compared, not the group
        toward = "to" if self.op in SENDS else "from" if self.op in RECEIVES else None
        peer = f" {toward} rank {self.peer}" if toward is not None and self.peer is not None else ""
        return f"{self.op}({shapes}; {self.dtype or '-'}{extra}){peer}{on}{where}"


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


def cause_of(reason: str, calls: Sequence[RankCall], *, repeated: bool = False, p2p: bool = False,
             cycle: bool = False) -> str:
    """The likeliest cause (a key of :data:`CAUSES`) of a difference.

    Args:
        reason: what differs (:func:`differ`).
        calls: each rank's call there.
        repeated: the line the calling ranks are at ran before with every rank agreeing
            (the collective sits in a loop).
        p2p: the calls are a send and its receive.
        cycle: (``p2p``) the peer that did not post its side waits itself to receive from
            this rank.
    """
    called = [c for c in calls if c.state == "called"]
    others = [c for c in calls if c.state != "called"]
    if any(c.state == "died" for c in others):
        return "died"
    if any(c.state == "raised" for c in others):
        return "raised"
    if p2p:
        if reason != "missing":
            return "p2p_sizes"
        if cycle:
            return "p2p_order"
        return "late" if any(c.state == "missing" for c in others) else "unmatched"
    if reason == "missing":
        sites = {c.where for c in called}
        for c in others:
            if c.stack and c.state == "missing":
                if _left_the_loop_of(called, c):
                    return "uneven_batch"  # still running, past the end of the loop the others are in
            elif c.where is not None and c.where in sites:
                # its last call was this line: its loop ran once fewer, then it ended (or, read
                # after the fact with nothing known of where it went, it stopped there)
                return "uneven_batch"
        if any(c.state == "missing" for c in others) and not all(c.seq is None for c in others):
            return "late"
        ranks = sorted(c.rank for c in calls)
        return "rank_zero" if [c.rank for c in called] == ranks[:1] else "branch"
    if reason in ("dtype", "device"):
        return reason
    if len({(c.file, c.line) for c in called}) > 1:
        # the ranks are at different lines: a rank whose loop ended early is past the loop
        # the others are still in; otherwise each took its own way there
        if any(_left_the_loop_of([a], b) for a in called for b in called if a is not b):
            return "uneven_batch"
        return "branch"
    if reason == "shapes":
        return "uneven_batch" if repeated and len({c.where for c in calls}) == 1 else "sizes"
    return "branch"


def _site(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) of a ``file:line in function`` stack entry."""
    where, _, function = text.partition(" in ")
    file, _, line = where.rpartition(":")
    return (file, int(line), function) if file and line.isdigit() else None


def _left_the_loop_of(called: Sequence[RankCall], other: RankCall) -> bool:
    """Whether ``other`` is past the end of the loop the ``called`` ranks' line is in: at its
    call when it called one, else where its stack says it is now."""
    if other.state == "called":
        here = (other.file, other.line, other.function) if other.file and other.line else None
    else:
        here = _site(other.stack[-1]) if other.stack else None
    if here is None:
        return False
    return any(c.file and c.line and left_loop(c.file, c.line, c.function or "", *here) for c in called)


_loops: dict[tuple[str, float], list[tuple[int, int]]] = {}


def _loop_spans(file: str) -> list[tuple[int, int]]:
    """The (first, last) lines of every ``for``/``while`` loop of a source file (none when it
    cannot be read or parsed)."""
    try:
        key = (file, os.path.getmtime(file))
    except OSError:
        return []
    if key not in _loops:
        try:
            with open(file, encoding="utf-8") as f:
                tree = ast.parse(f.read(), file)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            tree = None
        loops = (ast.For, ast.AsyncFor, ast.While)
        _loops[key] = [] if tree is None else [
            (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, loops)]
    return _loops[key]


def left_loop(file: str, line: int, function: str, other_file: str, other_line: int, other_function: str) -> bool:
    """Whether ``other_line`` is after the end of the innermost loop around ``line`` in one
    function of one file: a rank there ran that loop fewer times than a rank still at ``line``
    (an uneven last batch), rather than taking another branch inside it."""
    if other_file != file or other_function != function:
        return False
    around = [(first, last) for first, last in _loop_spans(file) if first <= line <= last]
    if not around:
        return False
    _, last = min(around, key=lambda span: span[1] - span[0])
    return other_line > last


def _ranks(calls: Sequence[RankCall]) -> str:
    ranks = [str(c.rank) for c in calls]
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(ranks)


def describe_exit(status: int | None) -> str:
    """``killed by signal 9 (SIGKILL)``, ``exit status 3``, or ``exit status unknown``."""
    if status is None:
        return "exit status unknown"
    if status < 0:
        try:
            return f"killed by signal {-status} ({signal.Signals(-status).name})"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _why_died(status: int | None) -> str:
    if status == -signal.SIGKILL:
        return ("SIGKILL is what the kernel's out-of-memory killer sends (`dmesg` names the process), and what a "
                "scheduler or a `kill -9` sends")
    if status is not None and status < 0:
        return "a signal ended it: a crash in native code (its output holds the fault), or a signal sent to it"
    if status is not None:
        return ("it exited without running its exit handlers (os._exit, or an abort in native code): its output "
                "says why")
    return "its own output or the launcher's says why (out of memory, a signal, a crash)"


def fix_for(cause: str, calls: Sequence[RankCall], seq: int, *, timeout: float | None = None,
            what: str | None = None) -> str:
    """What to do about a difference of ``cause`` at collective ``seq`` (or the call ``what``
    names), naming the ranks and lines."""
    called = [c for c in calls if c.state == "called"]
    others = [c for c in calls if c.state != "called"]
    what = what or f"collective #{seq}"
    if cause == "died":
        dead = [c for c in others if c.state == "died"]
        return (
            f"{_ranks(dead)} died ({describe_exit(dead[0].exit_status)}): {_why_died(dead[0].exit_status)}. The "
            "group cannot go on without it: restart the job from its last checkpoint (torchrun --max-restarts "
            "restarts every rank)."
        )
    if cause == "raised":
        r = next(c for c in others if c.state == "raised")
        at = f" at {r.stack[-1]}" if r.stack else ""
        return (
            f"rank {r.rank} raised {r.error or 'an exception'}{at} and left, while the other ranks waited for it "
            f"at {what}: fix that error (rank {r.rank}'s output holds its traceback)."
        )
    if cause == "rank_zero":
        site = called[0].where or "its line"
        return (
            f"{_ranks(called)} alone called {what} at {site}: a collective under `if rank == 0:` "
            "(a metric, logging, saving) waits for ranks that never call it. Call it on every rank of the "
            "group and use its result on rank 0 only, or do rank 0's work without a collective."
        )
    if cause == "uneven_batch":
        return (
            "Give every rank the same number of batches, of the same sizes: "
            "DistributedSampler(dataset, drop_last=True) or DataLoader(..., drop_last=True), or pad the last "
            "batch; DDP's `with model.join():` lets ranks with fewer batches finish."
        )
    if cause in _FIXES:
        return _FIXES[cause](called, others, what, timeout)
    sites = "; ".join(f"rank {c.rank} called {c.call_text()}" for c in called)
    return (
        f"Every rank of a group must call the same collectives in the same order ({sites}): make the "
        "branch that chose between them the same on every rank (a condition on the rank, or on data that "
        "differs per rank), or move the collectives out of it."
    )


def _fix_sizes(called: Sequence[RankCall], others: Sequence[RankCall], what: str, timeout: float | None) -> str:
    return (
        "Give the collective tensors of the same size on every rank: the size depends on the rank there. "
        "Pad to a common size, or use all_to_all_single with split sizes (or all_gather_object) for "
        "uneven pieces."
    )


def _fix_dtype(called: Sequence[RankCall], others: Sequence[RankCall], what: str, timeout: float | None) -> str:
    return "Give the collective tensors of one dtype on every rank: cast before the call (.to(dtype))."


def _fix_device(called: Sequence[RankCall], others: Sequence[RankCall], what: str, timeout: float | None) -> str:
    kinds = "; ".join(f"rank {c.rank}: {c.device}" for c in called)
    return (f"Give the collective tensors on the tpu device on every rank ({kinds}): move them with "
            ".to(\"tpu\") before the call.")


def _fix_late(called: Sequence[RankCall], others: Sequence[RankCall], what: str, timeout: float | None) -> str:
    wait = f" within {timeout:g} s" if timeout is not None else ""
    late = [c for c in others if c.state == "missing"] or list(others)
    where = f", at {late[0].stack[-1]}" if late and late[0].stack else ""
    return (
        f"{_ranks(late)} did not call {what}{wait} and is still running{where}. If it is only slow there "
        "(evaluation, a checkpoint written on one rank), raise TPU_DEBUG_COLLECTIVE_TIMEOUT; if it waits in "
        "another collective, the ranks call the collectives of their groups in other orders: make every rank "
        "call them in the same order."
    )


def _fix_p2p_sizes(called: Sequence[RankCall], others: Sequence[RankCall], what: str,
                   timeout: float | None) -> str:
    sites = "; ".join(f"rank {c.rank} {c.call_text()}" for c in called)
    return (f"Receive into a tensor of the sent tensor's shape and dtype ({sites}); for a shape that changes, "
            "send the shape first (dist.send_object_list) or pad to a fixed one.")


def _fix_p2p_order(called: Sequence[RankCall], others: Sequence[RankCall], what: str,
                   timeout: float | None) -> str:
    return (
        "Each rank waits to receive before it sends, so neither sends: post the sends and receives together "
        "(dist.batch_isend_irecv([P2POp(dist.isend, ...), P2POp(dist.irecv, ...)]), or isend and irecv, then "
        "wait() on both), or have one side send first (even ranks send, odd ranks receive)."
    )


def _fix_unmatched(called: Sequence[RankCall], others: Sequence[RankCall], what: str,
                   timeout: float | None) -> str:
    return (f"{_ranks(others)} left without posting its side of {what}: every send needs the peer's recv with "
            "the same tag, in the same order, and every recv a send.")


_FIXES = {
    "sizes": _fix_sizes,
    "dtype": _fix_dtype,
    "device": _fix_device,
    "late": _fix_late,
    "p2p_sizes": _fix_p2p_sizes,
    "p2p_order": _fix_p2p_order,
    "unmatched": _fix_unmatched,
}


def rank_line(call: RankCall, seq: int, *, timeout: float | None = None, what: str | None = None) -> str:
    """One rank's part of :func:`describe`: what it did at collective ``seq`` (or the call
    ``what`` names), and where."""
    if call.state == "called":
        return f"rank {call.rank}: {call.call_text()}"
    what = what or f"collective #{seq}"
    if what.startswith("collective"):
        last = (f"its last collective of the group was #{call.seq} {call.call_text()}"
                if call.seq is not None else "it called no collective of the group")
    else:
        last = f"its last call was {call.call_text()}" if call.op is not None else "it made no such call"
    if call.state == "died":
        return f"rank {call.rank}: died ({describe_exit(call.exit_status)}); {last}"
    if call.state == "raised":
        at = f" at {call.stack[-1]}" if call.stack else ""
        return f"rank {call.rank}: raised {call.error or 'an exception'}{at} and left the group; {last}"
    if call.state == "ended":
        return f"rank {call.rank}: ended (its process left the group); {last}"
    wait = f" within {timeout:g} s" if timeout is not None else ""
    now = f"; it is still running, now at {' <- '.join(reversed(call.stack))}" if call.stack else ""
    return f"rank {call.rank}: did not call {what}{wait}; {last}{now}"


def p2p_subject(source: int, destination: int, tag: int, n: int) -> str:
    """How the text names a send and its receive: the ``n``-th call from ``source`` to
    ``destination`` with ``tag`` (global ranks)."""
    return f"point-to-point #{n} from rank {source} to rank {destination}" + (f" (tag {tag})" if tag else "")


def describe(group: str, seq: int, reason: str, cause: str, calls: Sequence[RankCall], *,
             timeout: float | None = None, what: str | None = None) -> str:
    """The difference as text: which collective (or the call ``what`` names: a send and its
    receive), what each rank did there and where, the cause and the fix.

    Example::

        group 0, collective #3: the ranks differ (missing)
          rank 0: allreduce([4]; float32, SUM) at train.py:20 in main
          rank 1: ended (its process left the group); its last collective of the group was #2 ...
        Cause: a collective only rank 0 calls (under `if rank == 0:`).
        Fix: rank 0 alone called collective #3 at train.py:20 in main: ...
    """
    lines = [f"group {group}, {what or f'collective #{seq}'}: the ranks differ ({reason})"]
    lines += [f"  {rank_line(c, seq, timeout=timeout, what=what)}" for c in calls]
    lines.append(f"Cause: {CAUSES.get(cause, cause)}.")
    lines.append(f"Fix: {fix_for(cause, calls, seq, timeout=timeout, what=what)}")
    return "\n".join(lines)
