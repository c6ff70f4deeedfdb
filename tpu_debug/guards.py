"""Guards for CI and for finding hidden costs: no recompiles here, no (implicit) transfers here.

- :func:`expect_no_recompiles` raises :class:`~tpu_debug.core.errors.RecompileError`
  on the first recompile inside it (an op or graph compiled again with a new
  key), with the diff against the closest earlier key in the message;
  ``trace(fail_on_recompile=True)`` and ``tpu-debug run --fail-on-recompile``
  do the same for a whole trace once it is past warm-up. Neither counts warm-up
  (see :class:`_RecompileGuard`): the keys an op or graph gets in the step it
  first runs in (one per layer's shape), and for a trace, the steps of each
  phase until one compiles nothing new.
- :func:`transfer_guard` logs or refuses host<->device transfers, like
  ``jax.transfer_guard``: ``"allow"``, ``"log"`` (a warning naming the line)
  or ``"disallow"`` (:class:`~tpu_debug.core.errors.TransferGuardError` before the
  copy happens). ``implicit_only=True`` applies the level to transfers nobody
  asked for (``.item()``, ``print``, ``if t:``, CPU fallbacks) and lets
  ``.cpu()``/``.to()`` through. ``trace(transfer_guard=...,
  transfer_guard_implicit=...)`` set both for a trace.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Self

from tpu_debug.trace_config import _guard_level as check_level
from tpu_debug.core.errors import RecompileError, TransferGuardError
from tpu_debug.runtime import probes
from tpu_debug.core.records import CompileInfo
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording.recompile_tracker import RecompileTracker
from tpu_debug.tracers.reading.recompile_analysis import explain
from tpu_debug.tracers.recording.step_tracker import StepTracker, current_tracker
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT
from tpu_debug.tracers.recording.transfer_sites import classify

__all__ = ["TRANSFER_GUARD_LEVELS", "TraceGuards", "expect_no_recompiles", "transfer_guard"]

TRANSFER_GUARD_LEVELS = ("allow", "log", "disallow")
_RANK = {level: i for i, level in enumerate(TRANSFER_GUARD_LEVELS)}
_log = logging.getLogger("tpu_debug.transfers")
_DIRECTIONS = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device"}


# ---------------------------------------------------------------------------------
# Recompiles
# ---------------------------------------------------------------------------------


class _StepCount:
    """Counts the program's step ends for a recompile guard as the run's step tracker cuts
    them: the active trace's (``optimizer.step()`` of an optimizer of ``tpu`` parameters, or
    ``tpu_debug.step()``), else a tracker of the guard's own that records nothing."""

    def __init__(self, on_step: Callable[[], None]) -> None:
        self._on_step = on_step
        self._tracker: StepTracker | None = None
        self._own: StepTracker | None = None

    def start(self) -> None:
        tracker = current_tracker()
        if tracker is None:
            tracker = self._own = StepTracker(_discard, itertools.count().__next__, time.perf_counter)
            tracker.start(current=False)
        self._tracker = tracker
        tracker.add_listener(self._stepped)

    def stop(self) -> None:
        if self._tracker is not None:
            self._tracker.remove_listener(self._stepped)
            self._tracker = None
        if self._own is not None:
            self._own.close()
            self._own = None

    def _stepped(self, _step: Any) -> None:
        self._on_step()


def _discard(_event: Any) -> None:
    """Where a guard's own step tracker writes its steps: the guard only counts them."""


class _RecompileGuard:
    """A probe that raises on the first recompile that is not warm-up (it learns earlier
    keys by replay).

    Warm-up, for a guard: a compile is of an op or graph (its identity) and a step is
    what the run counts as one (``optimizer.step()``, ``tpu_debug.step()``). A new
    key of an identity first compiled in the current step is warm-up (one op
    compiled for each layer's shape). With ``warm=True`` (a whole trace), the steps
    of a phase are warm-up too until the end of the first step that compiles no
    identity it had not seen (that step repeats earlier steps' programs); a step
    that compiles a new identity (a new optimizer, an evaluation loop) opens a
    phase again. Any other new key (an identity compiled in an earlier step, or
    before the guard began) is a recompile.
    """

    def __init__(self, where: str, *, warm: bool = False) -> None:
        self.where = where
        self.tracker = RecompileTracker()
        self.step = 0
        self._first: dict[str, int] = {}  # identity -> the step it was first compiled in
        self._phases = warm  # a phase's first steps are warm-up
        self._warm = warm  # in a phase's warm-up steps
        self._opens = warm  # the current step compiled an identity it had not seen
        self._steps = _StepCount(self.on_step)

    def start(self) -> None:
        self._steps.start()

    def stop(self) -> None:
        self._steps.stop()

    def on_step(self) -> None:
        """A step ended."""
        if self._warm and not self._opens:
            self._warm = False
        self._opens = False
        self.step += 1

    def on_compile(self, info: CompileInfo) -> None:
        seen = self.tracker.observe(info)
        if info.replayed:  # compiled before the guard began
            self._first.setdefault(seen.identity, -1)
            return
        first = self._first.setdefault(seen.identity, self.step)
        if first == self.step and not seen.recompile:
            self._opens = True
            self._warm = self._phases
        # a program read back from the persistent compile cache is a new program for this op as much
        # as a compiled one: the guard's verdict does not depend on what an earlier run cached
        if not seen.recompile or first == self.step or self._warm:
            return
        text = explain(seen.identity, seen.diffs, location=user_location(1), compiles=seen.compiles)
        raise RecompileError(
            f"{text}\n{self.where} forbids recompiles here: make the changing input constant "
            "(pad or bucket shapes, hoist Python scalars into tensors), or compile it before this block."
        )


class expect_no_recompiles(contextlib.ContextDecorator):
    """Raise on the first recompile inside the block (or decorated function).

    A first compile of an op or graph is fine (warm-up), and so is each key it
    gets in the step it first runs in (one op compiled for each layer's shape);
    compiling it again for a new key in a later step, or when it was compiled
    before the block, is not. Steps end at ``optimizer.step()`` (with an active
    trace, where the trace ends them: ``tpu_debug.step()`` too); a block without
    steps is one step. Warm the program up before the block (one step) so the
    block holds only steady state. Works with or without an active trace.

    Raises:
        RecompileError: (inside the block) something recompiled; the message
            says what changed, e.g. ``arg 0 'self': f32[8,128] -> f32[9,128]``.

    Example::

        step(batch)                      # warm-up compiles
        with tpu_debug.expect_no_recompiles():
            for batch in loader:
                step(batch)
    """

    def __init__(self) -> None:
        self._guard: _RecompileGuard | None = None

    def _recreate_cm(self) -> expect_no_recompiles:
        return expect_no_recompiles()

    def __enter__(self) -> Self:
        self._guard = _RecompileGuard("expect_no_recompiles()")
        dynamo_events.subscribe(self._guard)  # dynamo's guard failures make the message say why
        probes.subscribe(self._guard, replay=True)
        self._guard.start()
        return self

    def __exit__(self, *exc: object) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.stop()
            probes.unsubscribe(guard)
            dynamo_events.unsubscribe(guard)


# ---------------------------------------------------------------------------------
# Transfers
# ---------------------------------------------------------------------------------


class _TransferCheck:
    """A runtime transfer check applying one level to all transfers and one to implicit ones."""

    def __init__(self, level: str, implicit: str, names: tuple[str, str]) -> None:
        self.level, self.implicit = level, implicit
        self.names = names  # how the user set each level, for the message

    def __call__(self, direction: str, op: str, shape: tuple, dtype: str, nbytes: int) -> None:
        cause, implicit, location = classify(op, 1)
        level, name = self.level, self.names[0]
        if implicit and _RANK[self.implicit] > _RANK[level]:
            level, name = self.implicit, self.names[1]
        if level == "allow":
            return
        kind = "implicit" if implicit else "explicit"
        what = CAUSE_TEXT.get(cause, cause)
        aval = f"{dtype}[{','.join(map(str, shape))}]"
        where = f" at {location}" if location is not None else ""
        text = (
            f"{kind} {_DIRECTIONS.get(direction, direction)} transfer of {aval} ({nbytes} bytes) "
            f"by {what}{where}"
        )
        if level == "log":
            _log.warning("tpu_debug: %s (%s='log')", text, name)
            return
        fix = (
            "keep the value on the device, or read it once outside the hot loop"
            if implicit
            else "move the data once, outside the guarded code"
        )
        raise TransferGuardError(
            f"{text} is disallowed ({name}='disallow'). To fix: {fix}; or set {name}='log'."
        )


@contextlib.contextmanager
def transfer_guard(level: str, *, implicit_only: bool = False):
    """Log or refuse host<->device transfers inside the block, like ``jax.transfer_guard``.

    Args:
        level: ``"allow"``, ``"log"`` or ``"disallow"``.
        implicit_only: apply ``level`` only to transfers nobody asked for
            (``.item()``, ``print``, ``if t:``, CPU fallbacks).

    Raises:
        ConfigError: ``level`` is not a level.
        TransferGuardError: (inside the block) a disallowed transfer.

    Example::

        with tpu_debug.transfer_guard("disallow", implicit_only=True):
            loss = step(batch)          # fine
            print(loss.item())          # TransferGuardError naming this line
    """
    check_level("transfer_guard", level)
    if implicit_only:
        check = _TransferCheck("allow", level, ("transfer_guard", "transfer_guard(implicit_only=True)"))
    else:
        check = _TransferCheck(level, "allow", ("transfer_guard", "transfer_guard"))
    probes.add_transfer_check(check)
    try:
        yield
    finally:
        probes.remove_transfer_check(check)


# ---------------------------------------------------------------------------------
# What a trace installs (tpu_debug/tracing.py)
# ---------------------------------------------------------------------------------


class TraceGuards:
    """What a trace adds for recompiles and transfers: dynamo's events into the run, the
    recompile guard (``fail_on_recompile``) and the transfer guards. ``start()`` after the
    recorder subscribes, ``stop()`` before it unsubscribes."""

    def __init__(self, config: Any, writer: Any, recorder: Any) -> None:
        self.config = config
        self._dynamo = dynamo_events.DynamoRecorder(writer, recorder.clock, recorder.record_error)
        self._recompile: _RecompileGuard | None = None
        self._transfer: _TransferCheck | None = None

    def start(self) -> None:
        dynamo_events.subscribe(self._dynamo)
        if self.config.fail_on_recompile:
            self._recompile = _RecompileGuard("trace(fail_on_recompile=True)", warm=True)
            probes.subscribe(self._recompile, replay=True)
            self._recompile.start()
        level, implicit = self.config.transfer_guard, self.config.transfer_guard_implicit
        if level != "allow" or implicit != "allow":
            self._transfer = _TransferCheck(level, implicit, ("transfer_guard", "transfer_guard_implicit"))
            probes.add_transfer_check(self._transfer)

    def stop(self) -> None:
        if self._transfer is not None:
            probes.remove_transfer_check(self._transfer)
            self._transfer = None
        if self._recompile is not None:
            self._recompile.stop()
            probes.unsubscribe(self._recompile)
            self._recompile = None
        dynamo_events.unsubscribe(self._dynamo)
