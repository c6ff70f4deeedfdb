"""What a rank's process is doing, or how it stopped: the facts the live collective check
tells the other ranks of a group (``runtime/distributed/c10d/live_check.py``).

- how this process leaves its groups (:func:`leaving`): with an exception the interpreter
  printed (``sys.last_value``, which Python sets for an uncaught exception before the exit
  handlers run, and ``tpu-debug run`` sets as Python would), or normally;
- how a process of this host that is gone ended (:func:`exit_status`): the status its
  parent has not collected yet, read from ``/proc/<pid>/stat`` while it is a zombie;
- where a thread of this process is now (:func:`thread_stack`), for a rank the others
  wait for: its user frames, innermost last.

Frames are the user's: code under torch, jax, tpu_debug, the standard library or an
installed package is library code (:func:`is_library`).
"""

from __future__ import annotations

import os
import sys
import traceback
from types import CodeType, FrameType, TracebackType
from typing import Any

from tpu_debug.core.format import format_location
from tpu_debug.core.sources import library_roots

__all__ = ["exit_status", "is_library", "leaving", "thread_stack", "user_site", "user_stack"]

_verdicts: dict[CodeType, bool] = {}
#: frames of a stack kept for the other ranks: the innermost ones, which say where the rank is
STACK_FRAMES = 6


def is_library(code: CodeType) -> bool:
    """Whether ``code`` is library code (torch, jax, tpu_debug, the standard library, an
    installed package, code a library generated): decided once per code object."""
    verdict = _verdicts.get(code)
    if verdict is None:
        file = code.co_filename
        if file.startswith("<"):
            verdict = not file.startswith(("<stdin>", "<ipython-input-"))
        else:
            real = os.path.realpath(file)
            verdict = (any(real.startswith(r) for r in library_roots())
                       or f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real)
        _verdicts[code] = verdict
    return verdict


def user_site(depth: int = 1) -> tuple[str | None, int | None, str | None]:
    """(file, line, function) of the innermost frame of the user's code calling in."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None:
        if not is_library(frame.f_code):
            return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname
        frame = frame.f_back
    return None, None, None


def user_stack(frame: FrameType | None, limit: int = STACK_FRAMES) -> list[str]:
    """The user's frames from ``frame`` outwards, as ``file:line in function``, innermost
    last, at most ``limit`` (the innermost ones)."""
    out: list[str] = []
    while frame is not None and len(out) < limit:
        if not is_library(frame.f_code):
            out.append(format_location(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname))
        frame = frame.f_back
    return out[::-1]


def _traceback_stack(tb: TracebackType | None, limit: int = STACK_FRAMES) -> list[str]:
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(tb)]
    codes = []
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    user = [format_location(file, line, code.co_qualname) for (file, line, _), code in zip(frames, codes, strict=True)
            if not is_library(code)]
    return user[-limit:]


def thread_stack(ident: int | None) -> list[str]:
    """Where thread ``ident`` of this process is now (its user frames, innermost last); empty
    when it is gone."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    return user_stack(frame)


def leaving() -> dict[str, Any]:
    """How this process leaves its groups, for the ranks that wait for it: ``{"state":
    "raised", "error": "ValueError: ...", "stack": [...]}`` when an exception ended the
    program (its user frames, innermost last: the line that raised), else ``{"state":
    "ended"}``."""
    exc = getattr(sys, "last_value", None)
    if exc is None or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return {"state": "ended"}
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return {"state": "raised", "error": text[:300], "stack": _traceback_stack(exc.__traceback__)}


def exit_status(pid: int) -> int | None:
    """How process ``pid`` of this host ended, as ``subprocess`` returns it (the exit code, or
    minus the signal that killed it); None while it runs, or once its parent collected it
    (its ``/proc`` entry is gone then)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # fields from the state (field 3) on: the exit code is field 52 (Linux 3.5 on), a
    # waitpid() status
    if len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[49])
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
