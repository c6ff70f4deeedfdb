"""The probe that turns the runtime's notifications into run-store events.

One object is subscribed per trace (``runtime.probes.subscribe``). Its hot
method is ``on_execute``, called for every eager op: it only bumps a counter
and a time total for the executable, unless per-execution events were asked
for. Compiles, transfers and fallbacks are rare and get a full event with the
user's source line; compiles also get their program's HLO (stored once per
content hash).
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

from tpu_debug.tracers.events import (
    ArgInfo,
    CompileEvent,
    FallbackEvent,
    InternalErrorEvent,
    OpEvent,
    TransferEvent,
)
from tpu_debug.tracers.hlo import make_program, program_hash
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recompiles import RecompileTracker
from tpu_debug.tracers.transfers import IMPLICIT, classify
from tpu_debug.tracers.store import RunWriter, StatRow

__all__ = ["Recorder", "IMPLICIT_TRANSFER_OPS"]

# transfers nobody asked for: a sync to read a value, a scalar operand, a CPU fallback
IMPLICIT_TRANSFER_OPS = IMPLICIT  # issue 5: see tracers/transfers.py

# frames between the runtime's call site and the probe method: emit() + the method
_PROBE_DEPTH = 3


class _Stat:
    __slots__ = ("id", "mode", "name", "signature", "program", "count", "seconds", "written")

    def __init__(self, id: int, mode: str, name: str, signature: str, program: str | None) -> None:
        self.id = id
        self.mode = mode
        self.name = name
        self.signature = signature
        self.program = program
        self.count = 0
        self.seconds = 0.0
        self.written = 0


def _arg_info(spec: Any) -> ArgInfo:
    shape = getattr(spec, "shape", None)
    if shape is not None:
        return ArgInfo(str(spec.name), tuple(int(d) for d in shape), str(spec.dtype), None)
    return ArgInfo(str(spec.name), None, None, repr(getattr(spec, "static", None)))


class Recorder:
    """Records what the runtime reports into a :class:`RunWriter`.

    Args:
        writer: where events go.
        hlo: record each compiled program's StableHLO and optimized HLO.
        op_events: record one event per op execution (otherwise executions are
            only counted and timed per executable).
    """

    def __init__(self, writer: RunWriter, *, hlo: bool = True, op_events: bool = False) -> None:
        self.writer = writer
        self.hlo = hlo
        self.op_events = op_events
        self._t0 = time.perf_counter()
        self._stats: dict[Any, _Stat] = {}
        self._keys: dict[Any, tuple[str, str | None]] = {}
        self._latest: dict[tuple[str, str], tuple[str, str | None]] = {}
        self._stat_ids = 0
        self._lock = threading.Lock()
        self.recompiles = RecompileTracker()  # issue 5: first compile or recompile, and why
        writer.set_stats_source(self.snapshot)

    def clock(self) -> float:
        """Seconds since the recorder started (the run's timestamps)."""
        return time.perf_counter() - self._t0

    # -- probe methods ------------------------------------------------------------------

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        stat = self._stats.get(key)
        if stat is None:
            stat = self._new_stat(mode, name, key)
        stat.count += 1
        stat.seconds += seconds
        if self.op_events:
            self.writer.put(
                OpEvent(
                    self.writer.new_id(),
                    self.clock() - seconds,
                    mode,
                    threading.get_native_id(),
                    user_location(_PROBE_DEPTH),
                    name,
                    seconds,
                    stat.program,
                )
            )

    def on_compile(self, info: Any) -> None:
        ts = self.clock() - float(info.seconds)
        location = user_location(_PROBE_DEPTH)
        seen = self.recompiles.observe(info)  # issue 5 (a replayed compile only becomes history)
        args = tuple(_arg_info(a) for a in seen.args)
        signature = f"{info.name}({', '.join(a.render() for a in args)})"
        program = None
        if self.hlo:
            stablehlo, hlo = info.stablehlo(), info.hlo()
            program = program_hash(stablehlo, hlo)
            if not self.writer.has_program(program):
                fx_nodes = (info.extra or {}).get("fx_nodes") or ()
                self.writer.add_program(
                    make_program(info.mode, str(info.name), stablehlo, hlo, fx_nodes, content_hash=program)
                )
        self._keys[info.key] = self._latest[(info.mode, str(info.name))] = (signature, program)
        stat = self._stats.get(info.key)
        if stat is not None:  # executed before its compile was seen (a recompile of the same key)
            stat.signature, stat.program = signature, program
        if (info.extra or {}).get("replayed"):
            return  # compiled before this trace began: known program, not a compile of this run
        event_id = self.writer.new_id()
        seen.bind(event_id)
        self.writer.put(
            CompileEvent(
                event_id,
                ts,
                info.mode,
                threading.get_native_id(),
                location,
                str(info.name),
                signature,
                args,
                float(info.seconds),
                program,
                seen.previous_event,
                seen.diffs,
                seen.identity,
            )
        )

    def on_transfer(self, info: Any) -> None:
        # issue 5: what the user did that moved data (.item(), print, if t:, ...), and where
        op, implicit, location = classify(str(info.op))
        self.writer.put(
            TransferEvent(
                self.writer.new_id(),
                self.clock() - float(info.seconds),
                None,
                threading.get_native_id(),
                location,
                str(info.direction),
                int(info.nbytes),
                tuple(int(d) for d in info.shape),
                str(info.dtype),
                op,
                implicit,
                float(info.seconds),
            )
        )

    def on_fallback(self, info: Any) -> None:
        self.writer.put(
            FallbackEvent(
                self.writer.new_id(),
                self.clock() - float(info.seconds),
                "eager",
                threading.get_native_id(),
                user_location(_PROBE_DEPTH),
                str(info.op),
                tuple(_arg_info(a) for a in info.args),
                float(info.seconds),
            )
        )

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.record_error(f"{type(self).__name__}.{method}", text)

    # -- helpers ------------------------------------------------------------------------

    def record_error(self, where: str, message: str) -> None:
        """Keep a tracer failure in the run (the report lists them)."""
        self.writer.put(
            InternalErrorEvent(
                self.writer.new_id(), self.clock(), None, threading.get_native_id(), None, where, message
            )
        )

    def _new_stat(self, mode: str, name: str, key: Any) -> _Stat:
        with self._lock:
            stat = self._stats.get(key)
            if stat is None:
                # compiled mode passes on_execute a shorter key than on_compile (input
                # signature only): fall back to the latest compile of the same graph
                known = self._keys.get(key) or self._latest.get((mode, str(name)))
                signature, program = known if known is not None else (f"{name}(...)", None)
                self._stat_ids += 1
                stat = _Stat(self._stat_ids, mode, str(name), signature, program)
                self._stats[key] = stat
        return stat

    def snapshot(self) -> list[StatRow]:
        """The per-executable counters changed since the last call (the writer stores them)."""
        out: list[StatRow] = []
        for stat in list(self._stats.values()):
            n = stat.count
            if n != stat.written:
                out.append((stat.id, stat.mode, stat.name, stat.signature, stat.program, n, stat.seconds))
                stat.written = n
        return out
