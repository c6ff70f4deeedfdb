"""The probe interface: how the runtime tells tracers what it did.

The runtime records nothing itself. A tracer implements some methods of
:class:`Probe` and subscribes; the runtime reports each activity through one
typed function of this module, which calls that method on every subscribed
probe that has it:

=====================================  ======================================
the runtime calls                      each probe hears
=====================================  ======================================
``compiling(mode, name)``              ``on_compile_begin(mode, name)``
``compiled(info)``                     ``on_compile(info: CompileInfo)``
``executing(mode, name, key)``         ``on_execute_begin(mode, name, key)``
``executed(mode, name, key, seconds)`` ``on_execute(mode, name, key, seconds)``
``transferring(direction, op)``        ``on_transfer_begin(direction, op)``
``transferred(info)``                  ``on_transfer(info: TransferInfo)``
``fell_back(info)``                    ``on_fallback(info: FallbackInfo)``
``evicted(mode, name, key)``           ``on_evict(mode, name, key)``
``deferred(name, index, site)``        ``on_defer(name, index, site)``
``materialized(info)``                 ``on_materialize(info: MaterializeInfo)``
``allocated(info)``                    ``on_alloc(info: AllocInfo)``
``freed(info)``                        ``on_free(info: FreeInfo)``
``collective(info)``                   ``on_collective(info: CollectiveInfo)``
``collective_done(info)``              ``on_collective_done(info: CollectiveDone)``
``collective_desync(info)``            ``on_collective_desync(info: DesyncInfo)``
``synchronized(seconds)``              ``on_synchronize(seconds)``
``invalid_value(info)``                ``on_invalid_value(info: InvalidValueInfo)``
=====================================  ======================================

``on_invalid_value`` is an op's argument values that PyTorch's CPU kernel refuses and XLA
computes with silently (an index out of range, which a TPU clamps; a probability
distribution with a negative, ``nan`` or ``inf`` entry or no mass): heard whether or not
the runtime raises PyTorch's error for it (``config.data_checks``). Eager ops are checked
before they run; lazy and compiled programs compute the check in the same program only
while a probe listens for it (or the checks raise), and it is told after the program ran.

``on_alloc``/``on_free`` are memory tracking (``runtime/memory_ledger.py``): while a
probe with either is subscribed, the runtime keeps a weak registry of the
storages holding device payloads; with none, it keeps nothing.

Which probes implement which method is worked out once, when a probe
subscribes or unsubscribes (copy-on-write tuples), so a notification is a loop
over the probes that listen to it. The runtime tests ``probes._probes``
(empty unless something subscribed) before it reads a clock or builds an
info record, so with no probe a notification costs one attribute test.

A probe that raises never breaks the user's program
(:func:`tpu_debug.core.hooks.deliver`): the error is counted in ``probe_errors``
(a bounded :class:`~tpu_debug.core.hooks.ErrorLog`) and handed to the probe's
``on_internal_error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from tpu_debug.core.hooks import ErrorLog, Route, deliver, report_failure
from tpu_debug.core.records import (
    AllocInfo,
    CollectiveDone,
    CollectiveInfo,
    CompileInfo,
    DesyncInfo,
    FallbackInfo,
    FreeInfo,
    InvalidValueInfo,
    MaterializeInfo,
    TransferInfo,
)

__all__ = [
    "as_dynamo_disabled",
    "Probe",
    "active",
    "add_replay_source",
    "add_transfer_check",
    "allocated",
    "check_transfer",
    "collective",
    "collective_desync",
    "collective_done",
    "compiled",
    "compiling",
    "deferred",
    "evicted",
    "executed",
    "executing",
    "fell_back",
    "freed",
    "hidden_from_dynamo",
    "invalid_value",
    "listening",
    "materialized",
    "observe_graph",
    "observe_op",
    "observed",
    "probe_errors",
    "quiet",
    "remove_transfer_check",
    "subscribe",
    "synchronized",
    "track_memory",
    "transferred",
    "transferring",
    "unsubscribe",
]


# ---------------------------------------------------------------------------
# What the runtime reports: the records of tpu_debug.core.records, sent to the probes below
# ---------------------------------------------------------------------------


@runtime_checkable
class Probe(Protocol):
    """What a tracer implements to hear from the runtime. Every method is optional:
    a probe is called only for the methods it defines (a subclass of ``Probe`` that
    does not override one is not called for it)."""

    def on_compile(self, info: CompileInfo) -> None: ...

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None: ...

    def on_transfer(self, info: TransferInfo) -> None: ...

    def on_fallback(self, info: FallbackInfo) -> None: ...

    def on_evict(self, mode: str, name: str, key: Any) -> None:
        """The executable of ``key`` left the runtime's cache; running it again compiles it again."""

    # Lazy mode (runtime/lazy.py): each op recorded into the pending graph, and each run of it.

    def on_defer(self, name: str, index: int, site: int) -> None:
        """Op ``name`` was recorded as op ``index`` of the pending graph at a place no graph
        reached before while this probe listened: ``site`` names that place (the same op
        after the same sequence of steps), and a fused graph's ``LazyNode.site`` says which
        site each of its ops is. An op repeating a recorded sequence is not announced again
        (a training loop's graphs are announced once): what a probe keeps per site (the
        recorder: the user's line) holds for every op at that site. A value check's step
        (``check:<op>``) is the exception: while a probe listens for ``on_invalid_value`` it
        is announced each time it is recorded, so the line kept for its site when the check
        is told (:class:`InvalidValueInfo`) is the line that recorded it."""

    def on_materialize(self, info: MaterializeInfo) -> None:
        """The pending graph ran (after its on_compile, if it compiled, and its on_execute)."""

    # Memory tracking: called on the thread that set a payload (``on_alloc``), or on the one
    # that next changes or reads the registry (``on_free`` of a storage that went).

    def on_alloc(self, info: AllocInfo) -> None: ...

    def on_free(self, info: FreeInfo) -> None: ...

    def on_collective(self, info: CollectiveInfo) -> None:
        """This rank is entering a c10d collective of the `tpu` process group."""

    def on_collective_desync(self, info: DesyncInfo) -> None:
        """The ranks of a c10d group stopped calling the same collectives; this rank raises next."""

    def on_collective_done(self, info: CollectiveDone) -> None:
        """This rank returned from a c10d collective of the `tpu` process group."""

    def on_synchronize(self, seconds: float) -> None:
        """``torch.tpu.synchronize()`` (or a stream's or event's) waited ``seconds`` for the
        device's queued work, after running what lazy mode had pending (reported apart)."""
    def on_invalid_value(self, info: InvalidValueInfo) -> None:
        """An op got argument values PyTorch refuses and XLA computes with (see InvalidValueInfo)."""

    # Begin notifications, for host-side spans on a profiler timeline. Each is called
    # just before the activity, on the thread that runs it; the matching on_execute /
    # on_compile / on_transfer follows on that thread, unless the activity raised (a
    # probe that keeps spans open must tolerate a missing end).

    def on_execute_begin(self, mode: str, name: str, key: Any) -> None: ...

    def on_compile_begin(self, mode: str, name: str) -> None: ...

    def on_transfer_begin(self, direction: str, op: str) -> None: ...

    # Observed ops and graphs, for comparing against CPU (see "Observed ops and graphs"
    # below). A probe with any of these sees every eager op with its inputs and outputs,
    # and every compiled-graph call with its input arrays.

    def before_op(self, op: Any, args: tuple, kwargs: dict) -> None: ...

    def on_op(self, op: Any, args: tuple, kwargs: dict, outputs: Any) -> None: ...

    def on_graph(self, graph: Any, arrays: list, outputs: Any) -> None: ...

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        """One of this probe's methods (``method``) raised ``exc``; the program went on."""


# ---------------------------------------------------------------------------
# Subscribers
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Routes:
    """Per notification, the subscribed probes that implement it."""

    on_compile: Route = ()
    on_execute: Route = ()
    on_transfer: Route = ()
    on_fallback: Route = ()
    on_evict: Route = ()
    on_defer: Route = ()
    on_materialize: Route = ()
    on_alloc: Route = ()
    on_free: Route = ()
    on_collective: Route = ()
    on_collective_desync: Route = ()
    on_collective_done: Route = ()
    on_synchronize: Route = ()
    on_invalid_value: Route = ()
    on_execute_begin: Route = ()
    on_compile_begin: Route = ()
    on_transfer_begin: Route = ()
    before_op: Route = ()
    on_op: Route = ()
    on_graph: Route = ()


_NOTIFICATIONS = tuple(f.name for f in dataclasses.fields(_Routes))
_OBSERVING = ("before_op", "on_op", "on_graph")

_lock = threading.Lock()
_probes: tuple[Any, ...] = ()
# the probes that observe ops or graphs: the runtime tests this before it hands them values
_op_probes: tuple[Any, ...] = ()
_routes = _Routes()
_replay_sources: tuple = ()

#: failures of probe methods (bounded: the first ones as text, and a count of all)
probe_errors = ErrorLog()


def _route(probe: Any, method: str) -> Route:
    fn = getattr(probe, method, None)
    # the Protocol's own stubs (a probe subclassing Probe) do not count
    if fn is None or getattr(type(probe), method, None) is getattr(Probe, method):
        return ()
    return ((probe, method, fn),)


def _rebuild() -> None:
    global _routes, _op_probes
    _routes = _Routes(**{m: sum((_route(p, m) for p in _probes), ()) for m in _NOTIFICATIONS})
    _op_probes = tuple(p for p in _probes if any(_route(p, m) for m in _OBSERVING))


def add_replay_source(source) -> None:
    """``source()`` yields the CompileInfo of executables compiled so far."""
    global _replay_sources
    with _lock:
        _replay_sources = (*_replay_sources, source)


def subscribe(probe: Any, *, replay: bool = False) -> None:
    """Start calling ``probe`` (subscribing it twice is subscribing it once).

    Args:
        probe: an object with some of :class:`Probe`'s methods.
        replay: first tell it ``on_compile`` for every executable compiled
            before it subscribed (with ``replayed=True``), so it knows the keys
            an executable was compiled for.

    Example::

        probes.subscribe(recorder, replay=True)
        try: run()
        finally: probes.unsubscribe(recorder)
    """
    global _probes
    with _lock:
        if probe in _probes:
            return
        _probes = _probes + (probe,)
        _rebuild()
    route = _route(probe, "on_compile")
    if replay and route:
        for source in _replay_sources:
            for info in source():
                deliver(route, (dataclasses.replace(info, replayed=True),), probe_errors)
    memory_route = _route(probe, "on_alloc")
    if _memory is not None and (memory_route or _route(probe, "on_free")):
        _memory[0](memory_route)


def unsubscribe(probe: Any) -> None:
    """Stop calling ``probe`` (a probe not subscribed is ignored). A probe hearing failed
    value checks first hears those of every program dispatched so far."""
    global _probes
    if _report_flush is not None and probe in _probes and _route(probe, "on_invalid_value"):
        _report_flush()
    with _lock:
        _probes = tuple(p for p in _probes if p is not probe)
        _rebuild()
        tracking = bool(_routes.on_alloc or _routes.on_free)
    if not tracking and _memory is not None:
        _memory[1]()


def active() -> tuple[Any, ...]:
    """The subscribed probes."""
    return _probes


def listening(method: str) -> bool:
    """Whether a subscribed probe implements ``method`` (a :class:`Probe` method's name): a
    caller that builds a costly record (a clock read, a collective's shapes) asks first."""
    return bool(getattr(_routes, method))


# Memory tracking (runtime/memory_ledger.py) hands itself in when it is imported (the device imports
# it): ``joined(route)`` when a probe with on_alloc or on_free subscribes (``route``: its
# on_alloc), ``left()`` when no such probe is left. Before, no `tpu` tensor exists to track.
_memory: tuple[Callable[[Route], None], Callable[[], None]] | None = None
# runtime/value_checks.py hands in its ``flush`` when imported: it reads the value-check
# reports of programs dispatched so far (kept until their programs ran)
_report_flush: Callable[[], None] | None = None


def track_memory(joined: Callable[[Route], None], left: Callable[[], None]) -> None:
    """Memory tracking's entry points (see above); ``joined(())`` is called at once when memory
    probes subscribed before it was handed in."""
    global _memory
    with _lock:
        _memory = (joined, left)
        tracking = bool(_routes.on_alloc or _routes.on_free)
    if tracking:
        joined(())


# ---------------------------------------------------------------------------
# Notifications (the runtime calls these after testing ``probes._probes``)
# ---------------------------------------------------------------------------
# A thread in ``_quiet`` is running a probe's own device work: it is not the program's.

_quiet: set[int] = set()
_get_ident = threading.get_ident


def compiling(mode: str, name: str) -> None:
    """An executable for op or graph ``name`` is about to be compiled."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_compile_begin, (mode, name), probe_errors)


def compiled(info: CompileInfo) -> None:
    """An executable was compiled."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_compile, (info,), probe_errors)


def executing(mode: str, name: str, key: Any) -> None:
    """The executable of ``key`` is about to run."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_execute_begin, (mode, name, key), probe_errors)


def executed(mode: str, name: str, key: Any, seconds: float) -> None:
    """The executable of ``key`` ran, taking ``seconds`` to dispatch."""
    # once per op run while a trace records: deliver's loop, inline (a frame is a fifth of it)
    if _quiet and _get_ident() in _quiet:
        return
    for owner, method, fn in _routes.on_execute:
        try:
            fn(mode, name, key, seconds)
        except Exception as exc:  # a tracer must not break the program
            if getattr(exc, "stops_program", False):
                raise
            report_failure(owner, method, exc, probe_errors)


def transferring(direction: str, op: str) -> None:
    """Data is about to move (``direction``: ``"h2d"``, ``"d2h"``, ``"d2d"``)."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_transfer_begin, (direction, op), probe_errors)


def transferred(info: TransferInfo) -> None:
    """Data moved between host and device."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_transfer, (info,), probe_errors)


def fell_back(info: FallbackInfo) -> None:
    """An op with no lowering ran on CPU."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_fallback, (info,), probe_errors)


def collective(info: CollectiveInfo) -> None:
    """This rank is entering a c10d collective of the `tpu` process group."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_collective, (info,), probe_errors)


def collective_done(info: CollectiveDone) -> None:
    """This rank returned from a c10d collective of the `tpu` process group."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_collective_done, (info,), probe_errors)


def collective_desync(info: DesyncInfo) -> None:
    """The ranks of a c10d group stopped calling the same collectives; this rank raises next."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_collective_desync, (info,), probe_errors)


def synchronized(seconds: float) -> None:
    """The host waited ``seconds`` in ``torch.tpu.synchronize()`` for the device's queued work."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_synchronize, (seconds,), probe_errors)
def invalid_value(info: InvalidValueInfo) -> None:
    """An op got argument values PyTorch refuses and XLA computes with."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_invalid_value, (info,), probe_errors)


def evicted(mode: str, name: str, key: Any) -> None:
    """The executable of ``key`` was dropped from the runtime's cache."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_evict, (mode, name, key), probe_errors)


def deferred(name: str, index: int, site: int) -> None:
    """Lazy mode recorded op ``name`` as op ``index`` of its pending graph, at a new ``site`` (a
    value check's step: at every record while a probe listens for ``on_invalid_value``)."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_defer, (name, index, site), probe_errors)


def materialized(info: MaterializeInfo) -> None:
    """Lazy mode ran its pending graph."""
    if not _quiet or _get_ident() not in _quiet:
        deliver(_routes.on_materialize, (info,), probe_errors)


def allocated(info: AllocInfo) -> None:
    """Device bytes were charged to a storage. Memory notifications are not filtered by
    ``quiet``: the registry leaves out a quiet thread's own payloads, and a storage it
    registered may go on any thread."""
    deliver(_routes.on_alloc, (info,), probe_errors)


def freed(info: FreeInfo) -> None:
    """Device bytes charged to a storage were released."""
    deliver(_routes.on_free, (info,), probe_errors)


# ---------------------------------------------------------------------------
# Observed ops and graphs (divergence against CPU)
# ---------------------------------------------------------------------------
# A probe with ``on_op(op, args, kwargs, outputs)`` (and optionally
# ``before_op(op, args, kwargs)``) sees every eager op with its inputs and
# outputs; one with ``on_graph(graph, arrays, outputs)`` sees every call of a
# compiled graph. The runtime checks ``_op_probes`` (empty unless such a probe
# is subscribed) before calling in, so observation costs nothing otherwise.
# While a probe handles a notification its thread is quiet: device work the
# probe does itself is neither observed nor reported to any probe.


def _observe(route: Route, args: tuple, me: int) -> None:
    if not route:
        return
    _quiet.add(me)
    try:
        deliver(route, args, probe_errors)
    finally:
        _quiet.discard(me)


def observe_op(op: Any, args: Any, kwargs: Any, run: Any) -> Any:
    """``run()`` (the op's execution), with ``before_op``/``on_op`` around it."""
    me = _get_ident()
    if me in _quiet:
        return run()
    routes = _routes
    _observe(routes.before_op, (op, args, kwargs), me)
    out = run()
    _observe(routes.on_op, (op, args, kwargs, out), me)
    return out


def observe_graph(graph: Any, arrays: list, outputs: Any) -> None:
    """A compiled graph ran on ``arrays`` (its inputs) and gave ``outputs``."""
    me = _get_ident()
    if me not in _quiet:
        _observe(_routes.on_graph, (graph, arrays, outputs), me)


def observed(op: Any, kernel: Any) -> Any:
    """``kernel`` (a device kernel that is not a lowering, e.g. ``copy_``) reporting to op probes."""

    def kernel_observed(*args: Any, **kwargs: Any) -> Any:
        if _op_probes:
            return observe_op(op, args, kwargs, lambda: kernel(*args, **kwargs))
        return kernel(*args, **kwargs)

    kernel_observed.__name__ = getattr(kernel, "__name__", "kernel")
    return kernel_observed


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """This thread's device work is not observed or reported to any probe meanwhile.

    Example::

        with probes.quiet():
            reference = x.cpu()   # a tracer's own copy: no transfer event
    """
    me = _get_ident()
    nested = me in _quiet
    _quiet.add(me)
    try:
        yield
    finally:
        if not nested:
            _quiet.discard(me)


# ---------------------------------------------------------------------------
# Transfer checks (transfer guards)
# ---------------------------------------------------------------------------
# Unlike a probe, a check may raise: it runs before data moves, and a transfer
# guard set to "disallow" stops the copy with an error that must reach the
# user. The runtime tests ``_transfer_checks`` first, so no check costs nothing.

_transfer_checks: tuple[Any, ...] = ()


def add_transfer_check(check: Any) -> None:
    """Call ``check(direction, op, shape, dtype, nbytes)`` before every host<->device copy."""
    global _transfer_checks
    with _lock:
        _transfer_checks = _transfer_checks + (check,)


def remove_transfer_check(check: Any) -> None:
    global _transfer_checks
    with _lock:
        _transfer_checks = tuple(c for c in _transfer_checks if c is not check)


def check_transfer(direction: str, op: str, shape: tuple, dtype: str, nbytes: int) -> None:
    """Run the transfer checks (the runtime calls this; a check's error propagates)."""
    if _quiet and _get_ident() in _quiet:
        return  # a probe's own device work is not the program's
    for check in _transfer_checks:
        check(direction, op, shape, dtype, nbytes)


# ---------------------------------------------------------------------------
# Hooks the tool installs into the user's program
# ---------------------------------------------------------------------------


def hidden_from_dynamo(fn: Any) -> Any:
    """``fn`` as a hook dynamo never traces, like ``torch._dynamo.disable(fn)``.

    An optimizer-step hook runs inside the user's ``opt.step()``, which may be
    part of a compiled function: dynamo would try to trace the hook (and break
    the user's graph at its ``sys._getframe``). The wrapper runs ``fn`` with
    dynamo's frame callback unset, its code is marked for dynamo to run without
    looking at it, and it carries the marks ``torch._dynamo.disable`` leaves, so
    dynamo calls it as it would a disabled function. Importing torch._dynamo
    (about a second) is not needed: this goes through dynamo's C module.

    Example::

        register_optimizer_step_post_hook(hidden_from_dynamo(tracker.on_step))
    """
    from torch._C._dynamo import eval_frame

    def hidden(*args: Any, **kwargs: Any) -> Any:
        prior = eval_frame.set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            eval_frame.set_eval_frame(prior)

    return as_dynamo_disabled(hidden, fn)


def as_dynamo_disabled(wrapper: Any, fn: Any) -> Any:
    """``wrapper`` (which calls ``fn`` with dynamo's frame callback unset) marked as
    ``torch._dynamo.disable`` marks its wrappers: dynamo runs the wrapper's frames without
    looking at them, and a compiled function calling it breaks its graph there and calls it
    rather than inlining it. Every wrapper made from one ``def`` shares its code object,
    so marking that code once covers them all."""
    import functools

    from torch._C._dynamo import eval_frame

    skip = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
    eval_frame.set_code_exec_strategy(wrapper.__code__, skip)
    wrapper = functools.wraps(fn)(wrapper)
    wrapper._torchdynamo_disable = True
    wrapper._torchdynamo_disable_msg = None
    wrapper._torchdynamo_disable_recursive = True
    wrapper._torchdynamo_orig_callable = fn
    return wrapper
