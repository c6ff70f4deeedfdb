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
]


@dataclasses.dataclass(frozen=True, slots=True)
class ArgSpec:
    """One input of an executable: a tensor aval or a static Python value."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    static: Any = None

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


def active() -> tuple[Any, ...]:
    return _probes


def emit(method: str, *args: Any) -> None:
    """Call ``method`` on every probe; a probe's own error is recorded, never raised."""
    for probe in _probes:
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
