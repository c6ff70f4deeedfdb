"""Divergence triage: rounding noise, or an op that computes the wrong thing?

An op over tolerance on its own inputs (``local``) is re-run in float64 on
both sides, the device's lowering and PyTorch on CPU, on the same inputs
upcast (:func:`eager_in_float64`, :func:`node_in_float64`). Rounding noise of
float32 (a different summation order, another ``exp`` polynomial) shrinks by
about 2**29 in float64, so the two sides then match: the verdict is
``"noise"``. An op that computes something else still differs: ``"wrong"``.

A ``drift`` whose op matches CPU on its own inputs comes from the ops before
it. Each value that differs from the CPU run carries its *causes* (the CPU
shadows carry them in eager mode, the graph's nodes in compiled mode): the
ops over tolerance on their own inputs, with their float64 verdict, and the
*crossings*, elements that took another branch of a non-smooth op on the device
than in the CPU run (a relu input at ``+1e-9`` on the device and ``-1e-9`` on
CPU: the relu passes one and zeroes the other, and the gradient through it
differs by a whole value). A drift is ``"wrong"`` when an op before it was
judged wrong, otherwise ``"noise"``, explained by its first crossing
(:class:`~tpu_debug.tracers.events.Crossing`) when there was one.

Non-smooth ops (:data:`BRANCHES`): relu, leaky_relu, threshold (and the relu
backward, threshold_backward), hardtanh (relu6), clamp, abs and sign read the
branch from their input; comparisons, argmax/argmin, max/min over a
dimension, max pooling and sort/topk from their integer or bool result (a
near-tie broken the other way).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
import torch.fx
from tpu_debug.runtime import probes
from tpu_debug.runtime.tensor import from_jax, to_jax
from tpu_debug.tracers.recording.divergence.measures import measure
from tpu_debug.tracers.recording.divergence.op_facts import op_info
from tpu_debug.tracers.recording.divergence.tolerances import tolerance_for
from tpu_debug.tracers.recording.divergence.values import (
    CPU,
    geometry,
    host_copy,
    payload_of,
    tensors,
    value_at,
)
from tpu_debug.tracers.events import Crossing, SourceLocation

__all__ = [
    "BRANCHES",
    "NOT_TRIAGED",
    "RESULT_BRANCHES",
    "Cause",
    "Causes",
    "Triaged",
    "Verdict",
    "as_close_as_cpu",
    "base_name",
    "crossings_in",
    "crossings_out",
    "eager_in_float64",
    "eager_module",
    "graph_module",
    "node_in_float64",
    "op_where",
]

# Float32 rounding noise shrinks by 2**29 (5e8) in float64; an error that shrank by a
# millionfold or more with the precision is rounding, even where float64's own
# tolerance is too tight for it (a sum of large values cancelling).
_SHRINK = 1e-6
_WIDER = {
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.float32: torch.float64,
    torch.complex64: torch.complex128,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the float64 re-run of one op found."""

    verdict: str  # "noise" | "wrong"
    max_abs: float  # the largest difference of the float64 results
    mismatched: int  # elements over float64 tolerance


@dataclasses.dataclass(frozen=True, slots=True)
class Triaged:
    """The triage fields of a divergence event (see ``DivergenceEvent``)."""

    verdict: str = ""
    basis: str = ""
    f64_max_abs: float | None = None
    f64_mismatched: int = 0
    upstream: str = ""
    crossings: tuple[Crossing, ...] = ()

    @classmethod
    def from_float64(cls, v: Verdict | None) -> Triaged:
        if v is None:
            return NOT_TRIAGED
        return cls(v.verdict, "float64", v.max_abs, v.mismatched)


NOT_TRIAGED = Triaged()


# -- causes ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Cause:
    """Why a value differs from the CPU run: an op over tolerance on its own inputs
    (``kind`` its verdict, ``"noise"``/``"wrong"``, or ``"unknown"`` when it could not
    be re-run), a product whose difference is the emulated TPU precision's
    (``"precision"``, see :mod:`.precision`) or a ``"crossing"``. ``seq`` orders causes
    by when they happened."""

    seq: int
    kind: str
    where: str = ""  # an op: "silu at model.py:12"
    crossing: Crossing | None = None


_EMPTY: frozenset = frozenset()
# causes kept per value, of each kind: the first ones (a training loop adds crossings
# every step to values that never stop differing, the parameters)
_KEPT = 4


class Causes:
    """Makes causes and combines the causes of a value's inputs (one per tracer)."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def new(self, kind: str, *, where: str = "", crossing: Crossing | None = None) -> Cause:
        with self._lock:
            seq = next(self._seq)
        return Cause(seq, kind, where, crossing)

    @staticmethod
    def merge(*sets: Iterable[Cause]) -> frozenset[Cause]:
        """The union of ``sets``, keeping the first :data:`_KEPT` causes of each kind."""
        union = set().union(*sets)
        if len(union) <= _KEPT:
            return frozenset(union)
        kept: list[Cause] = []
        per_kind: dict[str, int] = {}
        for c in sorted(union, key=operator.attrgetter("seq")):
            n = per_kind.get(c.kind, 0)
            if n < _KEPT:
                per_kind[c.kind] = n + 1
                kept.append(c)
        return frozenset(kept)

    @staticmethod
    def of_op(verdict: Verdict | None) -> str:
        """The kind of cause an op over tolerance is, from its float64 verdict."""
        return "unknown" if verdict is None else verdict.verdict

    @staticmethod
    def triage(causes: Iterable[Cause]) -> Triaged:
        """A drift's verdict from the causes of its op's inputs (its op matches CPU on them)."""
        ordered = sorted(causes, key=operator.attrgetter("seq"))
        wrong = next((c for c in ordered if c.kind == "wrong"), None)
        if wrong is not None:
            return Triaged("wrong", "upstream", upstream=wrong.where)
        if any(c.kind == "unknown" for c in ordered):
            return NOT_TRIAGED  # an op before it was over tolerance and could not be judged
        crossings = tuple(c.crossing for c in ordered if c.kind == "crossing" and c.crossing is not None)
        # the emulated TPU precision's own rounding is noise as float32's is (precision.py)
        noisy = next((c for c in ordered if c.kind in ("noise", "precision")), None)
        return Triaged("noise", "upstream", upstream=noisy.where if noisy else "", crossings=crossings)


def op_where(name: str, location: SourceLocation | None) -> str:
    """``silu at model.py:12`` (an op cause's ``where``)."""
    if location is None:
        return name
    return f"{name} at {location.file.rsplit('/', 1)[-1]}:{location.line}"


# -- float64 re-runs --------------------------------------------------------------------------


def _wider_dtype(value: Any) -> Any:
    return _WIDER.get(value, value) if isinstance(value, torch.dtype) else value


def _upcast(t: torch.Tensor) -> torch.Tensor:
    wide = _WIDER.get(t.dtype)
    return t.to(wide) if wide is not None else t.clone()


def _map(value: Any, tensor: Callable[[torch.Tensor], torch.Tensor], device: Any) -> Any:
    """``value`` with tensors through ``tensor``, float dtypes widened and devices set to ``device``."""
    if isinstance(value, torch.Tensor):
        return tensor(value)
    if isinstance(value, torch.dtype):
        return _wider_dtype(value)
    if isinstance(value, torch.device):
        return device
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, tensor, device) for v in value) if not isinstance(value, torch.Size) else value
    if isinstance(value, dict):
        return {k: _map(v, tensor, device) for k, v in value.items()}
    return value


def _results(op: Any, args: Any, kwargs: Any, out: Any) -> list[torch.Tensor]:
    """What one call produced: its returned tensors, then the tensors it wrote and did not return."""
    returned = [out] if isinstance(out, torch.Tensor) else list(tensors(out))
    seen = {id(t) for t in returned}
    for pos, name, is_list in op_info(op).writes:
        value = value_at(args, kwargs, pos, name)
        for t in value if is_list and value is not None else [value]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                returned.append(t)
                seen.add(id(t))
    return returned


def _judge(device: list[torch.Tensor], cpu: list[torch.Tensor], f32_max_abs: float,
           tolerances: Mapping | None) -> Verdict | None:
    if len(device) != len(cpu) or not cpu:
        return None
    worst, mismatched, over = 0.0, 0, False
    for d, c in zip(device, cpu):
        if not isinstance(c, torch.Tensor) or tuple(d.shape) != tuple(c.shape):
            return None
        rtol, atol = tolerance_for(c.dtype, tolerances)
        dev = np.asarray(to_jax(d)) if d.device.type == "tpu" else d.detach().numpy()
        m = measure(dev, c.detach(), rtol, atol, False)
        worst = max(worst, m.max_abs)
        mismatched += m.mismatched
        over = over or m.over
    # within float64's tolerance, or shrunk with the precision as rounding does
    noise = not over or worst <= f32_max_abs * _SHRINK
    return Verdict("noise" if noise else "wrong", worst, mismatched)


# Two float32 implementations of one formula (another summation order, another polynomial)
# have rounding errors of the same order, both bounded by the same multiple of float32's
# epsilon times the magnitude of the values the op combines; either may be the luckier one
# on a given input. An op whose device result is within this factor of CPU float32's own
# distance from the float64 result is rounding, however large its inputs make that distance
# (a sum or a normalization over values near 1e5 cancels digits a float32 holds at 2**-7).
# A wrong lowering or a bfloat16 product is orders of magnitude further: bfloat16 keeps 8
# bits of mantissa to float32's 24.
ROUNDING_FACTOR = 4.0


def as_close_as_cpu(op: Any, cpu_args: tuple, cpu_kwargs: dict, device: list, cpu: list) -> bool:
    """Whether the device results ``device`` (numpy) are as close to the float64 result of
    ``op`` on ``cpu_args`` (the CPU copies of the op's own inputs) as PyTorch's float32 results
    ``cpu`` are, within :data:`ROUNDING_FACTOR`: then their difference is float32 rounding
    (of inputs too large for the dtype's tolerance), not a divergence. False when the op does
    not run in float64 on CPU, or has a result that is not floating point."""
    try:
        with torch.no_grad():
            wide = op(*_map(cpu_args, _upcast, CPU), **_map(cpu_kwargs, _upcast, CPU))
    except Exception:  # noqa: BLE001 - no float64 kernel: the dtype's tolerance decides
        return False
    truths = [wide] if isinstance(wide, torch.Tensor) else list(tensors(wide))
    if len(truths) < len(device):
        return False
    for dev, ref, truth in zip(device, cpu, truths):
        if ref is None:
            continue
        if not (ref.dtype.is_floating_point and truth.dtype == torch.float64 and truth.shape == ref.shape):
            return False
        t = truth.numpy()
        dev_err = np.abs(np.asarray(dev, dtype=np.float64) - t)
        cpu_err = np.abs(ref.to(torch.float64).numpy() - t)
        if not (np.isfinite(dev_err).all() and np.isfinite(cpu_err).all()):
            return False
        if dev_err.size and dev_err.max() > ROUNDING_FACTOR * cpu_err.max():
            return False
    return True


def eager_in_float64(
    op: Any, args: tuple, kwargs: dict, before: dict, f32_max_abs: float, tolerances: Mapping | None
) -> Verdict | None:
    """Re-run an eager op in float64 on the device and on CPU, on the inputs it had
    (``before``: the payloads of its argument storages before it ran, by ``id`` of
    storage) upcast; None when either side cannot run it.

    ``f32_max_abs`` is the op's largest local difference: an error that shrank by
    a millionfold with the precision is rounding noise.
    """
    device_bases: dict[int, torch.Tensor] = {}
    cpu_hosts: dict[int, torch.Tensor] = {}

    def on_device(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "tpu":  # a host scalar or index tensor, as the op had it
            return _upcast(t)
        payload = before.get(id(t.untyped_storage()), payload_of(t))
        if payload is None or not hasattr(payload, "reshape"):
            raise LookupError("no payload")
        base = device_bases.get(id(payload))
        if base is None:
            base = device_bases[id(payload)] = from_jax(payload.reshape(-1), t.dtype)
        return _upcast(base.as_strided(t.shape, t.stride(), t.storage_offset()))

    def on_cpu(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "tpu":
            return _upcast(t)
        payload = before.get(id(t.untyped_storage()), payload_of(t))
        host = cpu_hosts.get(id(payload))
        if host is None:
            host = cpu_hosts[id(payload)] = host_copy(payload, t.dtype)
        return _upcast(geometry(host, t))

    try:
        with probes.quiet(), torch.no_grad():
            d_args, d_kwargs = _map(args, on_device, torch.device("tpu")), _map(kwargs, on_device, torch.device("tpu"))
            d_out = op(*d_args, **d_kwargs)
            c_args, c_kwargs = _map(args, on_cpu, CPU), _map(kwargs, on_cpu, CPU)
            c_out = op(*c_args, **c_kwargs)
            return _judge(_results(op, d_args, d_kwargs, d_out), _results(op, c_args, c_kwargs, c_out),
                          f32_max_abs, tolerances)
    except Exception:  # noqa: BLE001 - the re-run is a hint: without it the event says "not triaged"
        return None


def node_in_float64(
    node: torch.fx.Node, args: tuple, kwargs: dict, f32_max_abs: float, tolerances: Mapping | None
) -> Verdict | None:
    """Re-run a compiled graph's node in float64: its op run eagerly on the device (the
    lowering its program uses) and by PyTorch on CPU, on ``args``/``kwargs`` (its
    inputs as XLA computed them, on CPU) upcast; a ``getitem`` node re-runs the op it
    takes an item of (``args`` are then that op's inputs). None when either side cannot run it."""
    index = None
    target = node.target
    if target is operator.getitem:
        src, index = node.args
        target = getattr(src, "target", None)
    if not isinstance(target, torch._ops.OpOverload):
        return None
    try:
        with probes.quiet(), torch.no_grad():
            tpu = torch.device("tpu")
            d_args, d_kwargs = _map(args, lambda t: _upcast(t).to(tpu), tpu), _map(kwargs, lambda t: _upcast(t).to(tpu), tpu)
            d_out = target(*d_args, **d_kwargs)
            c_args, c_kwargs = _map(args, _upcast, CPU), _map(kwargs, _upcast, CPU)
            c_out = target(*c_args, **c_kwargs)
            if index is not None:
                d_out, c_out = d_out[index], c_out[index]
            return _judge([d_out], [c_out], f32_max_abs, tolerances)
    except Exception:  # noqa: BLE001 - a hint only
        return None


# -- crossings -------------------------------------------------------------------------------


def _x(args: Any, kwargs: Any, pos: int, name: str, default: Any = None) -> Any:
    value = value_at(args, kwargs, pos, name)
    return default if value is None else value


def _region(x: torch.Tensor, low: Any, high: Any) -> torch.Tensor:
    """0 below ``low``, 1 between, 2 at or above ``high`` (None: no such bound)."""
    out = torch.zeros(x.shape, dtype=torch.int8)
    if low is not None:
        out += (x > low).to(torch.int8)
    else:
        out += 1
    if high is not None:
        out += (x >= high).to(torch.int8)
    return out


def _sign(t: torch.Tensor) -> torch.Tensor:
    return torch.sign(t) if not t.is_complex() else (t != 0)


# op base name -> (what is crossed, the branch of each element from the op's inputs)
BRANCHES: dict[str, tuple[str, Callable[[Any, Any], torch.Tensor]]] = {
    "relu": ("zero", lambda a, k: _x(a, k, 0, "self") > 0),
    "relu_": ("zero", lambda a, k: _x(a, k, 0, "self") > 0),
    "leaky_relu": ("zero", lambda a, k: _x(a, k, 0, "self") > 0),
    "leaky_relu_": ("zero", lambda a, k: _x(a, k, 0, "self") > 0),
    "threshold": ("threshold", lambda a, k: _x(a, k, 0, "self") > _x(a, k, 1, "threshold")),
    "threshold_": ("threshold", lambda a, k: _x(a, k, 0, "self") > _x(a, k, 1, "threshold")),
    "threshold_backward": ("zero", lambda a, k: _x(a, k, 1, "self") > _x(a, k, 2, "threshold")),
    "hardtanh": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), _x(a, k, 1, "min_val", -1.0), _x(a, k, 2, "max_val", 1.0))),
    "hardtanh_": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), _x(a, k, 1, "min_val", -1.0), _x(a, k, 2, "max_val", 1.0))),
    "hardtanh_backward": ("bounds", lambda a, k: _region(_x(a, k, 1, "self"), _x(a, k, 2, "min_val"), _x(a, k, 3, "max_val"))),
    "relu6": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), 0.0, 6.0)),
    "clamp": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), value_at(a, k, 1, "min"), value_at(a, k, 2, "max"))),
    "clamp_": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), value_at(a, k, 1, "min"), value_at(a, k, 2, "max"))),
    "clamp_min": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), value_at(a, k, 1, "min"), None)),
    "clamp_max": ("bounds", lambda a, k: _region(_x(a, k, 0, "self"), None, value_at(a, k, 1, "max"))),
    "abs": ("zero", lambda a, k: _sign(_x(a, k, 0, "self"))),
    "sign": ("zero", lambda a, k: _sign(_x(a, k, 0, "self"))),
    "sgn": ("zero", lambda a, k: _sign(_x(a, k, 0, "self"))),
    "maximum": ("comparison", lambda a, k: torch.sign(_x(a, k, 0, "self") - _x(a, k, 1, "other"))),
    "minimum": ("comparison", lambda a, k: torch.sign(_x(a, k, 0, "self") - _x(a, k, 1, "other"))),
}
# op base name -> (what is crossed, which result holds the branch: an integer or bool one)
RESULT_BRANCHES: dict[str, tuple[str, int]] = {
    **{name: ("comparison", 0) for name in ("gt", "lt", "ge", "le", "eq", "ne", "gt_", "lt_", "ge_", "le_", "eq_", "ne_")},
    "argmax": ("tie", 0),
    "argmin": ("tie", 0),
    "max": ("tie", 1),  # max.dim: (values, indices); max.default has one result and no branch
    "min": ("tie", 1),
    "max_pool2d_with_indices": ("tie", 1),
    "max_pool3d_with_indices": ("tie", 1),
    "sort": ("tie", 1),
    "topk": ("tie", 1),
}


def base_name(name: str) -> str:
    """``relu`` for ``relu``, ``gt`` for ``gt.Scalar``."""
    return name.split(".", 1)[0]


def crossings_in(name: str, device: tuple[Any, Any], cpu: tuple[Any, Any]) -> tuple[str, int, int] | None:
    """Elements on which a non-smooth op whose branch comes from its inputs took another
    branch: ``device`` and ``cpu`` are its (args, kwargs) with the device's and the CPU
    run's values, on CPU. (what was crossed, elements, numel), or None when none did."""
    found = BRANCHES.get(base_name(name))
    if found is None:
        return None
    branch, read = found
    try:
        d, c = read(*device), read(*cpu)
        if not isinstance(d, torch.Tensor) or not isinstance(c, torch.Tensor) or d.shape != c.shape:
            return None
        crossed = int((d != c).sum())
    except Exception:  # noqa: BLE001 - an argument form the table does not read: no crossing known
        return None
    return (branch, crossed, d.numel()) if crossed else None


def crossings_out(name: str, device: list, cpu: list) -> tuple[str, int, int] | None:
    """The same for an op whose branch is one of its results (``device`` and ``cpu``: its
    results, the device's and the CPU run's, when its result on its own inputs matches CPU)."""
    found = RESULT_BRANCHES.get(base_name(name))
    if found is None:
        return None
    branch, index = found
    if index >= len(device) or index >= len(cpu):
        return None
    d, c = device[index], cpu[index]
    if not isinstance(c, torch.Tensor) or c.is_floating_point() or c.is_complex():
        return None
    d = torch.from_numpy(np.array(d))  # a copy: the device's host array is read-only
    if d.shape != c.shape:
        return None
    crossed = int((d != c).sum())
    return (branch, crossed, c.numel()) if crossed else None


# -- modules ---------------------------------------------------------------------------------

_CALL_IMPL = torch.nn.Module._call_impl.__code__
_module_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def eager_module() -> str:
    """The module whose forward is running (``features.2``), named from the outermost
    module on the stack; empty outside any module."""
    frame = sys._getframe(1)
    inner = outer = None
    while frame is not None:
        if frame.f_code is _CALL_IMPL:
            module = frame.f_locals.get("self")
            if isinstance(module, torch.nn.Module):
                inner = inner or module
                outer = module
        frame = frame.f_back
    if inner is None:
        return ""
    if inner is outer:
        return type(inner).__name__
    names = _module_names.get(outer)
    if names is None or id(inner) not in names:
        names = {id(m): name for name, m in outer.named_modules()}
        _module_names[outer] = names
    return names.get(id(inner), type(inner).__name__)


_INDEX = re.compile(r"\[(\d+)\]")
_MODULES = re.compile(r"\._modules\['([^']*)'\]")
_ROOT = re.compile(r"^L\['[^']*'\]\.?")  # dynamo's name of the compiled function's argument


def graph_module(node: torch.fx.Node) -> str:
    """The module a compiled graph's node comes from (``features.2``), from dynamo's
    ``nn_module_stack`` (paths from the compiled module, ``L['self'].features[2]``);
    the module's class name for the compiled module itself; empty when it has none
    (backward nodes)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    inner = list(stack.values())[-1]
    if not isinstance(inner, tuple) or len(inner) < 2:
        return ""
    path = _INDEX.sub(r".\1", _MODULES.sub(r".\1", _ROOT.sub("", str(inner[0])))).strip(".")
    return path or getattr(inner[1], "__name__", str(inner[1]))
