"""Calling tracer hooks so that a tracer never breaks the traced program.

The runtime's probes (:mod:`tpu_debug.runtime.probes`) and dynamo's listeners
(:mod:`tpu_debug.tracers.recording.dynamo_events`) call tracer methods from inside the
user's program. :func:`deliver` is the one loop that does it: a hook that
raises is recorded in an :class:`ErrorLog` and handed to its owner's
``on_internal_error(method, exc)``; the program goes on. An error marked
``stops_program`` (a guard such as ``expect_no_recompiles`` tripping on
purpose) is the exception: it propagates to the user.

An :class:`ErrorLog` keeps the first ``limit`` failures as text (type,
message, where) and counts the rest. It never keeps the exception: its
traceback holds the frames of the failing call, and with them the tensors
they reference, so a tracer that raises on every op of a long run would
otherwise hold memory without bound.

This module imports neither torch nor jax, nor the runtime: the reading verbs
of the CLI import the tracers without them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["DEFAULT_LIMIT", "ErrorLog", "HookError", "Route", "deliver", "report_failure"]

# failures kept with their text per log; later ones are only counted
DEFAULT_LIMIT = 100

# (owner, method name, bound method): one subscriber of one notification
Route = tuple[tuple[Any, str, Any], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class HookError:
    """A tracer hook that raised.

    ``where`` names the hook (``"Recorder.on_transfer"``), ``type`` and
    ``message`` the exception, ``raised_at`` the innermost line of its
    traceback (``"recorder.py:158 in on_transfer"``).
    """

    where: str
    type: str
    message: str
    raised_at: str | None

    def __str__(self) -> str:
        at = f" (at {self.raised_at})" if self.raised_at else ""
        return f"{self.where}: {self.type}: {self.message}{at}"


def _raised_at(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"


class ErrorLog:
    """The failures of tracer hooks: the first ``limit`` as :class:`HookError`, and a count of all.

    Thread-safe (hooks run on whichever thread does device work). Iterating
    gives the kept errors, oldest first; ``count`` is how many were recorded.

    Example:
        >>> log = ErrorLog(limit=2)
        >>> for _ in range(5):
        ...     log.record("P.on_execute", ValueError("bad"))
        >>> len(log), log.count
        (2, 5)
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._kept: list[HookError] = []
        self._count = 0
        self._lock = threading.Lock()

    def record(self, where: str, exc: BaseException) -> None:
        """Count a failure of hook ``where``; keep its text while fewer than ``limit`` are kept."""
        with self._lock:
            self._count += 1
            if len(self._kept) >= self.limit:
                return
        error = HookError(where, type(exc).__qualname__, str(exc), _raised_at(exc))
        with self._lock:
            if len(self._kept) < self.limit:
                self._kept.append(error)

    @property
    def count(self) -> int:
        """Failures recorded, kept or not."""
        return self._count

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._count = 0

    def __iter__(self) -> Iterator[HookError]:
        return iter(list(self._kept))

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, index: int) -> HookError:
        return self._kept[index]

    def __bool__(self) -> bool:
        return self._count > 0

    def __repr__(self) -> str:
        return f"ErrorLog({len(self._kept)} kept of {self._count}, limit={self.limit})"


def report_failure(owner: Any, method: str, exc: BaseException, log: ErrorLog) -> None:
    """Record that ``owner.<method>`` raised ``exc`` and tell ``owner.on_internal_error`` if it has one."""
    log.record(f"{type(owner).__name__}.{method}", exc)
    handler = getattr(owner, "on_internal_error", None)
    if handler is not None:
        try:
            handler(method, exc)
        except Exception as exc2:  # noqa: BLE001 - a tracer must not break the program
            log.record(f"{type(owner).__name__}.on_internal_error", exc2)


def deliver(route: Route, args: tuple, log: ErrorLog) -> None:
    """Call every subscriber of ``route`` with ``args``; a subscriber's error is recorded, never raised.

    Raises:
        Exception: only an error with a true ``stops_program`` attribute (a guard
            that forbids what just happened), unchanged.
    """
    for owner, method, fn in route:
        try:
            fn(*args)
        except Exception as exc:  # a tracer must not break the program
            if getattr(exc, "stops_program", False):
                raise
            report_failure(owner, method, exc, log)
