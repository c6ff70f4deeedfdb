"""The probe interface: how the runtime tells tracers what it did.

The runtime records nothing itself. It calls the subscribed probes; a probe
that raises never breaks the user's program: the error is kept in
``probe_errors`` and handed to the probe's ``on_internal_error``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ArgSpec",
    "CompileInfo",
    "TransferInfo",
    "FallbackInfo",
    "Probe",
    "subscribe",
    "add_replay_source",
    "unsubscribe",
    "active",
    "emit",
    "probe_errors",
    "observe_op",
    "observe_graph",
    "observed",
    "quiet",
    "add_transfer_check",
    "remove_transfer_check",
    "check_transfer",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ArgSpec:
    """One input of an executable: a tensor aval or a static Python value."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    static: Any = None
    # issue 5: the rest of what the key holds about this input, so a recompile can
    # say what changed: a Python number baked into the executable (a static
    # ``Scalar`` argument), and how a tensor is read (("stride", ...), ("offset",
    # ...), ("storage", ...) for a strided view; ("device", "cpu") for a host scalar)
    scalar: bool = False
    layout: tuple[tuple[str, Any], ...] = ()

    def render(self) -> str:
        if self.shape is None:
            return f"{self.name}={self.static!r}"
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True, slots=True)
class CompileInfo:
    """An executable was compiled (an eager op or a compiled graph).

    ``lowered``/``compiled`` are the JAX stage objects; text is produced only
    when a tracer asks for it.
    """

    mode: str
    name: str
    key: Any
    args: tuple[ArgSpec, ...]
    seconds: float
    lowered: Any = None
    compiled: Any = None
    extra: dict = dataclasses.field(default_factory=dict)

    def stablehlo(self) -> str:
        return self.lowered.as_text() if self.lowered is not None else ""

    def hlo(self) -> str:
        return self.compiled.as_text() if self.compiled is not None else ""


@dataclasses.dataclass(frozen=True, slots=True)
class TransferInfo:
    """Data crossed between host and device."""

    direction: str  # "h2d" | "d2h" | "d2d"
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class FallbackInfo:
    """An op ran on CPU because it has no lowering."""

    op: str
    args: tuple[ArgSpec, ...]
    seconds: float


@runtime_checkable
class Probe(Protocol):
    """What a tracer implements to hear from the runtime. All methods optional
    in practice: missing ones are skipped."""

    def on_compile(self, info: CompileInfo) -> None: ...

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None: ...

    def on_transfer(self, info: TransferInfo) -> None: ...

    def on_fallback(self, info: FallbackInfo) -> None: ...

    # Begin notifications (issue 9: host-side spans on a profiler timeline). Each is
    # called just before the activity, on the thread that runs it; the matching
    # on_execute / on_compile / on_transfer follows on that thread, unless the
    # activity raised (a probe that keeps spans open must tolerate a missing end).

    def on_execute_begin(self, mode: str, name: str, key: Any) -> None: ...

    def on_compile_begin(self, mode: str, name: str) -> None: ...

    def on_transfer_begin(self, direction: str, op: str) -> None: ...

    # Observed ops and graphs (issue 8: divergence against CPU; see the end of this
    # module). A probe with any of these sees every eager op with its inputs and
    # outputs, and every compiled-graph call with its input arrays.

    def before_op(self, op: Any, args: tuple, kwargs: dict) -> None: ...

    def on_op(self, op: Any, args: tuple, kwargs: dict, outputs: Any) -> None: ...

    def on_graph(self, graph: Any, arrays: list, outputs: Any) -> None: ...


_lock = threading.Lock()
_probes: tuple[Any, ...] = ()
probe_errors: list[tuple[str, BaseException]] = []


_replay_sources: list = []


def add_replay_source(source) -> None:
    """``source()`` yields the CompileInfo of executables compiled so far."""
    _replay_sources.append(source)


def subscribe(probe: Any, *, replay: bool = False) -> None:
    """Start calling ``probe``. With ``replay``, it first hears ``on_compile``
    for every executable compiled before it subscribed (``extra["replayed"]``)."""
    global _probes
    with _lock:
        if probe in _probes:
            return
        _probes = _probes + (probe,)
        _refresh_op_probes()  # issue 8
    if replay and hasattr(probe, "on_compile"):
        for source in list(_replay_sources):
            for info in source():
                replayed = dataclasses.replace(info, extra={**info.extra, "replayed": True})
                try:
                    probe.on_compile(replayed)
                except Exception as exc:  # noqa: BLE001 - a tracer must not break the program
                    probe_errors.append((f"{type(probe).__name__}.on_compile", exc))


def unsubscribe(probe: Any) -> None:
    global _probes
    with _lock:
        _probes = tuple(p for p in _probes if p is not probe)
        _refresh_op_probes()  # issue 8


def active() -> tuple[Any, ...]:
    return _probes


def emit(method: str, *args: Any) -> None:
    """Call ``method`` on every probe; a probe's own error is recorded, never raised."""
    if _quiet and threading.get_ident() in _quiet:
        return  # issue 8: device work a probe does itself is not the program's
    for probe in _probes:
        fn = getattr(probe, method, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a tracer must not break the program
            if getattr(exc, "stops_program", False):
                raise  # issue 5: a guard that tripped on purpose (expect_no_recompiles)
            probe_errors.append((f"{type(probe).__name__}.{method}", exc))
            handler = getattr(probe, "on_internal_error", None)
            if handler is not None:
                try:
                    handler(method, exc)
                except Exception as exc2:  # noqa: BLE001
                    probe_errors.append((f"{type(probe).__name__}.on_internal_error", exc2))


# ---------------------------------------------------------------------------
# Observed ops and graphs (issue 8: divergence against CPU)
# ---------------------------------------------------------------------------
# A probe with ``on_op(op, args, kwargs, outputs)`` (and optionally
# ``before_op(op, args, kwargs)``) sees every eager op with its inputs and
# outputs; one with ``on_graph(graph, arrays, outputs)`` sees every call of a
# compiled graph. The runtime checks ``_op_probes`` (empty unless such a probe
# is subscribed) before calling in, so observation costs nothing otherwise.
# While a probe handles a notification its thread is quiet: device work the
# probe does itself is neither observed nor reported to any probe.

_op_probes: tuple[Any, ...] = ()
_quiet: set[int] = set()


def _refresh_op_probes() -> None:
    global _op_probes
    _op_probes = tuple(p for p in _probes if _wants_ops(p))


def _wants_ops(probe: Any) -> bool:
    # the Protocol's own stubs (a probe subclassing Probe) do not count
    return any(
        getattr(probe, name, None) is not None and getattr(type(probe), name, None) is not getattr(Probe, name)
        for name in ("on_op", "on_graph")
    )


def observe_op(op: Any, args: Any, kwargs: Any, run: Any) -> Any:
    """``run()`` (the op's execution), with ``before_op``/``on_op`` around it."""
    me = threading.get_ident()
    if me in _quiet:
        return run()
    watchers = _op_probes
    _notify(watchers, "before_op", me, op, args, kwargs)
    out = run()
    _notify(watchers, "on_op", me, op, args, kwargs, out)
    return out


def observe_graph(graph: Any, arrays: list, outputs: Any) -> None:
    """A compiled graph ran on ``arrays`` (its inputs) and gave ``outputs``."""
    me = threading.get_ident()
    if me not in _quiet:
        _notify(_op_probes, "on_graph", me, graph, arrays, outputs)


def observed(op: Any, kernel: Any) -> Any:
    """``kernel`` (a device kernel that is not a lowering, e.g. ``copy_``) reporting to op probes."""

    def kernel_observed(*args: Any, **kwargs: Any) -> Any:
        if _op_probes:
            return observe_op(op, args, kwargs, lambda: kernel(*args, **kwargs))
        return kernel(*args, **kwargs)

    kernel_observed.__name__ = getattr(kernel, "__name__", "kernel")
    return kernel_observed


def quiet() -> Any:
    """A context manager: this thread's device work is not observed or reported meanwhile."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        me = threading.get_ident()
        nested = me in _quiet
        _quiet.add(me)
        try:
            yield
        finally:
            if not nested:
                _quiet.discard(me)

    return scope()


def _notify(watchers: tuple, method: str, me: int, *args: Any) -> None:
    _quiet.add(me)
    try:
        for probe in watchers:
            fn = getattr(probe, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - a tracer must not break the program
                probe_errors.append((f"{type(probe).__name__}.{method}", exc))
                handler = getattr(probe, "on_internal_error", None)
                if handler is not None:
                    try:
                        handler(method, exc)
                    except Exception as exc2:  # noqa: BLE001
                        probe_errors.append((f"{type(probe).__name__}.on_internal_error", exc2))
    finally:
        _quiet.discard(me)


# ---------------------------------------------------------------------------
# Transfer checks (issue 5: transfer guards)
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
    if _quiet and threading.get_ident() in _quiet:
        return  # a probe's own device work is not the program's
    for check in _transfer_checks:
        check(direction, op, shape, dtype, nbytes)
