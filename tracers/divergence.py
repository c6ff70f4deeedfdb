"""Numerical divergence against PyTorch on CPU: the first op or graph node that drifts (issue 8).

With ``trace(divergence=True)`` (``tpu-debug run --divergence``,
``TPU_DEBUG_DIVERGENCE=1``) every eager op on a ``tpu`` tensor is also run by
PyTorch on CPU, every compiled graph is also interpreted node by node on CPU,
and each result is compared with the device's.

Eager ops get two measures:

- ``local``: the CPU op on the device op's own inputs. It isolates the op
  that introduces an error, since an op downstream of it gets the same
  (already wrong) inputs on both sides.
- ``drift``: the CPU op on a CPU *shadow* of the whole computation. Each
  device storage maps (weakly: the shadow dies with the storage) to a CPU
  copy holding what a pure-CPU run would hold there, so drift shows how error
  propagates. Inputs with no shadow (data loaded onto the device, tensors made
  before the trace, storages written behind the runtime's back) take the
  device values as their shadow. Random ops (``randn``, ``dropout``,
  ``bernoulli``, ...) and uninitialised memory (``empty``) are not compared:
  their device values are copied into the shadow, so drift starts from the
  same numbers.

Backward ops are eager ops too: they are compared the same way, with
``phase="backward"``, the autograd node that ran them, and the source line of
the forward op that node belongs to.

Compiled graphs (forward and backward): a debug variant of the graph's XLA
program also returns the values of the graph's tensor nodes (every node, or
every ``sample``-th); the FX graph is interpreted on CPU copies of the same
inputs (``torch.fx.Interpreter``), and each node is compared: ``drift`` is the
CPU interpretation against XLA's value, ``local`` the node's op on XLA's own
values of its inputs (when those were returned). Random nodes take XLA's
values. Events name the FX node, its aten op, the graph and the node's source
line (``node.meta["stack_trace"]``).

Measures per op (over all its tensor outputs and written arguments): max
absolute error, max relative error, ULP distance (floating point, counted in
the CPU result's dtype), elements over tolerance, NaN/Inf present on one side
only, dtype mismatch, and ``ratio``: the worst error in units of its
tolerance. An element is over tolerance when ``|device - cpu| > atol + rtol *
|cpu|`` (the rule of ``torch.testing.assert_close``) or when it is NaN/Inf on
one side only. Default tolerances, ``assert_close``'s:

    =====================  ========  ======
    dtype                  rtol      atol
    =====================  ========  ======
    float64, complex128    1e-7      1e-7
    float32, complex64     1.3e-6    1e-5
    float16                1e-3      1e-5
    bfloat16               1.6e-2    1e-5
    integers, bool         0         0
    =====================  ========  ======

Override them with ``tolerances=`` (``{"float32": (1e-4, 1e-6)}`` or the
string ``"float32=1e-4:1e-6,bfloat16=0.05"``; ``TPU_DEBUG_TOLERANCES``), or
switch them off with ``"off"``: nothing is then over tolerance, but an op
whose device output holds NaN/Inf while its device inputs were finite is still
reported (``nan_origin``). The first op over tolerance is marked ``first``
(per measure in eager mode, per graph and measure in compiled mode).

With TPU numerics (``trace(numerics="tpu")``, see
``tpu_debug.runtime.config``), an op over tolerance is re-run on the device at
precision ``"highest"`` (first occurrence per op and line; once per graph in
compiled mode): ``highest=True`` says the divergence disappears there.

Recording: events for ops over tolerance, NaN/Inf origins and dtype
mismatches, at most ``max_per_site`` per (op, line, measure); every
occurrence is counted in the run's ``divergence`` metadata, with how many ops
and nodes were compared and which could not be (no CPU kernel for them).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.fx
from tpu_debug.runtime import probes
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.tensor import PAYLOAD_ATTR, _Uninit, from_jax, to_jax
from tpu_debug.tracers.events import DivergenceEvent, SourceLocation
from tpu_debug.tracers.hlo import _location_from_stack_trace
from tpu_debug.tracers.location import user_location

__all__ = [
    "DEFAULT_TOLERANCES",
    "DivergenceTracer",
    "Measures",
    "compare",
    "format_tolerances",
    "parse_tolerances",
]

# (rtol, atol) per dtype: torch.testing.assert_close's defaults
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
_EXACT = (0.0, 0.0)
_OFF = (math.inf, math.inf)
_DTYPES = {str(d).removeprefix("torch."): d for d in DEFAULT_TOLERANCES}
_CPU = torch.device("cpu")
_BF16 = np.dtype("bfloat16") if hasattr(np, "bfloat16") else None
try:  # ml_dtypes ships with jax: numpy's view of bfloat16 arrays
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - jax always brings it
    pass

# ops whose device values are copied into the shadow instead of compared
_RANDOM = frozenset(
    {
        "bernoulli",
        "bernoulli_",
        "dropout",
        "native_dropout",
        "_fused_dropout",
        "feature_dropout",
        "alpha_dropout",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform",
        "uniform_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "multinomial",
        "poisson",
        "binomial",
        "rrelu_with_noise",
        "_standard_gamma",
    }
)
_UNINITIALISED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"}
)
_COPIES = {"copy_": 1, "_to_copy": 0}  # op -> position of its source argument


# ---------------------------------------------------------------------------------
# Tolerances
# ---------------------------------------------------------------------------------


def parse_tolerances(spec: Any) -> dict[torch.dtype, tuple[float, float]] | None:
    """The tolerance table ``spec`` asks for.

    Args:
        spec: None (defaults), ``"off"``, a mapping ``{"float32": (rtol, atol)}``
            (a single number sets rtol and atol alike), or the same as a string
            ``"float32=1e-4:1e-6,bfloat16=0.05"``.

    Returns:
        The full table (dtype -> (rtol, atol)); None for the defaults.

    Raises:
        ValueError: an unknown dtype or a value that is not a non-negative number.
        TypeError: ``spec`` is neither a string nor a mapping.
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() == "off":
            return {d: _OFF for d in DEFAULT_TOLERANCES} | {None: _OFF}  # type: ignore[dict-item]
        items: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(
                    f"tolerance {part!r} is not dtype=rtol[:atol]; e.g. 'float32=1e-4:1e-6,bfloat16=0.05' or 'off'"
                )
            items[name.strip()] = tuple(value.split(":")) if ":" in value else value
        spec = items
    if not isinstance(spec, Mapping):
        raise TypeError(f"tolerances={spec!r}: expected a mapping dtype -> (rtol, atol), a string, or 'off'")
    table = dict(DEFAULT_TOLERANCES)
    for name, value in spec.items():
        key = name if isinstance(name, torch.dtype) else _DTYPES.get(str(name).strip().removeprefix("torch."))
        if key not in DEFAULT_TOLERANCES:
            raise ValueError(f"tolerance for {name!r}: not a floating dtype; use one of {', '.join(_DTYPES)}")
        pair = value if isinstance(value, (tuple, list)) else (value, value)
        try:
            rtol, atol = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise ValueError(f"tolerance for {name}: {value!r} is not rtol[:atol] (numbers)") from None
        if not (rtol >= 0 and atol >= 0):
            raise ValueError(f"tolerance for {name}: {value!r} must not be negative")
        table[key] = (rtol, atol)
    return table


def format_tolerances(table: Mapping[Any, tuple[float, float]] | None) -> str:
    """The canonical string of a tolerance table: its entries that differ from the
    defaults (``""`` for the defaults themselves), or ``"off"``."""
    table = DEFAULT_TOLERANCES if table is None else table
    if all(v == _OFF for v in table.values()):
        return "off"
    return ",".join(
        f"{str(d).removeprefix('torch.')}={r:g}:{a:g}"
        for d, (r, a) in table.items()
        if d is not None and DEFAULT_TOLERANCES.get(d) != (r, a)
    )


# ---------------------------------------------------------------------------------
# Comparing one result
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Measures:
    """How far a device result is from the CPU result (one output, or an op's worst)."""

    numel: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device_dtype: str = ""
    exact: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    ulp: float | None = None
    mismatched: int = 0
    ratio: float = 0.0  # the worst error in units of its tolerance
    allowed: float = 0.0  # the tolerance (absolute) at that element
    rtol: float = 0.0
    atol: float = 0.0
    device_nonfinite: int = 0  # NaN/Inf on the device only
    cpu_nonfinite: int = 0  # NaN/Inf on CPU only
    device_has_nonfinite: bool = False

    @property
    def over(self) -> bool:
        return self.mismatched > 0

    @property
    def dtype_mismatch(self) -> bool:
        return bool(self.device_dtype) and self.device_dtype != self.dtype

    def merge(self, other: Measures) -> Measures:
        """The op-level view of two outputs' measures: the worst of each, counts added."""
        worst = other if other.ratio > self.ratio or (other.over and not self.over) else self
        out = dataclasses.replace(worst)
        out.numel = self.numel + other.numel
        out.exact = self.exact and other.exact
        out.max_abs = max(self.max_abs, other.max_abs)
        out.max_rel = max(self.max_rel, other.max_rel)
        ulps = [u for u in (self.ulp, other.ulp) if u is not None]
        out.ulp = max(ulps) if ulps else None
        out.mismatched = self.mismatched + other.mismatched
        out.device_nonfinite = self.device_nonfinite + other.device_nonfinite
        out.cpu_nonfinite = self.cpu_nonfinite + other.cpu_nonfinite
        out.device_has_nonfinite = self.device_has_nonfinite or other.device_has_nonfinite
        if other.dtype_mismatch and not out.dtype_mismatch:
            out.dtype, out.device_dtype = other.dtype, other.device_dtype
        return out


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = _dtype_name_of(dtype)
    return name


def _dtype_name_of(dtype: Any) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    from tpu_debug.runtime.dtypes import to_torch_dtype

    return str(to_torch_dtype(dtype)).removeprefix("torch.")


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def tolerance_for(dtype: torch.dtype, table: Mapping | None) -> tuple[float, float]:
    table = DEFAULT_TOLERANCES if table is None else table
    found = table.get(dtype)
    if found is not None:
        return found
    return table.get(None, _EXACT)  # type: ignore[call-overload]


def compare(
    device: np.ndarray, cpu: torch.Tensor, rtol: float, atol: float, *, detail: bool = True
) -> Measures:
    """Measures of ``device`` (the device's value, as numpy) against ``cpu`` (PyTorch's).

    Args:
        device: the device result.
        cpu: the CPU result (the reference).
        rtol, atol: an element is over tolerance when ``|device - cpu| > atol +
            rtol * |cpu|``; ``inf`` switches the check off.
        detail: also max relative error, ratio and ULP (without: only what
            decides whether to report, cheaper).

    Returns:
        The measures; ``exact`` when both hold the same bits.

    Example:
        >>> m = compare(np.float32([1, 2]), torch.tensor([1.0, 2.5]), 1.3e-6, 1e-5)
        >>> (m.max_abs, m.mismatched)
        (0.5, 1)
    """
    with np.errstate(all="ignore"):
        return _compare(device, cpu, rtol, atol, detail)


def _compare(device: np.ndarray, cpu: torch.Tensor, rtol: float, atol: float, detail: bool) -> Measures:
    # numpy's floating-point warnings must be off here (compare, or _single_threaded, does it)
    ref = _numpy(cpu)
    m = Measures(
        numel=int(ref.size), shape=tuple(ref.shape), dtype=_dtype_name(cpu.dtype), rtol=rtol, atol=atol
    )
    m.device_dtype = m.dtype if device.dtype == ref.dtype else _dtype_name(device.dtype)
    floating = cpu.dtype.is_floating_point or cpu.dtype.is_complex
    off = math.isinf(rtol) or math.isinf(atol)
    if device.shape != ref.shape:
        m.exact = False
        m.mismatched = 0 if off else max(int(device.size), m.numel)
        m.max_abs = m.max_rel = m.ratio = math.inf
        return m
    same_dtype = device.dtype == ref.dtype
    if same_dtype and device.tobytes() == ref.tobytes():
        if floating and m.numel:
            m.device_has_nonfinite = not bool(
                np.isfinite(device.astype(np.float32) if device.dtype == _BF16 else device).all()
            )
        return m
    m.exact = False
    if same_dtype and ref.dtype.kind == "f" and ref.dtype.itemsize >= 4:
        d, r = device, ref  # float32/64: compare as they are
    else:
        wide = np.complex128 if cpu.dtype.is_complex else np.float64
        d, r = device.astype(wide), ref.astype(wide)
    diff = np.abs(d - r)
    worst = float(diff.max()) if diff.size else 0.0
    if math.isfinite(worst):  # every element finite on both sides: the cheap tiers
        m.max_abs = worst
        if off or worst <= atol:
            return m
        allowed = atol + rtol * np.abs(r)
        over = diff > allowed
        m.mismatched = int(np.count_nonzero(over))
        if m.mismatched and detail:
            _fill_detail(m, device, ref, r, diff, allowed, None, cpu)
        return m
    # NaN/Inf somewhere: which side, and is it the same on both?
    fd, fr = np.isfinite(d), np.isfinite(r)
    m.device_has_nonfinite = not bool(fd.all())
    m.device_nonfinite = int((~fd & fr).sum())
    m.cpu_nonfinite = int((fd & ~fr).sum())
    both = fd & fr
    allowed = atol + rtol * np.abs(r)
    if not off:
        over = ~(diff <= allowed)  # NaN differences count as over
        neither = ~(fd | fr)
        if neither.any():  # the same NaN/Inf on both sides is no divergence
            same = (d == r) | (np.isnan(d) & np.isnan(r))
            over &= ~(neither & same)
        m.mismatched = int(np.count_nonzero(over))
    if both.any():
        m.max_abs = float(diff[both].max())
        if detail:
            _fill_detail(m, device, ref, r, diff, allowed, both, cpu)
    if m.device_nonfinite or m.cpu_nonfinite:
        m.max_abs = m.max_rel = m.ratio = math.inf
    return m


def _fill_detail(m: Measures, device, ref, r, diff, allowed, both, cpu: torch.Tensor) -> None:
    """Max relative error, the worst ratio to tolerance and the ULP distance, over ``both``
    (the elements finite on both sides; None: all)."""
    db = (diff if both is None else diff[both]).astype(np.float64)
    rb = np.abs(r if both is None else r[both]).astype(np.float64)
    nonzero = rb > 0
    if nonzero.any():  # relative to exact zeros is infinite and says nothing: left out
        m.max_rel = float((db[nonzero] / rb[nonzero]).max())
    else:
        m.max_rel = math.inf if m.max_abs > 0 else 0.0
    ab = (allowed if both is None else allowed[both]).astype(np.float64)
    ratios = np.where(ab > 0, db / np.where(ab > 0, ab, 1.0), np.where(db > 0, np.inf, 0.0))
    i = int(np.argmax(ratios))
    m.ratio, m.allowed = float(ratios.flat[i]), float(ab.flat[i])
    if cpu.dtype.is_floating_point:
        m.ulp = _ulp(device, ref, both)


def _ulp(device: np.ndarray, ref: np.ndarray, both: np.ndarray | None) -> float:
    """Max distance in units in the last place of ``ref``'s dtype, over elements finite on both sides."""
    size = ref.dtype.itemsize
    ints = {2: np.int16, 4: np.int32, 8: np.int64}.get(size)
    if ints is None:
        return 0.0
    dev = device.astype(ref.dtype) if device.dtype != ref.dtype else device
    low = np.iinfo(ints).min

    def ordered(a: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(a).view(ints)
        bits = (bits if both is None else bits[both]).astype(np.int64)
        # sign-magnitude -> two's-complement order (-0.0 and 0.0 both map to 0)
        out = np.where(bits < 0, low - bits, bits)
        return out.astype(np.float64) if size == 8 else out

    return float(np.abs(ordered(dev) - ordered(ref)).max())


# ---------------------------------------------------------------------------------
# The tracer
# ---------------------------------------------------------------------------------


class _Shadow:
    """A storage's CPU shadow: its values in a pure-CPU run, and the device payload it shadows."""

    __slots__ = ("host", "payload")

    def __init__(self, host: torch.Tensor, payload: Any) -> None:
        self.host = host  # contiguous, any shape (the payload's, or a covering tensor's)
        self.payload = payload


@dataclasses.dataclass(frozen=True, slots=True)
class _OpInfo:
    name: str
    writes: tuple[tuple[int, str, bool], ...]
    skip: str | None  # None | "random" | "uninitialised"
    copy_source: int | None


_infos: dict[Any, _OpInfo] = {}


def _op_info(op: Any) -> _OpInfo:
    info = _infos.get(op)
    if info is None:
        schema = op._schema
        base = schema.name.split("::", 1)[-1]
        name = base if op._overloadname == "default" else f"{base}.{op._overloadname}"
        writes = tuple(
            (i, a.name, isinstance(a.type, torch.ListType))
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        skip = None
        if base in _RANDOM or any(a.name == "generator" for a in schema.arguments):
            skip = "random"
        elif base in _UNINITIALISED:
            skip = "uninitialised"
        info = _infos[op] = _OpInfo(name, writes, skip, _COPIES.get(base))
    return info


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif type(value) in _LEAVES:
        return
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _on_tpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def _payload(t: torch.Tensor) -> Any:
    return getattr(t.untyped_storage(), PAYLOAD_ATTR, None)


def _host_copy(payload: Any, dtype: torch.dtype) -> torch.Tensor:
    """A CPU copy of a storage payload, in the payload's shape, contiguous (a fresh tensor:
    CPU ops may write it)."""
    if payload is None or type(payload) is _Uninit:
        n = int(getattr(payload, "numel", 0) or 0)
        return torch.zeros(n, dtype=dtype)
    a = np.array(payload)  # a copy
    if a.dtype is _BF16 or a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _geometry(host: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t``'s view of its storage's values ``host`` (contiguous, any shape)."""
    if t.storage_offset() == 0 and host.shape == t.shape and t.is_contiguous():
        return host
    return host.view(-1).as_strided(tuple(t.shape), t.stride(), t.storage_offset())


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value) if value.device.type == "tpu" else value
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is tuple or kind is list:
        return kind([_map(v, fn) for v in value])
    if isinstance(value, (list, tuple)):  # FX's immutable_list, torch.Size
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):  # FX's immutable_dict too
        return {k: _map(v, fn) for k, v in value.items()}
    if kind is torch.device and value.type == "tpu":
        return _CPU
    return value


_LEAVES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.layout})


def _value_at(args: tuple, kwargs: dict, pos: int, name: str) -> Any:
    return args[pos] if pos < len(args) else kwargs.get(name)


def _finite(t: torch.Tensor) -> bool:
    if not (t.dtype.is_floating_point or t.dtype.is_complex) or t.numel() == 0:
        return True
    return bool(torch.isfinite(t).all())


@dataclasses.dataclass(slots=True)
class _Site:
    count: int = 0
    recorded: int = 0
    highest: bool | None = None
    checked_highest: bool = False


class DivergenceTracer:
    """Compares every device op and compiled-graph node with PyTorch on CPU (a probe).

    Args:
        writer: the run writer (events and the ``divergence`` metadata go there).
        clock: seconds since the run started (the run's timestamps).
        tolerances: a table from :func:`parse_tolerances` (None: the defaults).
        sample: compare every ``sample``-th tensor node of a compiled graph (1: all).
        max_per_site: events recorded per (op, line, measure); later ones are only counted.
        record_error: where a failure of this tracer is reported (the program goes on).

    Example:
        >>> with tpu_debug.trace(divergence=True) as session:
        ...     loss = model(x).sum()
        >>> session.first_divergence()
    """

    def __init__(
        self,
        writer: Any,
        *,
        clock: Callable[[], float],
        tolerances: Mapping | None = None,
        sample: int = 1,
        max_per_site: int = 5,
        record_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.clock = clock
        self.tolerances = tolerances
        self.sample = max(1, int(sample))
        self.max_per_site = max_per_site
        self.record_error = record_error
        self._shadows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._first: set[tuple] = set()
        self._sites: dict[tuple, _Site] = {}
        self._forward_lines: dict[int, SourceLocation | None] = {}
        self._uncompared: dict[str, str] = {}
        self._graph_highest: dict[str, dict[str, bool]] = {}
        self.ops_compared = 0
        self.ops_copied = 0
        self.graphs_compared = 0
        self.nodes_compared = 0
        self.over = {"local": 0, "drift": 0}
        self.nan_origins = 0

    # -- probe methods ------------------------------------------------------------------

    def before_op(self, op: Any, args: tuple, kwargs: dict) -> None:
        # jax payloads are immutable: holding the current ones is the pre-op snapshot
        # (a CPU tensor's storage has none: it maps to None, harmlessly)
        snapshot = {}
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                snapshot[id(storage)] = getattr(storage, PAYLOAD_ATTR, None)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, torch.Tensor):
                        storage = t.untyped_storage()
                        snapshot[id(storage)] = getattr(storage, PAYLOAD_ATTR, None)
        self._local.pending = (op, snapshot)

    def on_op(self, op: Any, args: tuple, kwargs: dict, out: Any) -> None:
        pending = getattr(self._local, "pending", None)
        self._local.pending = None
        if pending is None or pending[0] is not op:
            return
        self._note_forward_line(args, kwargs)
        with _single_threaded():
            self._check_op(op, _op_info(op), args, kwargs or {}, out, pending[1])

    def on_graph(self, graph: Any, arrays: list, outputs: Any) -> None:
        try:
            with _single_threaded():
                self._check_graph(graph, arrays)
        except Exception as exc:  # noqa: BLE001 - one graph failing to compare is reported, not raised
            self._error(f"divergence of graph {graph.graph_id}", exc)

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(f"DivergenceTracer.{method}", exc)

    def _error(self, where: str, exc: BaseException) -> None:
        if self.record_error is not None:
            self.record_error(where, f"{type(exc).__name__}: {exc}")

    # -- eager ops ------------------------------------------------------------------------

    def _check_op(self, op: Any, info: _OpInfo, args: tuple, kwargs: dict, out: Any, before: dict) -> None:
        # device outputs: returned tensors, then written arguments not returned
        returned = [out] if isinstance(out, torch.Tensor) else list(_tensors(out))
        written: list[tuple[torch.Tensor, int, str, int]] = []  # (tensor, position, name, list index)
        seen = {id(t) for t in returned} if info.writes else None
        for pos, name, is_list in info.writes:
            value = _value_at(args, kwargs, pos, name)
            for i, t in enumerate(value if is_list and value is not None else [value]):
                if _on_tpu(t) and id(t) not in seen:
                    written.append((t, pos, name, i))
                    seen.add(id(t))
        outputs = [t for t in returned if _on_tpu(t)] + [w[0] for w in written]
        if not outputs:
            return
        loaded = info.copy_source is not None and not _on_tpu(
            _value_at(args, kwargs, info.copy_source, "src")
        )
        if info.skip is not None or loaded:
            self.ops_copied += 1
            for t in outputs:
                self._adopt_device(t, before)
            return
        if info.name in self._uncompared:
            for t in outputs:
                self._adopt_device(t, before)
            return

        # local: the CPU op on the device's own inputs; drift: on the shadows
        hosts: dict[int, torch.Tensor] = {}
        drifted = False

        def local_arg(t: torch.Tensor) -> torch.Tensor:
            payload = before.get(id(t.untyped_storage()), _payload(t))
            host = hosts.get(id(payload))
            if host is None:
                host = hosts[id(payload)] = _host_copy(payload, t.dtype)
            return _geometry(host, t)

        shadows = self._shadows
        fresh: dict[int, torch.Tensor] = {}

        def drift_arg(t: torch.Tensor) -> torch.Tensor:
            nonlocal drifted
            storage = t.untyped_storage()
            payload = before.get(id(storage), _payload(t))
            entry = shadows.get(storage)
            if entry is not None and entry.payload is payload:
                drifted = True
                return _geometry(entry.host, t)
            if not info.writes:
                return local_arg(t)
            host = fresh.get(id(payload))  # the local run wrote its copies: start again
            if host is None:
                host = fresh[id(payload)] = _host_copy(payload, t.dtype)
            return _geometry(host, t)

        l_args, l_kwargs = _map(args, local_arg), _map(kwargs, local_arg)
        try:
            l_out = op(*l_args, **l_kwargs)
        except Exception as exc:  # noqa: BLE001 - no CPU kernel for this call: noted, not compared
            self._uncompared.setdefault(info.name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            for t in outputs:
                self._adopt_device(t, before)
            return
        l_refs = self._refs(l_out, returned, written, l_args, l_kwargs)
        if info.writes:
            l_refs = [r.clone() if r is not None else None for r in l_refs]
        d_args, d_kwargs = _map(args, drift_arg), _map(kwargs, drift_arg)
        if drifted:
            try:
                d_out = op(*d_args, **d_kwargs)
                d_refs = self._refs(d_out, returned, written, d_args, d_kwargs)
            except Exception:  # noqa: BLE001 - the shadow's values made the CPU op fail: restart from the device's
                d_refs = l_refs
        else:
            d_refs = l_refs
        self.ops_compared += 1

        local = drift = None
        compared = []
        for t, l_ref, d_ref in zip(outputs, l_refs, d_refs):
            if l_ref is None:
                continue
            dev = np.asarray(to_jax(t))
            rtol, atol = tolerance_for(l_ref.dtype, self.tolerances)
            lm = _compare(dev, l_ref, rtol, atol, False)
            dm = lm if d_ref is l_ref else _compare(dev, d_ref, rtol, atol, False)
            local = lm if local is None else local.merge(lm)
            drift = dm if drift is None else drift.merge(dm)
            compared.append((dev, l_ref, d_ref, rtol, atol))
            self._set_shadow(t, d_ref, dm.exact, before)
        if local is None:
            return
        nan_origin = local.device_has_nonfinite and _made_nonfinite(before, args, kwargs)
        if local.over or nan_origin or local.dtype_mismatch or drift.over:
            self._report_op(
                op, info, args, kwargs, before, outputs, l_refs, local, drift, nan_origin, compared
            )

    def _refs(self, cpu_out: Any, returned: list, written: list, cpu_args: Any, cpu_kwargs: Any) -> list:
        """The CPU results lined up with the device outputs (returned, then written)."""
        refs: list = []
        cpu_returned = [cpu_out] if isinstance(cpu_out, torch.Tensor) else list(_tensors(cpu_out))
        if len(cpu_returned) != len(returned):
            cpu_returned = [None] * len(returned)
        refs.extend(r for t, r in zip(returned, cpu_returned) if _on_tpu(t))
        for _t, pos, name, i in written:
            value = _value_at(cpu_args, cpu_kwargs, pos, name)
            refs.append(value[i] if isinstance(value, (list, tuple)) else value)
        return refs

    def _report_op(
        self, op, info, args, kwargs, before, outputs, l_refs, local, drift, nan_origin, compared
    ) -> None:
        def detailed(which: int) -> Callable[[], Measures]:
            def measure() -> Measures:
                out = None
                for dev, *refs, rtol, atol in compared:
                    m = _compare(dev, refs[which], rtol, atol, True)
                    out = m if out is None else out.merge(m)
                return out

            return measure

        node = torch._C._current_autograd_node()
        if node is not None:
            phase, autograd = "backward", node.name()
            location = self._forward_lines.get(node._sequence_nr())
        else:
            phase, autograd, location = "forward", "", user_location(1)
        if local.over or nan_origin or local.dtype_mismatch:
            site = self._site(("eager", "local", phase, None, info.name, location))
            if local.over and not site.checked_highest and runtime_config.product_passes():
                site.checked_highest = True
                site.highest = self._at_highest(op, args, kwargs, before, outputs, l_refs)
            self._record(
                "eager",
                "local",
                info.name,
                info.name,
                local,
                location,
                phase,
                None,
                autograd,
                nan_origin,
                site.highest if local.over else None,
                site,
                detailed(0),
            )
        if drift.over:
            site = self._site(("eager", "drift", phase, None, info.name, location))
            self._record(
                "eager",
                "drift",
                info.name,
                info.name,
                drift,
                location,
                phase,
                None,
                autograd,
                False,
                None,
                site,
                detailed(1),
            )

    def _note_forward_line(self, args: tuple, kwargs: dict) -> None:
        """Remember the line of a forward op that records an autograd node (its backward's line)."""
        if not torch.is_grad_enabled() or torch._C._current_autograd_node() is not None:
            return
        if any(t.requires_grad for t in _tensors((args, kwargs))):
            lines = self._forward_lines
            if len(lines) > 200_000:
                for k in list(lines)[:100_000]:
                    del lines[k]
            # the op's node took the sequence number before its kernel ran
            lines[torch._C._autograd._get_sequence_nr() - 1] = user_location(1)

    def _at_highest(self, op, args, kwargs, before, outputs, l_refs) -> bool | None:
        """Re-run the op on the device at precision "highest": is it then within tolerance?"""
        made: dict[int, torch.Tensor] = {}

        def device_copy(t: torch.Tensor) -> torch.Tensor:
            payload = before.get(id(t.untyped_storage()), _payload(t))
            if payload is None or not hasattr(payload, "reshape"):
                raise LookupError("no payload")
            base = made.get(id(payload))
            if base is None:
                base = made[id(payload)] = from_jax(payload.reshape(-1), t.dtype)
            return base.as_strided(t.shape, t.stride(), t.storage_offset())

        def keep(value: Any) -> Any:  # devices stay on tpu here
            if isinstance(value, torch.Tensor):
                return device_copy(value) if value.device.type == "tpu" else value
            if isinstance(value, (list, tuple)):
                return type(value)(keep(v) for v in value)
            if isinstance(value, dict):
                return {k: keep(v) for k, v in value.items()}
            return value

        saved = runtime_config.matmul_precision
        try:
            h_args, h_kwargs = keep(args), keep(kwargs)
            runtime_config.matmul_precision = "highest"
            with probes.quiet(), torch.no_grad():
                h_out = op(*h_args, **h_kwargs)
        except Exception:  # noqa: BLE001 - the re-run is a hint; without it the event says "not checked"
            return None
        finally:
            runtime_config.matmul_precision = saved
        info = _op_info(op)
        returned = list(_tensors(h_out))
        written = []
        for pos, name, is_list in info.writes:
            value = _value_at(h_args, h_kwargs, pos, name)
            written.extend(value if is_list else [value])
        seen: set[int] = set()
        h_outputs = []
        for t in returned + written:
            if _on_tpu(t) and id(t) not in seen:
                seen.add(id(t))
                h_outputs.append(t)
        if len(h_outputs) != len(outputs):
            return None
        for t, ref in zip(h_outputs, l_refs):
            if ref is None:
                continue
            rtol, atol = tolerance_for(ref.dtype, self.tolerances)
            if _compare(np.asarray(to_jax(t)), ref, rtol, atol, False).over:
                return False
        return True

    # -- shadows --------------------------------------------------------------------------

    def _adopt_device(self, t: torch.Tensor, before: dict) -> None:
        """``t``'s shadow becomes the device's value (random or loaded data)."""
        storage = t.untyped_storage()
        entry = self._shadows.get(storage)
        if entry is None:
            return
        if entry.payload is before.get(id(storage), entry.payload) and not _covers(t):
            _geometry(entry.host, t).copy_(_host_copy(to_jax(t), t.dtype))
            entry.payload = _payload(t)
        else:
            del self._shadows[storage]

    def _set_shadow(self, t: torch.Tensor, value: torch.Tensor | None, exact: bool, before: dict) -> None:
        storage = t.untyped_storage()
        payload = _payload(t)
        entry = self._shadows.get(storage)
        valid = entry is not None and entry.payload is before.get(id(storage), None)
        if value is None or tuple(value.shape) != tuple(t.shape):
            if entry is not None:
                del self._shadows[storage]
            return
        if value.dtype != t.dtype:
            value = value.to(t.dtype)
        if _covers(t):
            if exact:
                if entry is not None:
                    del self._shadows[storage]
            else:
                self._shadows[storage] = _Shadow(value.detach().contiguous(), payload)
            return
        if valid:
            _geometry(entry.host, t).copy_(value)
            entry.payload = payload
        elif exact:
            if entry is not None:
                del self._shadows[storage]
        else:
            host = _host_copy(payload, t.dtype)
            _geometry(host, t).copy_(value)
            self._shadows[storage] = _Shadow(host, payload)

    # -- compiled graphs ------------------------------------------------------------------

    def _check_graph(self, graph: Any, arrays: list) -> None:
        gm = graph.gm
        nodes = [
            n
            for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
        ]
        if not nodes:
            return
        random_nodes = {n.name for n in gm.graph.nodes if _is_random_node(n)}
        forced_names = {
            n.name
            for n in nodes
            if n.name in random_nodes
            or any(isinstance(a, torch.fx.Node) and a.name in random_nodes for a in n.args[:1])
        }
        if self.sample > 1:
            # every sample-th node, with its inputs (so its local check can run), and random nodes
            picked = [n for i, n in enumerate(nodes) if i % self.sample == self.sample - 1]
            names = {n.name for n in picked} | forced_names
            names.update(a.name for n in picked for a in n.all_input_nodes if a.op == "call_function")
            chosen = frozenset(names)
        else:
            chosen = frozenset(n.name for n in nodes)
        values = graph.debug_values(arrays, chosen)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        inputs = []
        for n, a in zip(placeholders, arrays):
            val = n.meta.get("val")
            if hasattr(a, "shape") and isinstance(val, torch.Tensor):
                inputs.append(_host_copy(a, val.dtype))
            else:
                inputs.append(a)
        xla = {name: v for name, v in values.items()}
        phase = "backward" if graph.kind == "backward" else "forward"
        results: list[tuple] = []  # (node, local, drift, device value, local ref, CPU value, rtol, atol)
        host_cache: dict[str, torch.Tensor] = {}

        def host(name: str, node: torch.fx.Node) -> torch.Tensor:
            t = host_cache.get(name)
            if t is None:
                val = node.meta["val"]
                arr = xla[name]
                t = host_cache[name] = _host_copy(arr, val.dtype)
            return t

        inputs_by_node = dict(zip(placeholders, inputs))
        tolerances = self.tolerances

        locals_made: dict[torch.fx.Node, Any] = {}

        def local_of(node: torch.fx.Node, interp: _CpuGraph) -> Any:
            if node in locals_made:
                return locals_made[node]
            src = node.args[0] if node.target is operator.getitem else None
            if isinstance(src, torch.fx.Node) and src.op == "call_function" and src.name not in xla:
                whole = local_of(src, interp)  # a multi-output op: its own local value, then the item
                value = None if whole is None else whole[node.args[1]]
                locals_made[node] = value
                return value
            ok = True

            def arg(a: Any) -> Any:
                nonlocal ok
                if isinstance(a, torch.fx.Node):
                    if a in inputs_by_node:
                        return inputs_by_node[a]
                    if a.name in xla:
                        return host(a.name, a)
                    if not isinstance(a.meta.get("val"), torch.Tensor) and a in interp.env:
                        return interp.env[a]
                    ok = False
                    return None
                if isinstance(a, (list, tuple)):
                    return type(a)(arg(x) for x in a)
                if isinstance(a, torch.device) and a.type == "tpu":
                    return _CPU
                return a

            a_args, a_kwargs = arg(node.args), {k: arg(v) for k, v in node.kwargs.items()}
            value = None
            if ok:
                with torch.no_grad():
                    value = node.target(*a_args, **a_kwargs)
            locals_made[node] = value
            return value

        exact: set[torch.fx.Node] = set(placeholders)  # nodes whose CPU value is XLA's, bit for bit

        def on_value(node: torch.fx.Node, cpu_value: Any, interp: _CpuGraph) -> None:
            if node.name not in xla or not isinstance(cpu_value, torch.Tensor):
                if not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):
                    exact.add(node)  # a size or other Python value: the same on both sides
                return
            dev = np.asarray(xla[node.name])
            rtol, atol = tolerance_for(cpu_value.dtype, tolerances)
            drift = _compare(dev, cpu_value, rtol, atol, False)
            local, ref = None, None
            if node.name in forced_names:
                pass
            elif all(a in exact for a in node.all_input_nodes):
                local, ref = drift, cpu_value  # same inputs on both sides: the local check is the drift one
            else:
                try:
                    ref = local_of(node, interp)
                except Exception:  # noqa: BLE001 - no CPU kernel for this node's op: drift only
                    ref = None
                if isinstance(ref, torch.Tensor):
                    local = _compare(dev, ref, rtol, atol, False)
            if drift.exact:
                exact.add(node)
            results.append((node, local, drift, dev, ref, cpu_value, rtol, atol))

        forced = {name: None for name in forced_names}
        interp = _CpuGraph(gm, forced, lambda name, node: host(name, node), on_value)
        interp.run(*inputs)
        self.graphs_compared += 1
        self.nodes_compared += len(results)

        over_local = [
            (r[0], r[1]) for r in results if r[1] is not None and (r[1].over or r[1].dtype_mismatch)
        ]
        highest: dict[str, bool] = {}
        if over_local and runtime_config.product_passes():
            highest = self._graph_highest.get(graph.graph_id) or {}
            if not highest:
                highest = self._graph_at_highest(graph, arrays, chosen, over_local, inputs_by_node, host)
                self._graph_highest[graph.graph_id] = highest

        def detailed(dev: np.ndarray, ref: torch.Tensor, rtol: float, atol: float) -> Callable[[], Measures]:
            return lambda: _compare(dev, ref, rtol, atol, True)

        for node, lm, dm, dev, ref, cpu_value, rtol, atol in results:
            nan_origin = dm.device_has_nonfinite and _node_made_nonfinite(node, xla, inputs_by_node)
            local_event = lm is not None and (lm.over or nan_origin or lm.dtype_mismatch)
            if not (local_event or dm.over or nan_origin):
                continue
            location = _location_from_stack_trace(node.meta.get("stack_trace"))
            target = (
                _op_info(node.target).name
                if isinstance(node.target, torch._ops.OpOverload)
                else str(getattr(node.target, "__name__", node.target))
            )
            where = (phase, graph.graph_id, node.name, location)
            if local_event:
                self._record(
                    "compiled",
                    "local",
                    node.name,
                    target,
                    lm,
                    location,
                    phase,
                    graph.graph_id,
                    "",
                    nan_origin,
                    highest.get(node.name) if lm.over else None,
                    self._site(("compiled", "local", *where)),
                    detailed(dev, ref, rtol, atol),
                )
            elif lm is None and nan_origin:
                self._record(
                    "compiled",
                    "local",
                    node.name,
                    target,
                    dm,
                    location,
                    phase,
                    graph.graph_id,
                    "",
                    True,
                    None,
                    self._site(("compiled", "local", *where)),
                    detailed(dev, cpu_value, rtol, atol),
                )
            if dm.over:
                self._record(
                    "compiled",
                    "drift",
                    node.name,
                    target,
                    dm,
                    location,
                    phase,
                    graph.graph_id,
                    "",
                    False,
                    None,
                    self._site(("compiled", "drift", *where)),
                    detailed(dev, cpu_value, rtol, atol),
                )

    def _graph_at_highest(self, graph, arrays, chosen, over_local, inputs_by_node, host) -> dict[str, bool]:
        """Run the graph's debug variant at precision "highest"; which nodes are then within tolerance?"""
        saved = runtime_config.matmul_precision
        try:
            runtime_config.matmul_precision = "highest"
            with probes.quiet():
                values = graph.debug_values(arrays, chosen)
        except Exception:  # noqa: BLE001 - a hint only
            return {}
        finally:
            runtime_config.matmul_precision = saved
        out = {}
        for node, lm in over_local:
            if node.name not in values:
                continue
            # the node's local reference is the CPU op on the (default-precision) inputs: compare the
            # highest-precision value with it, as the eager re-run does
            try:
                args = []
                for a in node.args:
                    if isinstance(a, torch.fx.Node):
                        args.append(inputs_by_node[a] if a in inputs_by_node else host(a.name, a))
                    elif isinstance(a, torch.device) and a.type == "tpu":
                        args.append(_CPU)
                    else:
                        args.append(a)
                with torch.no_grad():
                    ref = node.target(*args, **{k: v for k, v in node.kwargs.items()})
            except Exception:  # noqa: BLE001, S112 - no CPU reference for this node: no verdict
                continue
            dev = np.asarray(values[node.name])
            rtol, atol = tolerance_for(ref.dtype, self.tolerances)
            out[node.name] = not _compare(dev, ref, rtol, atol, False).over
        return out

    # -- events ---------------------------------------------------------------------------

    def _site(self, key: tuple) -> _Site:
        site = self._sites.get(key)
        if site is None:
            with self._lock:
                site = self._sites.setdefault(key, _Site())
        return site

    def _record(
        self,
        mode: str,
        measure: str,
        name: str,
        target: str,
        m: Measures,
        location: SourceLocation | None,
        phase: str,
        graph: str | None,
        autograd: str,
        nan_origin: bool,
        highest: bool | None,
        site: _Site,
        detail: Callable[[], Measures] | None = None,
    ) -> None:
        with self._lock:
            site.count += 1
            if m.over:
                self.over[measure] += 1
            if nan_origin:
                self.nan_origins += 1
            first_key = (mode, graph, measure)
            first = m.over and first_key not in self._first
            if first:
                self._first.add(first_key)
            if site.recorded >= self.max_per_site and not first and not nan_origin:
                return
            site.recorded += 1
        if detail is not None:
            m = detail()
        self.writer.put(
            DivergenceEvent(
                self.writer.new_id(),
                self.clock(),
                mode,
                threading.get_native_id(),
                location,
                name,
                measure,
                m.max_abs,
                m.max_rel,
                m.ulp,
                m.mismatched,
                nan_origin,
                m.allowed if m.allowed else m.atol,
                first,
                rtol=m.rtol,
                atol=m.atol,
                ratio=m.ratio,
                numel=m.numel,
                shape=m.shape,
                dtype=m.dtype,
                device_dtype=m.device_dtype,
                device_nonfinite=m.device_nonfinite,
                cpu_nonfinite=m.cpu_nonfinite,
                phase=phase,
                graph=graph,
                target=target,
                autograd_node=autograd,
                highest=highest,
            )
        )

    def summary(self) -> dict[str, Any]:
        """What the run's ``divergence`` metadata holds: counts, and occurrences per site."""
        sites = []
        for (mode, measure, phase, graph, name, location), site in sorted(
            self._sites.items(), key=lambda kv: -kv[1].count
        ):
            sites.append(
                {
                    "mode": mode,
                    "measure": measure,
                    "phase": phase,
                    "graph": graph,
                    "name": name,
                    "file": location.file if location else None,
                    "line": location.line if location else None,
                    "count": site.count,
                    "recorded": site.recorded,
                }
            )
        return {
            "numerics": runtime_config.numerics,
            "precision": runtime_config.effective_precision(),
            "tolerances": format_tolerances(self.tolerances) or "default",
            "sample": self.sample,
            "ops_compared": self.ops_compared,
            "ops_copied": self.ops_copied,
            "graphs_compared": self.graphs_compared,
            "nodes_compared": self.nodes_compared,
            "over_tolerance": dict(self.over),
            "nan_origins": self.nan_origins,
            "not_compared": dict(self._uncompared),
            "sites": sites[:500],
        }

    def close(self) -> None:
        """Write the summary into the run's metadata (the trace calls this at its end)."""
        self.writer.set_meta(divergence=self.summary())


class _single_threaded:
    """PyTorch's CPU ops on one thread, without autograd, and numpy quiet, meanwhile. The reference ops are
    small and interleave with XLA's: OpenMP workers spinning after each of them starve
    XLA's threads (40x slower on 2 cores); one thread has no workers to spin."""

    __slots__ = ("grad", "numpy", "threads")

    def __enter__(self) -> None:
        # NaN/Inf differences are measured, not warned about (set once here, not per comparison)
        self.numpy = np.seterr(all="ignore")
        self.grad = torch.is_grad_enabled()
        if self.grad:
            torch._C._set_grad_enabled(False)
        self.threads = torch.get_num_threads()
        if self.threads != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.threads != 1:
            torch.set_num_threads(self.threads)
        if self.grad:
            torch._C._set_grad_enabled(True)
        np.seterr(**self.numpy)


def _covers(t: torch.Tensor) -> bool:
    """``t`` is its whole storage, densely (writing it replaces the storage's value)."""
    payload = _payload(t)
    size = getattr(payload, "size", None)
    return t.storage_offset() == 0 and t.is_contiguous() and size == t.numel()


def _made_nonfinite(before: dict, args: tuple, kwargs: dict) -> bool:
    """An op whose output holds NaN/Inf made them itself: its floating inputs (read before
    it wrote any) are finite. Not when there are none, or a scalar argument is NaN/Inf:
    an attention mask of -inf is made on purpose."""
    floats = [p for p in before.values() if _is_float_payload(p)]
    if not floats:
        return False

    def scalars(value: Any) -> Iterator[float]:
        if isinstance(value, float):
            yield value
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from scalars(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from scalars(v)

    if any(not math.isfinite(v) for v in scalars((args, kwargs))):
        return False
    return all(_all_finite(p) for p in floats)


def _is_float_payload(payload: Any) -> bool:
    dtype = getattr(payload, "dtype", None)
    return dtype is not None and (np.dtype(dtype) == _BF16 or np.dtype(dtype).kind in "fc")


def _all_finite(payload: Any) -> bool:
    """No NaN/Inf in a jax payload (or a CPU tensor); non-float values are finite."""
    if isinstance(payload, torch.Tensor):
        return _finite(payload)
    if payload is None or not hasattr(payload, "dtype") or type(payload).__name__ == "_Uninit":
        return True
    a = np.asarray(payload)
    if a.dtype == _BF16:
        a = a.astype(np.float32)
    elif a.dtype.kind not in "fc":
        return True
    return bool(np.isfinite(a).all())


def _node_made_nonfinite(node: torch.fx.Node, xla: dict, inputs: dict) -> bool:
    """The compiled-mode form of :func:`_made_nonfinite` (an input not returned gives no verdict)."""
    floats = [
        a
        for a in node.all_input_nodes
        if isinstance(a.meta.get("val"), torch.Tensor)
        and (a.meta["val"].dtype.is_floating_point or a.meta["val"].dtype.is_complex)
    ]
    if not floats:
        return False
    scalars: list[float] = []
    torch.fx.node.map_aggregate(
        (node.args, node.kwargs), lambda v: scalars.append(v) if isinstance(v, float) else v
    )
    if any(not math.isfinite(v) for v in scalars):
        return False
    for a in floats:
        if a.name in xla:
            if not _all_finite(xla[a.name]):
                return False
        elif isinstance(inputs.get(a), torch.Tensor):
            if not _finite(inputs[a]):
                return False
        else:
            return False  # an input not returned (sampled out): no verdict
    return True


def _is_random_node(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and _op_info(target).skip is not None
    )


class _CpuGraph(torch.fx.Interpreter):
    """An FX graph run on CPU; random nodes take the device's values; each value is reported."""

    def __init__(
        self, gm: torch.fx.GraphModule, forced: dict, device_value: Callable, on_value: Callable
    ) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.forced = forced
        self.device_value = device_value
        self.on_value = on_value

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.name in self.forced:
            value = self.device_value(n.name, n)
        else:
            with torch.no_grad():
                value = super().run_node(n)
        if n.op == "call_function":
            self.on_value(n, value, self)
        return value

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return super().call_function(target, _map(args, _no_tpu), _map(kwargs, _no_tpu))


def _no_tpu(t: torch.Tensor) -> torch.Tensor:
    raise RuntimeError(f"a tpu tensor of shape {tuple(t.shape)} reached the CPU interpretation of a graph")
