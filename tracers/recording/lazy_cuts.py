"""Where a lazy graph was cut: the user's cause and line of a materialization, read off the stack.

In lazy mode (``DEFER_AND_FUSE``) the runtime records ops and runs them as one
program when a value is needed. The runtime knows *how* the value was needed
(``MaterializeInfo.trigger``: ``"read"``, ``"optimizer_step"``, ...); the user's
*cause* and line come from the stack at that moment, as for transfers
(``transfer_sites.classify``: a read under ``loss.item()`` is ``"item"``, under
``if t:`` ``"bool"``, inside ``print(t)`` ``"print"``). What the causes are called,
and how a run's graphs were cut, is read back by ``tracers/reading/lazy_graphs.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import CodeType, FrameType

from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording.transfer_sites import classify, frame_kind

__all__ = ["StepFrames", "cut_site"]

# runtime triggers that are not host reads: their cause is the trigger itself
_OWN = ("synchronize", "optimizer_step", "size_limit", "mode_change")

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
        if frame_kind(frame.f_code) == "user":
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


