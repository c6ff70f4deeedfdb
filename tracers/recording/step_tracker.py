"""The step tracker: where each training step begins and ends, and what ran in it.

A step ends when ``optimizer.step()`` returns for an optimizer holding ``tpu``
parameters, or at each explicit ``tpu_debug.step()`` (once one is made, only
explicit marks count). The tracker is the run's one source of steps: the other
tracers that work per step (memory, the TPU target's step estimates) listen to
its :class:`~tpu_debug.tracers.events.StepEvent` (:meth:`StepTracker.add_listener`)
instead of hooking the optimizer themselves, so every part of a report counts
the same steps, and an optimizer of CPU tensors (a reference run beside the
traced one) ends none. The tracker counts what runs in the current step (op
executions, compiles, transfers, fallbacks, and a hash of the executables in
order) and writes a :class:`~tpu_debug.tracers.events.StepEvent` when the step
ends. A run with neither gets its steps from the loop it ran: the tracker keeps
the sequence of ops executed (up to :data:`LOOP_WINDOW` of them) and, when the
trace ends, :func:`detect_loop` finds the longest stretch that repeats one block
of ops at least :data:`LOOP_MIN_ITERATIONS` times; each repetition becomes a step
(``detected="loop"``). Ops are compared by name, not by executable (a compiled
graph by the function it came from), so a loop whose shapes change every
iteration (a recompile storm) is still one loop.

Which steps are warm-up, and which step an event is in, are read back from the
recorded steps (``tracers/reading/step_phases.py``).
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from tpu_debug.runtime.lazy import hook_optimizers
from tpu_debug.core.post_import import when_imported
from tpu_debug.core.records import CollectiveDone, CollectiveInfo, CompileInfo, FallbackInfo, TransferInfo
from tpu_debug.runtime.probes import hidden_from_dynamo
from tpu_debug.tracers.events import StepEvent, WaitEvent
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording import step_hooks

__all__ = [
    "LOOP_MIN_ITERATIONS",
    "LOOP_WINDOW",
    "Loop",
    "StepTracker",
    "WAIT_PARTS",
    "current_tracker",
    "detect_loop",
    "steps_between",
]

# ops whose sequence is kept for finding a loop (names, executables, times: 24 bytes each)
LOOP_WINDOW = 262_144
# a block of ops must repeat this many times in a row to be taken for a loop's body
LOOP_MIN_ITERATIONS = 3
_MASK = (1 << 64) - 1
_MUL = 0x100000001B3  # FNV-1a's 64-bit prime: a hash of the executables run, in order
_SEED = 0xCBF29CE484222325
_perf_counter = time.perf_counter

# the tracker of the trace being recorded (one at a time): code that counts steps outside the
# trace's own wiring (the recompile guards) listens to it rather than cutting steps itself
_current: StepTracker | None = None


def current_tracker() -> StepTracker | None:
    """The active trace's tracker (see :meth:`StepTracker.start`), or None outside a trace."""
    return _current


# the parts of a step's time the tracker adds up beside its counts (see StepEvent): the waits,
# and the op and compile time spent inside one of them
WAIT_PARTS = ("input", "sync", "collective", "checkpoint")
# "trace": dynamo's own work compiling a frame (tracing the graph, AOTAutograd), beside the
# XLA compiles it asks for, which count as compiles
_INNER = ("inner_op", "inner_compile", "trace")


class _Counts:
    """What ran in the current step (the tracker swaps in a fresh one at each step end)."""

    __slots__ = (
        "compile_seconds",
        "compiles",
        "eager_ops",
        "fallbacks",
        "graph_runs",
        "op_seconds",
        "optimizer_op_seconds",
        "optimizer_ops",
        "optimizer_seconds",
        "parts",
        "read_back_seconds",
        "read_backs",
        "recompiles",
        "sequence",
        "transfer_bytes",
        "transfer_seconds",
        "transfers",
    )

    def __init__(self) -> None:
        self.eager_ops = 0
        self.graph_runs = 0
        self.op_seconds = 0.0
        self.optimizer_ops = 0  # eager ops run inside optimizer.step()
        self.optimizer_seconds = 0.0  # time inside optimizer.step(), its Python and its ops
        self.optimizer_op_seconds = 0.0  # of which in its eager ops and their compiles
        self.compiles = 0
        self.recompiles = 0
        self.compile_seconds = 0.0
        self.transfers = 0
        self.transfer_bytes = 0
        self.transfer_seconds = 0.0
        self.fallbacks = 0
        self.read_backs = 0
        self.read_back_seconds = 0.0
        self.sequence = _SEED
        # seconds per part of WAIT_PARTS and _INNER
        self.parts = dict.fromkeys(WAIT_PARTS + _INNER, 0.0)

    def ran(self) -> bool:
        # a transfer alone (reading the last step's loss back) is no step's work
        return bool(self.eager_ops or self.graph_runs or self.compiles or self.read_backs or self.fallbacks)


class _Window:
    """The run's first ops, for finding its loop: which op, which executable, when each ended."""

    __slots__ = ("compiles", "ends", "fallbacks", "full", "graphs", "kinds", "names", "parts", "seconds", "transfers")

    def __init__(self) -> None:
        self.names = array.array("I")
        self.kinds = array.array("I")
        self.seconds = array.array("d")
        self.ends = array.array("d")
        self.graphs: set[int] = set()  # name ids of compiled graphs (the rest are eager ops)
        # (ops executed before it, ...) of what happened between ops; a compile's flags:
        # (recompile, read back from the persistent cache)
        self.compiles: list[tuple[int, float, bool, bool]] = []
        self.transfers: list[tuple[int, int, float]] = []
        self.fallbacks: list[int] = []
        # (ops executed before it, part, seconds): the waits and the time inside them
        self.parts: list[tuple[int, str, float]] = []
        self.full = False


class StepTracker:
    """Records the run's steps as :class:`~.events.StepEvent` (a probe; see the module docstring).

    Args:
        put: where events go (``RunWriter.put``).
        new_id: the run's event ids (``RunWriter.new_id``).
        clock: seconds since the run started, on ``time.perf_counter``'s timeline (the
            window of ops keeps ``perf_counter()`` itself per op, a builtin call, and
            moves it onto the clock's timeline when it reads the window).
        record_error: ``(where, message)`` keeps a failure in the run.

    Example::

        tracker = StepTracker(writer.put, writer.new_id, recorder.clock)
        tracker.start(); probes.subscribe(tracker)
        ...                        # optimizer.step() ends each step
        tracker.close()            # a run without steps: its loop's iterations
    """

    def __init__(
        self,
        put: Callable[[Any], None],
        new_id: Callable[[], int],
        clock: Callable[[], float],
        *,
        record_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self._put = put
        self._new_id = new_id
        self._clock = clock
        self._record_error = record_error
        self._lock = threading.Lock()
        self._index = 0
        self._explicit = False
        self._start = 0.0
        self._counts = _Counts()
        self._executables: dict[Any, tuple[int, int]] = {}  # key -> (executable id, op name id)
        self._by_id: dict[int, tuple[Any, tuple[int, int]]] = {}  # id(key) -> (key, its ids)
        self._names: dict[tuple[str, Any], int] = {}
        self._compiled: set[tuple[str, str]] = set()  # (mode, name) compiled so far
        # a compiled graph's name changes when dynamo recompiles it: for finding the loop,
        # each graph is known by the function it came from (and its direction)
        self._graph_origin: dict[str, Any] = {}
        self._window: _Window | None = _Window()
        self._tpu_optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._hook: Any = None
        self._pre_hook: Any = None
        # when the tpu optimizer's step() now running began (None: none runs)
        self._optimizer_since: float | None = None
        self._closed = False
        self._closed_at: float | None = None
        self._listeners: tuple[Callable[[StepEvent], None], ...] = ()
        # the program's thread (the one ending steps): waits on other threads (a loader
        # prefetching in the background) overlap the step and are no part of its time
        self._thread: int | None = threading.get_ident()
        # the wait the program's thread is in ("input", "collective", "checkpoint"), if any:
        # what runs inside it is its time
        self._wait: str | None = None
        # dynamo compiling a frame on the program's thread: since when, how deep, and the XLA
        # compile and read-back seconds inside it (counted as compiles already)
        self._tracing: list[float] = []  # [start, compiles inside] per nesting level
        self._dynamo_hooks: tuple[Any, Any] | None = None
        self._dynamo_clear: tuple[Any, Any] | None = None  # (what `clear` was, its wrapper)

    @property
    def steps(self) -> int:
        """Steps ended so far."""
        return self._index

    def add_listener(self, listener: Callable[[StepEvent], None]) -> None:
        """Call ``listener(step)`` with each :class:`~.events.StepEvent` as its step ends, on
        the thread that ended it, after the step is recorded. Steps found in the run's loop
        when the trace ends are recorded only: a listener hears the steps the program marked
        (``optimizer.step()``, ``tpu_debug.step()``) while it ran. A listener that raises is
        recorded as the tracker's error; the others still hear the step."""
        self._listeners = self._listeners + (listener,)

    def remove_listener(self, listener: Callable[[StepEvent], None]) -> None:
        self._listeners = tuple(fn for fn in self._listeners if fn is not listener)

    # -- life cycle ---------------------------------------------------------------------

    def start(self, *, current: bool = True) -> None:
        """Hook ``optimizer.step()`` (every optimizer; those without ``tpu`` parameters are ignored).
        With ``current`` (a trace's tracker), :func:`current_tracker` returns this one until it closes."""
        global _current
        if current:
            _current = self
        try:
            # post hooks run in the order they were registered: lazy mode's (which runs the
            # step's pending graph) first, so the graph is counted in the step it belongs to
            hook_optimizers()
            self._pre_hook = register_optimizer_step_pre_hook(_untraced_by_dynamo(self._optimizer_starting))
            self._hook = register_optimizer_step_post_hook(hidden_from_dynamo(self._optimizer_stepped))
        except Exception as exc:  # noqa: BLE001 - explicit marks and loop detection still work
            self._error("start", exc)
        self._thread = threading.get_ident()
        try:
            step_hooks.install(self)
        except Exception as exc:  # noqa: BLE001 - steps are counted without the input and checkpoint waits
            self._error("start (input and checkpoint hooks)", exc)
        try:
            self._listen_to_dynamo()
        except Exception as exc:  # noqa: BLE001 - dynamo's tracing then counts as host time
            self._error("start (dynamo compile callbacks)", exc)

    def _listen_to_dynamo(self) -> None:
        """Hear dynamo start and end compiling a frame (``torch._dynamo.callback``), so its own
        work (tracing, AOTAutograd) is the compile side of the step, as its XLA compiles are: with
        a warm compile cache those shrink to read-backs and dynamo's work is most of what is left.

        ``torch._dynamo.reset()`` (``torch.compiler.reset()``, which notebooks and test suites
        call between models) clears every compile callback: the handler's ``clear`` is wrapped
        while the tracker listens, so the callbacks are registered again after it."""
        handler = _dynamo_callbacks()
        if handler is None:
            # dynamo not loaded: nothing compiled through it yet. It loads itself at the first
            # torch.compile call, before that call's first frame: listen from then on (the
            # hook holds the tracker weakly: a closed trace's tracker is not kept for it)
            tracker = weakref.ref(self)
            when_imported("torch._dynamo.callback", lambda: _listen_once_loaded(tracker))
            return
        start, end = self._dynamo_started, self._dynamo_ended
        handler.register_start_callback(start)
        handler.register_end_callback(end)
        self._dynamo_hooks = (start, end)
        clear = handler.clear
        own = "clear" in vars(handler)  # a wrapper already on the instance, kept under this one

        def clear_then_listen() -> None:
            try:
                clear()
            finally:
                if self._dynamo_hooks is not None:
                    handler.register_start_callback(start)
                    handler.register_end_callback(end)

        handler.clear = clear_then_listen
        self._dynamo_clear = (clear if own else None, clear_then_listen)

    def _stop_listening_to_dynamo(self) -> None:
        hooks, self._dynamo_hooks = self._dynamo_hooks, None
        handler = _dynamo_callbacks()
        if hooks is None or handler is None:
            return
        clear, wrapper = self._dynamo_clear
        self._dynamo_clear = None
        if vars(handler).get("clear") is wrapper:
            if clear is None:
                del handler.clear  # the class's own method again
            else:
                handler.clear = clear
        # (absent when dynamo's state was reset in a way that bypassed clear)
        if hooks[0] in handler.start_callbacks:
            handler.remove_start_callback(hooks[0])
        if hooks[1] in handler.end_callbacks:
            handler.remove_end_callback(hooks[1])

    def _dynamo_started(self, args: Any) -> None:
        if threading.get_ident() == self._thread:
            self._tracing.append(_perf_counter())
            self._tracing.append(0.0)

    def _dynamo_ended(self, args: Any) -> None:
        if threading.get_ident() != self._thread or not self._tracing:
            return
        inside = self._tracing.pop()
        began = self._tracing.pop()
        seconds = max(0.0, _perf_counter() - began - inside)
        if self._tracing:  # a compile inside another one: the outer one holds its time
            self._tracing[-1] += seconds + inside
            return
        self._add("trace", seconds)
        if self._wait is not None:
            self._add("inner_compile", seconds)

    def close(self) -> None:
        """Stop listening; a run that ended no step gets the iterations of its loop as steps."""
        global _current
        if self._closed:
            return
        self._closed = True
        self._closed_at = self._clock()
        if _current is self:
            _current = None
        for hook in (self._hook, self._pre_hook):
            if hook is not None:
                hook.remove()
        self._hook = self._pre_hook = None
        try:
            self._stop_listening_to_dynamo()
        except Exception as exc:  # noqa: BLE001 - the run is closed all the same
            self._error("close (dynamo compile callbacks)", exc)
        try:
            step_hooks.uninstall()
        except Exception as exc:  # noqa: BLE001 - the run is closed all the same
            self._error("close (input and checkpoint hooks)", exc)
        window, self._window = self._window, None
        if self._index == 0 and window is not None and len(window.names):
            try:
                self._loop_steps(window)
            except Exception as exc:  # noqa: BLE001 - the run is closed without loop steps
                self._error("close (loop detection)", exc)

    def unfinished(self) -> StepEvent | None:
        """What ran after the last step ended, counted as a step is, numbered as the next
        step would have been (0 in a run that ended no step: the whole run), up to now or
        to :meth:`close`; None when no op ran there, or when the run's steps are its
        loop's iterations. Never recorded (the run's steps are those that ended): a reader
        that shows every step's figures (TensorBoard) shows it after the last one, with
        ``detected="unfinished"``."""
        with self._lock:
            counts, index, start = self._counts, self._index, self._start
            end = self._closed_at if self._closed_at is not None else self._clock()
        if not counts.ran():
            return None
        # not recorded, so it takes no id of the run's
        return _event(0, index, "unfinished", start, end, counts, None)

    # -- step ends ------------------------------------------------------------------------

    def mark(self) -> None:
        """An explicit step end (``tpu_debug.step()``); from now on only these end steps."""
        self._explicit = True
        self._end("explicit", user_location(2))

    def _optimizer_starting(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if not self._closed and self._on_tpu(optimizer):
                self._optimizer_since = _perf_counter()
        except Exception as exc:  # noqa: BLE001 - never break optimizer.step()
            self._error("optimizer step pre-hook", exc)

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            # the optimizer's time is its step's, also where explicit marks end the steps (an
            # optimizer wrapping another ends its time at the inner one's end)
            since, self._optimizer_since = self._optimizer_since, None
            if since is not None:
                self._counts.optimizer_seconds += _perf_counter() - since
            if self._explicit or self._closed or not self._on_tpu(optimizer):
                return
            self._end("optimizer", user_location(2))
        except Exception as exc:  # noqa: BLE001 - never break optimizer.step()
            self._error("optimizer step hook", exc)

    def _on_tpu(self, optimizer: Any) -> bool:
        known = self._tpu_optimizers.get(optimizer)
        if known is None:
            known = any(
                getattr(getattr(p, "device", None), "type", None) == "tpu"
                for group in getattr(optimizer, "param_groups", ())
                for p in group.get("params", ())
            )
            try:
                self._tpu_optimizers[optimizer] = known
            except TypeError:  # not weak-referenceable: ask again next time
                pass
        return known

    def _end(self, detected: str, location: Any) -> None:
        with self._lock:
            if self._closed:
                return
            now = self._clock()
            counts, self._counts = self._counts, _Counts()
            start, self._start = self._start, now
            index = self._index
            self._index += 1
            self._window = None  # the program says where its steps are
            self._thread = threading.get_ident()
            if self._wait == "collective":
                self._wait = None  # a collective that raised (and was caught) never reported its end
        event = _event(self._new_id(), index, detected, start, now, counts, location)
        self._put(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - one listener's failure must not end the step for the rest
                self._error(f"step listener {getattr(listener, '__qualname__', listener)}", exc)

    # -- probe methods --------------------------------------------------------------------

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        counts = self._counts
        if mode == "eager":
            counts.eager_ops += 1
            if self._optimizer_since is not None:
                counts.optimizer_ops += 1
                counts.optimizer_op_seconds += seconds
        else:
            counts.graph_runs += 1
        counts.op_seconds += seconds
        if self._wait is not None:
            self._add("inner_op", seconds)
        # by the key object's identity first (see Recorder.on_execute): the runtime passes one
        # key object per cached executable, and hashing it per op costs more than the rest
        found = self._by_id.get(id(key))
        if found is not None and found[0] is key:
            ids = found[1]
        else:
            ids = self._executables.get(key)
            if ids is None:
                ids = self._new_executable(mode, name, key)
                self._by_id[id(key)] = (key, ids)  # held: its id is not reused
        counts.sequence = ((counts.sequence ^ ids[0]) * _MUL) & _MASK
        window = self._window
        if window is not None and not window.full:
            if len(window.names) >= LOOP_WINDOW:
                window.full = True
                return
            window.names.append(ids[1])
            window.kinds.append(ids[0])
            window.seconds.append(seconds)
            window.ends.append(_perf_counter())  # on the clock's timeline when read

    def on_compile(self, info: CompileInfo) -> None:
        graph = info.graph
        if graph is not None:
            origin = graph.origin.function or graph.origin.frame
            if origin is not None:
                self._graph_origin[str(info.name)] = (origin, graph.kind == "backward")
        ident = (info.mode, str(info.name))
        recompile = ident in self._compiled
        self._compiled.add(ident)
        if info.replayed:
            return
        counts = self._counts
        read_back = bool(getattr(info, "from_cache", False))
        _count_compile(counts, float(info.seconds), recompile, read_back)
        if self._optimizer_since is not None:  # compiling is not the optimizer's Python
            counts.optimizer_op_seconds += float(info.seconds)
        if self._wait is not None:  # a compile or a read-back inside a wait is the wait's time
            self._add("inner_compile", float(info.seconds))
        if self._tracing and threading.get_ident() == self._thread:
            self._tracing[-1] += float(info.seconds)  # inside dynamo's compile: not its own work
        window = self._window
        if window is not None and not window.full:
            window.compiles.append((len(window.names), float(info.seconds), recompile, read_back))

    def on_transfer(self, info: TransferInfo) -> None:
        counts = self._counts
        counts.transfers += 1
        counts.transfer_bytes += int(info.nbytes)
        counts.transfer_seconds += float(info.seconds)
        window = self._window
        if window is not None and not window.full:
            window.transfers.append((len(window.names), int(info.nbytes), float(info.seconds)))
        part = _transfer_part(info)
        if part is not None and self._wait is None and threading.get_ident() == self._thread:
            self._add(part, float(info.seconds))
        if info.compile_seconds:  # JAX compiling what the op dispatched: compile time, no program of ours
            _count_compile(counts, float(info.compile_seconds), False, None)
            if window is not None and not window.full:
                window.compiles.append((len(window.names), float(info.compile_seconds), False, None))
            if self._wait is not None:  # a compile inside a wait is the wait's time
                self._add("inner_compile", float(info.compile_seconds))

    def on_synchronize(self, seconds: float) -> None:
        if self._wait is None and threading.get_ident() == self._thread:
            self._add("sync", seconds)
            self._put(WaitEvent(self._new_id(), self._clock() - seconds, None, threading.get_native_id(),
                                user_location(2), "synchronize", seconds, "torch.tpu.synchronize"))

    def on_collective(self, info: CollectiveInfo) -> None:
        if self._wait is None and threading.get_ident() == self._thread:
            self._wait = "collective"

    def on_collective_done(self, info: CollectiveDone) -> None:
        if self._wait == "collective" and threading.get_ident() == self._thread:
            self._wait = None
            self._add("collective", float(info.seconds))

    # -- waits outside the runtime (tracers/recording/step_hooks.py) -------------------------------

    def begin_wait(self, what: str) -> tuple[str, float] | None:
        """The program's thread starts waiting for ``what`` (``"input"``, ``"checkpoint"``);
        a token for :meth:`end_wait`, or None when the wait is not the step's (another thread,
        inside another wait, a closed tracker): then nothing is to be reported."""
        if self._closed or self._wait is not None or threading.get_ident() != self._thread:
            return None
        self._wait = what
        return (what, self._clock())

    def end_wait(self, token: tuple[str, float], seconds: float, api: str, **settings: Any) -> None:
        """The wait of ``token`` took ``seconds``: count it in the step and record it."""
        what, began = token
        if self._wait == what:
            self._wait = None
        self._add(what, seconds)
        try:
            self._put(WaitEvent(self._new_id(), began, None, threading.get_native_id(), user_location(3),
                                what, seconds, api, **settings))
        except Exception as exc:  # noqa: BLE001 - the program's call returns all the same
            self._error("end_wait", exc)

    def _add(self, part: str, seconds: float) -> None:
        self._counts.parts[part] += seconds
        window = self._window
        if window is not None and not window.full:
            window.parts.append((len(window.names), part, seconds))

    def on_fallback(self, info: FallbackInfo) -> None:
        self._counts.fallbacks += 1
        window = self._window
        if window is not None and not window.full:
            window.fallbacks.append(len(window.names))

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    # -- helpers ------------------------------------------------------------------------

    def _new_executable(self, mode: str, name: str, key: Any) -> tuple[int, int]:
        with self._lock:
            ids = self._executables.get(key)
            if ids is None:
                ident = (mode, self._graph_origin.get(str(name), str(name)))
                nid = self._names.get(ident)
                if nid is None:
                    nid = self._names[ident] = len(self._names) + 1
                    window = self._window
                    if window is not None and mode != "eager":
                        window.graphs.add(nid)
                ids = self._executables[key] = (len(self._executables) + 1, nid)
        return ids

    def _loop_steps(self, window: _Window) -> None:
        loop = detect_loop(window.names)
        if loop is None:
            return
        shift = self._clock() - _perf_counter()
        ends = [end + shift for end in window.ends]
        seconds = window.seconds
        bounds = [loop.start + i * loop.period for i in range(loop.iterations + 1)]
        compile_at = [c[0] for c in window.compiles]
        transfer_at = [t[0] for t in window.transfers]
        part_at = [p[0] for p in window.parts]
        for index, (a, b) in enumerate(zip(bounds, bounds[1:])):
            counts = _Counts()
            for i in range(a, b):
                if window.names[i] in window.graphs:
                    counts.graph_runs += 1
                else:
                    counts.eager_ops += 1
                counts.op_seconds += seconds[i]
                counts.sequence = ((counts.sequence ^ window.kinds[i]) * _MUL) & _MASK
            # what happened before op i ran belongs to op i's step
            for _, secs, recompile, read_back in window.compiles[
                bisect.bisect_left(compile_at, a) : bisect.bisect_left(compile_at, b)
            ]:
                _count_compile(counts, secs, recompile, read_back)
            for _, nbytes, secs in window.transfers[bisect.bisect_left(transfer_at, a) : bisect.bisect_left(transfer_at, b)]:
                counts.transfers += 1
                counts.transfer_bytes += nbytes
                counts.transfer_seconds += secs
            counts.fallbacks = bisect.bisect_left(window.fallbacks, b) - bisect.bisect_left(window.fallbacks, a)
            for _, part, secs in window.parts[bisect.bisect_left(part_at, a) : bisect.bisect_left(part_at, b)]:
                counts.parts[part] += secs
            # a step begins when the op before its first one ended; a loop that opens the run
            # begins with it, so the compiles and uploads its counts hold are inside it
            start = ends[a - 1] if a > 0 else min(self._start, ends[0] - seconds[0])
            self._put(_event(self._new_id(), index, "loop", start, ends[b - 1], counts, None))
        self._index = loop.iterations
        # the loop's steps hold what ran in it; what ran around the loop belongs to no step
        self._counts = _Counts()

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"StepTracker.{where}", f"{type(exc).__name__}: {exc}")


def _listen_once_loaded(tracker: weakref.ref) -> None:
    """Dynamo has just loaded: the tracker that waited for it listens, if it is still open."""
    self = tracker()
    if self is None or self._closed or self._dynamo_hooks is not None:
        return
    try:
        self._listen_to_dynamo()
    except Exception as exc:  # noqa: BLE001 - dynamo's tracing then counts as host time
        self._error("dynamo loaded (dynamo compile callbacks)", exc)


def _dynamo_callbacks() -> Any:
    """Dynamo's compile callback handler, or None before dynamo is loaded."""
    return getattr(sys.modules.get("torch._dynamo.callback"), "callback_handler", None)


def _transfer_part(info: TransferInfo) -> str | None:
    """The part of the step a copy's time is: ``"sync"`` for a device-to-host read (it waits for
    the work queued before it), ``"input"`` for an upload of data, None for the copies a scalar
    operand or a CPU fallback makes (host work of the op, the rest of the step)."""
    direction, op = info.direction, info.op
    if direction == "d2h":
        return "sync"
    if direction == "h2d" and op != "scalar" and not op.startswith("fallback"):
        return "input"
    return None


def _count_compile(counts: _Counts, seconds: float, recompile: bool, read_back: bool | None) -> None:
    """``read_back`` None: JAX's own compiles inside an op (time, and no executable to count)."""
    if read_back is None:
        counts.compile_seconds += seconds
        return
    if read_back:
        # read back from the persistent compile cache: nothing compiled, never a recompile, but
        # the time is the compile side's (a cold cache would have compiled it there)
        counts.read_backs += 1
        counts.read_back_seconds += seconds
        return
    counts.compiles += 1
    counts.recompiles += int(recompile)
    counts.compile_seconds += seconds


def steps_between(
    bounds: Sequence[float], compiles: Sequence[Any], detected: str, new_id: Callable[[], int]
) -> list[StepEvent]:
    """Steps cut at known times, for a run read back from a record without step marks (an
    imported trace log): step ``i`` runs from ``bounds[i]`` to ``bounds[i + 1]`` and counts the
    compile events that start in it as the tracker counts a live step's.

    Example:
        >>> from tpu_debug.tracers.events import CompileEvent
        >>> compiles = [CompileEvent(i, ts, "compiled", 0, None, "f", "", (), 1.0)
        ...             for i, ts in enumerate([0, 1, 5])]
        >>> steps = steps_between([0.0, 5.0, 6.0], compiles, "log", iter(range(9)).__next__)
        >>> [(s.index, s.seconds, s.compiles) for s in steps]
        [(0, 5.0, 2), (1, 1.0, 1)]
    """
    steps = []
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        counts = _Counts()
        for c in compiles:
            if start <= c.ts < end or c.ts == start == end:
                _count_compile(counts, float(c.seconds), bool(c.diffs), bool(getattr(c, "from_cache", False)))
        steps.append(_event(new_id(), index, detected, start, end, counts, None, thread=0, measured=False))
    return steps


def _untraced_by_dynamo(fn: Callable[..., None]) -> Callable[..., None]:
    """An optimizer-step pre-hook that does nothing where dynamo traces ``opt.step()``.

    A hook dynamo may not trace (``hidden_from_dynamo``) breaks the user's graph where it is
    called: at the start of a compiled ``opt.step()``, that would split a one-program step in
    two. Dynamo traces this one instead, and under tracing ``is_compiling()`` is true, so the
    graph holds nothing of it; run eagerly, it calls ``fn``."""
    hidden = hidden_from_dynamo(fn)
    compiling = torch.compiler.is_compiling

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not compiling():
            hidden(optimizer, args, kwargs)

    return pre_hook


def _event(
    event_id: int, index: int, detected: str, start: float, end: float, c: _Counts, location: Any,
    *, thread: int | None = None, measured: bool = True,
) -> StepEvent:
    return StepEvent(
        event_id,
        start,
        None,
        threading.get_native_id() if thread is None else thread,
        location,
        index,
        detected,
        end,
        max(0.0, end - start),
        c.eager_ops,
        c.graph_runs,
        c.op_seconds,
        c.compiles,
        c.recompiles,
        c.compile_seconds,
        c.transfers,
        c.transfer_bytes,
        c.transfer_seconds,
        c.fallbacks,
        f"{c.sequence:016x}",
        c.read_backs,
        *(c.parts[p] if measured else None for p in WAIT_PARTS),
        c.parts["inner_op"],
        c.parts["inner_compile"],
        c.read_back_seconds,
        c.parts["trace"],
        c.optimizer_ops,
        c.optimizer_seconds,
        c.optimizer_op_seconds,
    )


# ---------------------------------------------------------------------------------
# Finding the loop
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Loop:
    """A block of ``period`` ops repeated ``iterations`` times from op ``start`` on."""

    start: int
    period: int
    iterations: int


def detect_loop(ops: Sequence[int], *, min_iterations: int = LOOP_MIN_ITERATIONS) -> Loop | None:
    """The loop in a sequence of op ids: the longest stretch where one block repeats.

    The block's length (the period) is one of the distances between two runs
    of the same op: an op run once per iteration recurs exactly one period
    later. Each candidate period ``p`` is checked over the whole sequence
    (``ops[i] == ops[i + p]``); the one whose longest agreeing stretch covers
    the most ops wins, the shorter period on a tie (a loop of period ``p``
    also agrees with itself at ``2p``, over ``p`` fewer ops).

    Args:
        ops: one id per op executed, in order.
        min_iterations: repetitions needed to call it a loop.

    Returns:
        The loop, or None when no block repeats ``min_iterations`` times.

    Example:
        >>> detect_loop([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7])
        Loop(start=1, period=3, iterations=3)
    """
    a = np.asarray(ops, dtype=np.int64)
    n = len(a)
    if n < min_iterations:
        return None
    order = np.argsort(a, kind="stable")
    same = a[order[1:]] == a[order[:-1]]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[gaps * min_iterations <= n]
    if not len(gaps):
        return None
    values, counts = np.unique(gaps, return_counts=True)
    # the most frequent distances first; a period seen once cannot repeat three times
    ranked = values[np.argsort(-counts, kind="stable")][: 256]
    best: tuple[int, int, int] | None = None  # (covered, -period, start)
    for p in (int(v) for v in ranked):
        agree = a[:-p] == a[p:]
        if not agree.any():
            continue
        edges = np.diff(np.concatenate(([0], agree.astype(np.int8), [0])))
        starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        longest = int(np.argmax(stops - starts))
        start, run = int(starts[longest]), int(stops[longest] - starts[longest])
        covered = (run + p) // p * p
        if covered // p < min_iterations:
            continue
        if best is None or (covered, -p) > best[:2]:
            best = (covered, -p, start)
    if best is None:
        return None
    covered, neg_p, start = best
    return Loop(start, -neg_p, covered // -neg_p)

