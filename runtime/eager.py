"""The eager interpreter: every aten op on a `tpu` tensor, one XLA executable each.

An op call is turned into a cache key (overload, input shapes/dtypes, static
arguments). A miss lowers the op's JAX function with ``jax.jit``, compiles it
and keeps the executable; a hit calls it directly. PyTorch's own meta kernel
for the op gives the result dtypes and shapes, so PyTorch's type promotion
(Python scalars included) holds by construction, and PyTorch's error for a bad
call is the error the user sees.

Mutation is read from the op schema (``alias_info.is_write``): in-place and
``out=`` variants run their functional lowering and write the results back;
other mutating ops return the written arguments' new values.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import threading
import time
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src import array as jax_array

from tpu_debug.core.errors import (
    DeviceMismatchError,
    LoweringBugError,
    NoLoweringError,
    OpArgumentError,
    OutputMismatchError,
    UnsupportedError,
)
from tpu_debug.runtime import dry_mode as _dryrun
from tpu_debug.runtime import probes
from tpu_debug.runtime import rng_state as _random
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.compile_cache import local_compile, program_identity
from tpu_debug.runtime.config import config
from tpu_debug.runtime.distributed import placement as _placement
from tpu_debug.runtime.distributed import rankcheck as _rankcheck
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype
from tpu_debug.runtime.ops.registry import Lowering, lookup
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import CompileInfo, FallbackInfo, TransferInfo
from tpu_debug.runtime import tensor as _tensor_module
from tpu_debug.runtime import value_checks
from tpu_debug.runtime.dtypes import TORCH_TO_JAX as _JAX_OF
from tpu_debug.runtime.tensor import (
    PAYLOAD_ATTR,
    _create_empty,
    LazyArray,
    from_jax,
    offset_operand,
    read_parts,
    set_payload,
    to_jax,
    view_pattern,
    view_value,
    write,
)

__all__ = ["cache_stats", "clear_cache", "float64_ops", "ExecutableStats", "to_cpu", "from_cpu", "plan_for"]

_OpOverload = torch._ops.OpOverload
_Tensor = torch.Tensor
_ArrayImpl = jax_array.ArrayImpl  # a computed payload (not lazy, not yet written)
_SCALARS = (int, float, bool, complex)


class _Spec(tuple):
    """A tensor's place in a cache key: (shape, dtype, on_cpu)."""

    __slots__ = ()


class _Dyn(tuple):
    """A Python float passed to the executable as a float32 input."""

    __slots__ = ()


_DYN = _Dyn(("float",))
_NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)
_WIDE = (torch.float64, torch.complex128, torch.complex64)


def _dyn_scalar(value, arrays: list):
    t = type(value)
    if t is float:
        arrays.append(np.float32(value))
        return _DYN
    if (t is list or t is tuple) and value and all(type(v) is float for v in value):
        for v in value:
            arrays.append(np.float32(v))
        return (t, (_DYN,) * len(value))
    return None


@dataclasses.dataclass(slots=True)
class ExecutableStats:
    """Counters for one cached executable."""

    op: str
    key: Any
    compile_seconds: float
    hits: int = 0
    calls: int = 0
    float64: bool = False  # float64/complex128 values in or out (a TPU has no float64)


@dataclasses.dataclass(slots=True)
class _Executable:
    fn: Any
    out_struct: tuple
    out_dtypes: tuple
    stats: ExecutableStats
    info: CompileInfo | None = None
    # an op over devices of several processes: what the ranks compare before each run
    spmd: Any = None
    # the one output's shape, once the executable ran, when run_now may wrap it directly
    out_shape: Any = None


# ---------------------------------------------------------------------------
# Per-overload plans (schema-derived mutation handling)
# ---------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Plan:
    op: _OpOverload
    name: str
    kind: str | None  # None (pure) | "inplace" | "out" | "mutates"
    functional: _OpOverload | None
    writes: tuple[tuple[int, str, bool], ...]  # (position, name, is_list)
    lowering: Lowering | None
    returns_list: bool
    meta_op: _OpOverload | None = None
    strip: frozenset = frozenset()
    # positions / names of `Scalar` (number) arguments: float values there are
    # executable inputs, not constants, so a new learning rate does not recompile
    scalar_args: frozenset = frozenset()
    dynamic_scalars: bool = True
    cpu_indices: bool = False  # index tensors may live on the host, as CUDA allows
    # the lowering reads the float32 matmul precision while tracing (Lowering.precision),
    # so the precision is part of its key: changing it recompiles
    precision: bool = False
    # calls whose signature (see _signature) is known: signature -> executable (eager) and
    # -> template (lazy), found without building the key; only for lowerings with no
    # random key and no data-dependent shapes
    fast_ok: bool = False
    # position of a backward's ``output_mask`` (bool[N]): the gradients it masks off are
    # returned undefined (None), as PyTorch's kernels return them; DTensor's sharding rules
    # read None there, and autograd does not ask for them
    mask_pos: int = -1
    # the lowering's argument checks (Lowering.check), run before every call, and its
    # checks of argument values (Lowering.values, runtime/value_checks.py)
    check: Any = None
    values: Any = None
    fast: dict = dataclasses.field(default_factory=dict)
    lazy_fast: dict = dataclasses.field(default_factory=dict)
    # an in-place op's signature -> its program donating the written tensors' buffers
    # (False: that signature cannot donate); see _donor
    donors: dict = dataclasses.field(default_factory=dict)


class _PlanTable(dict):
    """op -> plan, mirrored in ``by_id`` (id(op) -> plan) for the hot path: an OpOverload
    hashes in Python, a tenth of a small op's host time. A plan holds its op, so an id
    stays its op's while the plan is here; removing a plan (to plan its op again)
    removes it from both."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[int, _Plan] = {}

    def __setitem__(self, op, plan) -> None:
        super().__setitem__(op, plan)
        self.by_id[id(op)] = plan

    def __delitem__(self, op) -> None:
        super().__delitem__(op)
        self.by_id.pop(id(op), None)

    def pop(self, op, *default):
        self.by_id.pop(id(op), None)
        return super().pop(op, *default)

    def clear(self) -> None:
        super().clear()
        self.by_id.clear()


_plans: dict[_OpOverload, _Plan] = _PlanTable()
_plans_by_id = _plans.by_id
_CPU_INDEX_OPS = frozenset(
    f"aten::{n}" for n in ("index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put")
)


def _arg_names(schema, *, skip_out: bool) -> list[str]:
    return [
        a.name
        for a in schema.arguments
        if not (skip_out and a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
    ]


def _functional_of(op: _OpOverload, kind: str) -> _OpOverload | None:
    ns = torch.ops.aten
    base = op._schema.name.split("::")[1]
    if kind == "inplace":
        base = base[:-1] if base.endswith("_") else base
    packet = getattr(ns, base, None)
    if packet is None:
        return None
    want = _arg_names(op._schema, skip_out=True)
    want_types = _arg_types(op._schema)
    overloads = [getattr(packet, o) for o in packet.overloads()]
    if kind == "inplace":
        same = getattr(packet, op._overloadname, None)
        if same is not None:
            return same
    by_name = None
    for cand in overloads:
        s = cand._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments):
            continue
        if [a.name for a in s.arguments] == want:
            # overloads can share argument names (clamp(Scalar? min) / clamp.Tensor(Tensor? min)):
            # the one whose argument types match too is the functional form
            if _arg_types(s) == want_types:
                return cand
            by_name = by_name or cand
    return by_name


def _arg_types(schema) -> list[str]:
    return [str(a.type) for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)]


def op_name(op: _OpOverload) -> str:
    """``add.Tensor``, ``relu`` (the default overload is not spelled out)."""
    name = op._schema.name.split("::", 1)[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def _wrapped_number_args(op: _OpOverload, lowering: Lowering | None) -> set:
    """The ``Tensor`` arguments of ``op`` where a Python float is an input of the executable,
    as it is in the ``Scalar`` overload of the same lowering.

    Python's ``x / s``, ``x * s``, ``x + s`` call ``div.Tensor``, ``mul.Tensor``, ``add.Tensor``
    with the float in the ``Tensor`` argument (PyTorch's bindings hide the ``Scalar``
    overloads), so an optimizer's ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` passes a new
    float each step: baked into the key, each value would compile again. The two overloads
    are one computation (PyTorch wraps the number as a tensor of the lowest promotion rank),
    and where they share a lowering the float goes where the ``Scalar`` overload's goes."""
    if lowering is None:
        return set()
    base = lowering.op
    twin_name = base._overloadname.replace("Tensor", "Scalar", 1)
    if twin_name == base._overloadname:
        return set()
    twin = getattr(getattr(torch.ops.aten, base._schema.name.split("::", 1)[1], None), twin_name, None)
    twin_lowering = lookup(twin) if twin is not None else None
    if twin_lowering is None or twin_lowering.fn is not lowering.fn or twin_lowering.static_scalars:
        return set()
    mine, theirs = op._schema.arguments, twin._schema.arguments
    return {
        a.name if a.kwarg_only else i
        for i, (a, b) in enumerate(zip(mine, theirs))
        if a.name == b.name and str(a.type) == "Tensor" and str(b.type) == "number"
    }


def plan_for(op: _OpOverload) -> _Plan:
    plan = _plans.get(op)
    if plan is not None:
        return plan
    schema = op._schema
    writes = tuple(
        (i, a.name, isinstance(a.type, torch.ListType))
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    own = lookup(op)
    if own is not None and (own.view or own.graph_only):
        own = None  # eager views alias storage (device.py); the lowering is for graphs
    kind: str | None = None
    functional: _OpOverload | None = op
    lowering = own
    if writes:
        if own is not None and own.mutates_returns:
            kind = "mutates"
        elif schema.arguments[writes[0][0]].kwarg_only:
            kind = "out"
        elif schema.name.endswith("_"):
            kind = "inplace"
        else:
            kind = "mutates"
        if kind in ("out", "inplace"):
            functional = _functional_of(op, kind)
            if lowering is None and functional is not None:
                lowering = lookup(functional)
                if lowering is not None and lowering.graph_only:
                    lowering = None
    scalar_args = set()
    for i, a in enumerate(schema.arguments):
        if str(a.type) in ("number", "Optional[number]", "List[number]"):
            scalar_args.add(a.name if a.kwarg_only else i)
    scalar_args |= _wrapped_number_args(op, lowering)
    plan_scalars = frozenset(scalar_args)
    returns_list = len(schema.returns) == 1 and isinstance(schema.returns[0].type, torch.ListType)
    plan = _Plan(op, op_name(op), kind, functional, writes, lowering, returns_list)
    plan.scalar_args = plan_scalars
    plan.cpu_indices = schema.name in _CPU_INDEX_OPS
    plan.precision = lowering is not None and lowering.precision
    plan.dynamic_scalars = bool(plan_scalars) and lowering is not None and not lowering.static_scalars
    plan.fast_ok = lowering is not None and not lowering.rng and not lowering.eager_only
    plan.check = lowering.check if lowering is not None else None
    plan.values = lowering.values if lowering is not None else None
    plan.mask_pos = next((i for i, a in enumerate(schema.arguments)
                          if a.name == "output_mask" and str(a.type).startswith("List[bool]")), -1)
    out_via_functional = kind == "out" and functional is not None and lowering is not own
    plan.meta_op = functional if out_via_functional else op
    if out_via_functional:
        plan.strip = frozenset(name for _pos, name, _l in writes)
    _plans[op] = plan
    return plan


# ---------------------------------------------------------------------------
# Keys: tensors become avals, everything else is static
# ---------------------------------------------------------------------------


def _scalar_key(v):
    if type(v) is float and v != v:
        return (float, "nan")
    return (type(v), v)


def _skeleton(value, arrays: list, cpu_ok: bool = False):
    """Hashable stand-in for ``value``; tensors are appended to ``arrays``."""
    if isinstance(value, _Tensor):
        if value.is_cpu:
            if value.dim() != 0 and not cpu_ok:
                raise DeviceMismatchError(
                    "Expected all tensors to be on the same device, but found at least "
                    "two devices, tpu:0 and cpu! Move the CPU tensor with .to('tpu')"
                )
            arrays.append(_cpu_to_jax(value, implicit=True))
            return _Spec((value.shape, value.dtype, True))  # CUDA allows 0-dim CPU tensors (and CPU indices)
        # most operands: a whole computed payload on one device, read as it is (read_parts'
        # first case without its calls, which are a third of an op's key)
        arr = getattr(value.untyped_storage(), PAYLOAD_ATTR, None)
        if type(arr) is _ArrayImpl and not _placement.active:
            shape, dtype = value.shape, value.dtype
            if arr.shape == shape and arr.dtype == to_jax_dtype(dtype) and not value.storage_offset() and (
                value.is_contiguous()
            ):
                arrays.append(arr)
                return _Spec((shape, dtype, False))
        arr, view = read_parts(value)
        arrays.append(arr)
        # where the payload lives: False for one device, else its sharding over a mesh (an
        # executable is compiled for its inputs' shardings)
        where = (_placement.placement(arr) or False) if _placement.active else False
        if view is None:
            return _Spec((value.shape, value.dtype, where))
        # a view: the executable reads it from the storage array itself, starting at an
        # offset passed as one more operand, so the key holds how it is read, not where
        pattern, offset = view
        if where is not False:
            # a view of a storage sharded over a mesh: its offset stays in the key (a
            # scalar operand would live on one device, not on the storage's mesh)
            return _Spec((value.shape, value.dtype, where, arr.shape, pattern, value.storage_offset()))
        if offset is not None:
            arrays.append(offset)
        return _Spec((value.shape, value.dtype, where, arr.shape, pattern))
    t = type(value)
    if t in _SCALARS:
        return _scalar_key(value)
    if t is list or t is tuple:
        return (t, tuple(_skeleton(v, arrays, cpu_ok) for v in value))
    if isinstance(value, torch.Generator):
        raise UnsupportedError("generator= is only meaningful for random ops; drop it from this call")
    if isinstance(value, torch.SymInt):
        return (int, int(value))
    return value


def _fill(skel, it):
    """Inverse of _skeleton inside the traced function."""
    if type(skel) is _Dyn:
        return next(it)
    if type(skel) is _Spec:
        if len(skel) == 3:
            return next(it)
        pattern = skel[4]
        storage = next(it)
        if len(skel) == 6:  # a view of a sharded storage, its offset in the key
            offset = skel[5]
        else:
            offset = None if pattern[0] == "whole" else next(it)
        return view_value(storage, tuple(skel[0]), pattern, offset)
    t = type(skel)
    if t is tuple and len(skel) == 2 and (skel[0] is list or skel[0] is tuple):
        return skel[0](_fill(v, it) for v in skel[1])
    if t is tuple and len(skel) == 2 and skel[0] in _SCALARS:
        v = skel[1]
        return float("nan") if v == "nan" and skel[0] is float else v
    return skel


def _to_meta(skel):
    if type(skel) is _Dyn:
        return 0.5
    if type(skel) is _Spec:
        return torch.empty(skel[0], dtype=skel[1], device="meta")
    t = type(skel)
    if t is tuple and len(skel) == 2 and (skel[0] is list or skel[0] is tuple):
        return skel[0](_to_meta(v) for v in skel[1])
    if t is tuple and len(skel) == 2 and skel[0] in _SCALARS:
        v = skel[1]
        return float("nan") if v == "nan" and skel[0] is float else v
    if isinstance(skel, torch.device) and skel.type == "tpu":
        return torch.device("meta")
    return skel


class _RuntimeValue:
    """What a spec shows for a Python float passed as an input of the executable (a _Dyn):
    each call gives its own value, so the key holds none (``_to_meta``'s 0.5 is only a
    stand-in for shape inference)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "runtime value"


_RUNTIME_VALUE = _RuntimeValue()


def _shown(skel):
    """A non-tensor argument as a spec shows it: its value when baked into the key."""
    if type(skel) is _Dyn:
        return _RUNTIME_VALUE
    if type(skel) is tuple and len(skel) == 2 and (skel[0] is list or skel[0] is tuple):
        return skel[0](_shown(v) for v in skel[1])
    return _to_meta(skel)


def _pattern_text(pattern: tuple) -> str:
    """How a view is read, as a recompile diff shows it (see tensor.view_pattern)."""
    kind = pattern[0]
    if kind == "permuted":
        return f"permuted {pattern[1]}"
    if kind == "strided":
        return f"strided {pattern[1]}"
    return kind


def _specs(schema, skel_args, skel_kwargs) -> tuple[ArgSpec, ...]:
    out = []
    names = [a.name for a in schema.arguments]

    # Python numbers in `Scalar` arguments that are baked in, and view geometry, so a
    # recompile diff can name what changed
    numbers = {a.name for a in schema.arguments if str(a.type) in ("number", "Optional[number]", "List[number]")}

    def one(name, s):
        if type(s) is _Spec:
            shape, dtype = s[0], s[1]
            layout = (("device", "cpu"),) if len(s) == 3 and s[2] is True else ()
            if len(s) >= 5:
                layout = (("storage", tuple(s[3])), ("view", _pattern_text(s[4])))
            if len(s) == 6:
                layout += (("offset", s[5]),)
            if not isinstance(s[2], bool):  # sharded over a mesh
                layout += (("sharding", _placement.describe(s[2])),)
            out.append(ArgSpec(name, tuple(shape), str(dtype).removeprefix("torch."), layout=layout))
        elif type(s) is tuple and len(s) == 2 and (s[0] is list or s[0] is tuple) and any(
            type(v) is _Spec for v in s[1]
        ):
            for i, v in enumerate(s[1]):
                one(f"{name}[{i}]", v)
        else:
            scalar = name in numbers and type(s) is tuple and len(s) == 2 and s[0] in _SCALARS
            out.append(ArgSpec(name, static=_shown(s) if not isinstance(s, torch.Tensor) else None, scalar=scalar))

    for i, s in enumerate(skel_args):
        one(names[i] if i < len(names) else f"arg{i}", s)
    for k, s in skel_kwargs:
        one(k, s)
    return tuple(out)


# ---------------------------------------------------------------------------
# Host <-> device
# ---------------------------------------------------------------------------


def _cpu_to_jax(t: torch.Tensor, *, implicit: bool = False, op: str | None = None) -> jax.Array:
    if _dryrun.active is not None:  # a dry run moves no data: the device copy is its shape
        return _dryrun.Abstract(tuple(t.shape), to_jax_dtype(t.dtype))
    op = op or ("scalar" if implicit else "copy")  # callers name what moved the data
    if t.dim() > 64:
        raise UnsupportedError(
            f"a {t.dim()}-dimensional tensor cannot move to the tpu device: NumPy and XLA arrays have "
            "at most 64 dimensions; reshape it to 64 or fewer before moving it"
        )
    if probes._transfer_checks:  # a transfer guard may refuse the copy (raises)
        probes.check_transfer("h2d", op, tuple(t.shape),
                              str(t.dtype).removeprefix("torch."), t.numel() * t.element_size())
    if probes._probes:
        probes.transferring("h2d", op)
    start = time.perf_counter()
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        host = t.contiguous().view(torch.uint16).numpy().view(jnp.bfloat16)
    else:
        host = t.numpy()
    with jax.enable_x64(True):
        # device_put of a private copy: no convert program to compile per new shape,
        # and the payload never aliases the user's CPU tensor
        payload = np.array(host, dtype=to_jax_dtype(t.dtype), copy=True)
        arr = jax.device_put(payload)
    if probes._probes:
        seconds = time.perf_counter() - start  # the copy's time, without the fingerprint's
        probes.transferred(
            TransferInfo("h2d", t.numel() * t.element_size(), tuple(t.shape),
                         str(t.dtype).removeprefix("torch."),
                         op, seconds, payload_digest(payload)),
        )
    return arr


# Payloads up to this size are fingerprinted whole. CRC-32 reads memory at about the speed
# of the private copy made just before it (7 GB/s: 0.04 ms for a 256 KiB mask, 2 ms at the
# cap), so tracing adds at most the cost of the copy itself. Larger payloads (a big batch at
# every step) get no fingerprint: hashing a 1 GiB batch per step would dominate the step,
# and a sampled fingerprint could call two batches that differ outside the samples equal,
# which would tell a user to hoist data that changes.
DIGEST_MAX_BYTES = 16 << 20


def payload_digest(payload: np.ndarray) -> str | None:
    """The fingerprint of a contiguous host payload (its byte count and CRC-32), or None
    above :data:`DIGEST_MAX_BYTES`. Equal digests mean equal bytes but for a 2**-32 chance
    per pair, which is enough to say "the same data again" about a call site's uploads."""
    if payload.nbytes > DIGEST_MAX_BYTES:
        return None
    raw = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    return f"{payload.nbytes}:{zlib.crc32(raw):08x}"


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """A new `tpu` tensor with the values of CPU tensor ``t``."""
    return from_jax(_cpu_to_jax(t), t.dtype)


def to_cpu(t: torch.Tensor, *, op: str = "copy") -> torch.Tensor:
    """A new CPU tensor with the values of `tpu` tensor ``t``."""
    arr = to_jax(t)
    if type(arr) is _dryrun.Abstract:  # a dry run's tensor: there is no value to copy
        raise _dryrun.value_needed(op, t)
    if probes._transfer_checks:  # a transfer guard may refuse the copy (raises)
        probes.check_transfer("d2h", op, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                              t.numel() * t.element_size())
    if probes._probes:
        probes.transferring("d2h", op)
    start = time.perf_counter()
    host = np.array(arr) if not _placement.active else _placement.host_value(arr)
    # the program was waited for: value-check reports of programs run by now are read here
    value_checks.poll()
    if t.dtype == torch.bfloat16:
        out = torch.from_numpy(host.view(np.uint16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(host)
    if probes._probes:
        probes.transferred(
            TransferInfo("d2h", out.numel() * out.element_size(), tuple(out.shape),
                         str(out.dtype).removeprefix("torch."), op, time.perf_counter() - start),
        )
    return out


# ---------------------------------------------------------------------------
# The executable cache
# ---------------------------------------------------------------------------


def announce_evicted(mode: str, name: str, key: Any) -> None:
    """Tell the tracers that the executable of ``key`` was dropped from its cache
    (``mode`` "eager" or "compiled", ``name`` its op or graph id): the next call with
    that key compiles again."""
    if probes._probes:
        probes.evicted(mode, name, key)


def forget_signatures(gone: Any = None) -> None:
    """Drop the plans' signature -> executable and -> template entries that lead to ``gone``
    (an executable or template that left its cache: no signature may find it again), and
    the donating programs of those signatures; every entry when ``gone`` is None.

    Only ``gone``'s entries go: a full cache evicts at each new compile, and dropping every
    signature then would send each op back to its key and compile each donor again."""
    for plan in list(_plans.values()):
        if gone is None:
            plan.fast.clear()
            plan.lazy_fast.clear()
            plan.donors.clear()
            continue
        for sig in [sig for sig, exe in list(plan.fast.items()) if exe is gone]:
            plan.fast.pop(sig, None)
            plan.donors.pop(sig, None)
        for sig in [sig for sig, tpl in list(plan.lazy_fast.items()) if tpl is gone]:
            plan.lazy_fast.pop(sig, None)


def _forget(key: Any, exe: _Executable) -> None:
    """An executable the cache's bound pushed out."""
    forget_signatures(exe)
    _keep_float64_count(exe)
    announce_evicted("eager", exe.stats.op, key)


def _keep_float64_count(exe: _Executable) -> None:
    if exe.stats.float64:  # float64_ops() counts every call, cached or not
        _float64_dropped[exe.stats.op] += exe.stats.calls


# Recency comes from each executable's call count, read only when one must go: the hot
# path is the plain dict lookup ``_lookup`` (see LruCache ``uses``).
_cache: LruCache[Any, _Executable] = LruCache(
    "eager executables",
    lambda: config.eager_cache_size,
    uses=lambda _key, exe: exe.stats.calls,
    on_evict=_forget,
)
_lookup = _cache.lookup
_guard = threading.local()


def _replay():
    for exe in _cache.values():
        if exe.info is not None:
            yield exe.info


probes.add_replay_source(_replay)


def cache_stats() -> list[ExecutableStats]:
    """Stats of every cached eager executable (op, key, compile time, hits)."""
    return [e.stats for e in _cache.values()]


def clear_cache() -> None:
    """Drop every eager executable (each compiles again on its next call). Unlike an
    eviction by the cache's bound, this is not reported to tracers or counted."""
    forget_signatures()
    for _key, exe in _cache.clear():
        _keep_float64_count(exe)


_F64_JAX = (np.dtype("float64"), np.dtype("complex128"))
_WIDE_TORCH = (torch.float64, torch.complex128)
_float64_dropped: collections.Counter = collections.Counter()


def float64_ops() -> dict[str, int]:
    """Every op this process ran eagerly with float64 or complex128 values, and how many
    times. The CPU and GPU backends have float64; a TPU does not, so each of
    these would fail or need a float32 rewrite there. Traced runs record the same in the
    run store (``Session.float64_ops``, the report's float64 section)."""
    out = collections.Counter(_float64_dropped)
    for e in _cache.values():
        if e.stats.float64:
            out[e.stats.op] += e.stats.calls
    return dict(out)


def _flatten_out(out) -> tuple[list, tuple]:
    flat: list = []
    struct: list = []
    items = out if isinstance(out, (tuple, list)) else (out,)
    single = not isinstance(out, (tuple, list))
    for item in items:
        if isinstance(item, (tuple, list)):
            flat.extend(item)
            struct.append(len(item))
        else:
            flat.append(item)
            struct.append(-1)
    return flat, (single, tuple(struct))


def _meta_outputs(plan: _Plan, skel_args, skel_kwargs):
    """Output (shape, dtype) list from PyTorch's meta kernel, or None if it has none."""
    margs = [_to_meta(s) for s in skel_args]
    mkwargs = {k: _to_meta(s) for k, s in skel_kwargs}
    meta_fn = plan.meta_op
    if plan.lowering.meta is not None and plan.meta_op is plan.lowering.op:
        meta_fn = plan.lowering.meta  # PyTorch's meta kernel refuses what the lowering runs
    try:
        out = meta_fn(*margs, **mkwargs)
    except NotImplementedError:
        return None
    except RuntimeError as exc:
        msg = str(exc)
        if "meta" in msg.lower() and ("not implemented" in msg.lower() or "could not run" in msg.lower()):
            return None
        if "data-dependent" in msg or "DataDependentOutputException" in msg:
            return None
        if msg.startswith("Attempting to broadcast a dimension"):
            _check_broadcast([a for a in margs if isinstance(a, _Tensor)])
        raise
    except Exception as exc:  # noqa: BLE001 - meta kernels raise assorted types for data-dependent ops
        if type(exc).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException"):
            return None
        raise
    if plan.kind == "inplace" and plan.functional is not None and plan.functional is not plan.op:
        _check_inplace_result(plan, margs, mkwargs)
    if plan.kind == "mutates":
        tensors = [out] if isinstance(out, _Tensor) else [o for o in _iter_tensors(out)]
        for pos, _name, is_list in plan.writes:
            v = margs[pos] if pos < len(margs) else mkwargs.get(plan.op._schema.arguments[pos].name)
            tensors.extend(v if is_list else [v])
        return [(tuple(t.shape), t.dtype) for t in tensors]
    return [(tuple(t.shape), t.dtype) for t in _iter_tensors(out)]


def _check_broadcast(tensors: list) -> None:
    """Raise PyTorch's CPU error for inputs whose shapes do not broadcast (TensorIterator's
    ``infer_size``, pair by pair: the shape so far is tensor a): PyTorch's meta kernels word it
    otherwise."""
    shape: tuple = ()
    for t in tensors:
        other = tuple(t.shape)
        n = max(len(shape), len(other))
        a, b = (1,) * (n - len(shape)) + shape, (1,) * (n - len(other)) + other
        for i in range(n - 1, -1, -1):
            if a[i] != b[i] and a[i] != 1 and b[i] != 1:
                raise OpArgumentError(f"The size of tensor a ({a[i]}) must match the size of tensor b ({b[i]}) "
                                      f"at non-singleton dimension {i}")
        shape = tuple(y if x == 1 else x for x, y in zip(a, b))


def _check_inplace_result(plan: _Plan, margs, mkwargs) -> None:
    """Some in-place meta kernels skip the check their CPU kernels make (logit_ on an int64
    self): the functional op's result dtype must cast safely to the written argument."""
    try:
        result = plan.functional(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 - no usable functional meta: nothing to check against
        return
    for (pos, _name, is_list), r in zip(plan.writes, _iter_tensors(result)):
        target = margs[pos] if pos < len(margs) else None
        if isinstance(target, _Tensor) and not is_list and not torch.can_cast(r.dtype, target.dtype):
            raise OutputMismatchError(
                f"result type {_type_name(r.dtype)} can't be cast to the desired output type {_type_name(target.dtype)}"
            )


def _iter_tensors(out):
    if isinstance(out, _Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _iter_tensors(o)


_TOO_MANY_DIMS = "number of dimensions must be within [0, 64]"


def traced_function(plan: _Plan, skel_args, skel_kwargs, rng: bool):
    """The JAX function of one op call (its tensors, float scalars and random key in, the
    flat outputs out), and a list its output structure is put in when it is traced.
    Eager mode jits it alone; lazy mode (runtime/lazy.py) traces it inside a fused graph."""
    lowering = plan.lowering
    meta = _meta_outputs(plan, skel_args, skel_kwargs) if lowering.cast_output else None
    struct_box: list = []
    scope = f"aten::{plan.name}"

    def traced(*flat):
        it = iter(flat)
        args = [_fill(s, it) for s in skel_args]
        kwargs = {k: _fill(s, it) for k, s in skel_kwargs}
        if rng:
            kwargs["key"] = next(it)
        with jax.named_scope(scope):
            try:
                out = lowering.fn(*args, **kwargs)
            except ValueError as exc:
                if _TOO_MANY_DIMS in str(exc):  # XLA's limit is PyTorch's TensorIterator's
                    raise OpArgumentError("only tensors with up to 64 dims are supported") from None
                raise
            flat_out, struct = _flatten_out(out)
            if meta is not None and len(meta) == len(flat_out):
                flat_out = [
                    o if o.dtype == to_jax_dtype(dt) else o.astype(to_jax_dtype(dt))
                    for o, (_shape, dt) in zip((jnp.asarray(o) for o in flat_out), meta)
                ]
                for o, (shape, _dt) in zip(flat_out, meta):
                    if tuple(o.shape) != shape:
                        raise LoweringBugError(
                            f"internal error in the tpu lowering of aten::{plan.name}: "
                            f"it produced shape {tuple(o.shape)}, PyTorch says {shape}; "
                            "please report it with this message"
                        )
        struct_box[:] = [struct]
        return tuple(flat_out)

    return traced, struct_box


def _compile(plan: _Plan, key, skel_args, skel_kwargs, arrays, rng: bool) -> _Executable:
    began = time.perf_counter()
    traced, struct_box = traced_function(plan, skel_args, skel_kwargs, rng)
    if probes._probes:
        probes.compiling("eager", plan.name)
    start = time.perf_counter()
    jitted = jax.jit(traced)
    with jax.enable_x64(True):
        lowered = jitted.lower(*arrays)
        lower_seconds = time.perf_counter() - start
        with local_compile(program=program_identity("eager", plan.name, arrays)) as cached:
            compiled = lowered.compile(cached.options)
    seconds = time.perf_counter() - start
    out_dtypes = tuple(to_torch_dtype(a.dtype) for a in jax.tree_util.tree_leaves(lowered.out_info))
    stats = ExecutableStats(plan.name, key, seconds)
    # what the key holds beyond the arguments (see _run_lowered), for recompile diffs
    settings = tuple(k for k in key[3:] if type(k) is tuple and len(k) == 2)
    info = CompileInfo("eager", plan.name, key, _specs(plan.op._schema, skel_args, skel_kwargs),
                       seconds, lowered, compiled, settings=settings, jitted=jitted,
                       from_cache=cached.from_cache, saved_seconds=cached.saved_seconds,
                       lower_seconds=lower_seconds, wall_seconds=time.perf_counter() - began,
                       cache_entry=str(cached.entry) if cached.entry is not None else None, cache_miss=cached.miss)
    exe = _Executable(compiled, struct_box[0], out_dtypes, stats, info)
    if _placement.active and _placement.spans_processes(arrays):
        exe.spmd = _rankcheck.ProgramCard.of(info)
    if probes._probes:
        probes.compiled(info)
    return exe


def _wrap(flat, struct, dtypes):
    single, parts = struct
    if single:  # most ops: one tensor out
        return from_jax(flat[0], dtypes[0])
    tensors = [from_jax(a, d) for a, d in zip(flat, dtypes)]
    out = []
    i = 0
    for n in parts:
        if n == -1:
            out.append(tensors[i])
            i += 1
        else:
            out.append(tensors[i : i + n])
            i += n
    return out


def _written_targets(plan: _Plan, args, kwargs) -> list[torch.Tensor]:
    targets: list[torch.Tensor] = []
    schema_args = plan.op._schema.arguments
    for pos, name, is_list in plan.writes:
        v = args[pos] if pos < len(args) else kwargs.get(name, schema_args[pos].default_value)
        if v is None:
            continue
        targets.extend(v if is_list else [v])
    return targets


# out= ops whose CPU kernel refuses an output sharing any memory with an input, the same
# tensor included (at::assert_no_overlap): op -> the input positions it checks (None: all);
# other out= ops refuse a partial overlap only
_NO_OVERLAP_OUT: dict[str, tuple[int, ...] | None] = {
    "gather": (0,), "take": None, "index_select": None, "masked_select": None, "kthvalue": None, "cat": None,
}
_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
            "single memory location. Please clone() the tensor before performing the operation.")
_INTERNAL_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single "
                     "memory location. Please clone() the tensor before performing the operation.")


def _extent(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage, first element, one past the last element) of the memory ``t`` spans."""
    if not t.numel():
        return None
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.untyped_storage()._cdata, t.storage_offset(), t.storage_offset() + last + 1


def _check_out_memory(plan: _Plan, args, kwargs, targets, shapes) -> None:
    """PyTorch's memory checks on ``out=`` tensors, made before anything is written: an
    output whose elements share memory (an expanded tensor), and an output overlapping an
    input, as given or as resized to its result's shape (``shapes``), contiguous from its
    offset: some kernels check before resizing, others after."""
    for t in targets:
        if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
            raise OpArgumentError(_INTERNAL_OVERLAP)
    written = {name for _pos, name, _l in plan.writes}
    inputs = [a for a in (*args, *(v for k, v in kwargs.items() if k not in written)) if isinstance(a, _Tensor)]
    for a in (x for v in args if isinstance(v, (list, tuple)) for x in v):
        if isinstance(a, _Tensor):  # a list of inputs (cat)
            inputs.append(a)
    base = plan.op._schema.name.removeprefix("aten::")
    strict = _NO_OVERLAP_OUT.get(base, ())
    for t, shape in zip(targets, shapes):
        if strict is None and any(a is t for a in inputs):
            raise OpArgumentError(_OVERLAP)  # the same tensor, even an empty one
        out = _extent(t)
        if tuple(t.shape) != tuple(shape) and math.prod(shape):
            start = t.storage_offset()
            end = start + math.prod(shape)
            out = (t.untyped_storage()._cdata, start, end if out is None else max(end, out[2]))
        if out is None:
            continue
        for i, a in enumerate(inputs):
            span = _extent(a) if a.device.type == "tpu" else None
            if span is None or span[0] != out[0] or span[2] <= out[1] or out[2] <= span[1]:
                continue
            # the same memory as the output, as given (a resize of it is the shape check's)
            same = a is t or (span == _extent(t) and a.shape == t.shape and a.stride() == t.stride())
            if not same or strict is None or i in strict:
                raise OpArgumentError(_OVERLAP)


def _resize_out(t: torch.Tensor, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        t.resize_(shape)


def _build_key(plan: _Plan, args, kwargs, arrays: list, dynamic: bool):
    scalar_args = plan.scalar_args if dynamic else ()
    cpu_ok = plan.cpu_indices
    skel_args = []
    made = False  # a scalar became an input: only then can a wide dtype make it baked in instead
    for i, a in enumerate(args):
        d = _dyn_scalar(a, arrays) if i in scalar_args else None
        if d is None:
            skel_args.append(_skeleton(a, arrays, cpu_ok))
        else:
            skel_args.append(d)
            made = True
    skel_kw = []
    if kwargs:
        strip = plan.strip
        for k, v in kwargs.items():
            if k in strip:
                continue
            d = _dyn_scalar(v, arrays) if k in scalar_args else None
            if d is None:
                skel_kw.append((k, _skeleton(v, arrays)))
            else:
                skel_kw.append((k, d))
                made = True
    if made and (_default_dtype() is not _F32 or any(
            type(x) is _Spec and x[1] in _WIDE for x in _walk_specs(skel_args, skel_kw))):
        # float64/complex math, or a float64 default dtype (a float meeting an integer tensor
        # computes in it): a float32 scalar input would lose precision; bake it in
        arrays.clear()
        return _build_key(plan, args, kwargs, arrays, False)
    return tuple(skel_args), tuple(skel_kw)


def _walk_specs(skel_args, skel_kw):
    for s in list(skel_args) + [v for _, v in skel_kw]:
        if type(s) is _Spec:
            yield s
        elif type(s) is tuple and len(s) == 2 and (s[0] is list or s[0] is tuple):
            yield from (x for x in s[1] if type(x) is _Spec)


# _signature's marks: where the keyword arguments start
_KWARGS = object()
_torch_precision = torch.get_float32_matmul_precision
_default_dtype = torch.get_default_dtype
_F32 = torch.float32
_kept_offset = _tensor_module._offsets.lookup
_Generator = torch.Generator


def _signature(plan: _Plan, args, kwargs, arrays: list, graph=None):
    """A flat, hashable signature of one op call, its tensors' payloads appended to
    ``arrays`` as ``_build_key`` appends them, or None for a call it does not describe
    (a CPU tensor, a storage not written yet, a pending value of no recording graph,
    a dtype-reinterpreting view, a generator): such calls build their key.

    Calls of one plan with equal signatures have equal keys, so the signature finds the
    executable (or lazy template) without building the key: a tensor is its shape and
    dtype (a view adds its storage's shape and how it is read), a float in a ``Scalar``
    argument is an input, any other value is itself. ``graph``: lazy mode's recording
    graph, whose pending values are read as they are."""
    # what the effective precision is made of (config.effective_precision), read without its call
    sig = [config.numerics, config.matmul_precision, _torch_precision()] if plan.precision else []
    default = _default_dtype()
    if default is not _F32:  # a float meeting an integer tensor computes in the default dtype
        sig.append(("default dtype", default))
    dyn = plan.scalar_args if plan.dynamic_scalars and default is _F32 else ()
    i = 0
    for a in args:
        # a whole computed payload (most operands), inline: a call per tensor is a fifth of its cost
        if isinstance(a, _Tensor):
            arr = getattr(a.untyped_storage(), PAYLOAD_ATTR, None)
            # (or a value pending in lazy mode's recording graph)
            if type(arr) is _ArrayImpl or (type(arr) is LazyArray and graph is not None and arr.graph is graph):
                shape, dtype = a.shape, a.dtype
                if arr.shape == shape and arr.dtype == _JAX_OF.get(dtype) and not a.storage_offset() and (
                    a.is_contiguous()
                ):
                    arrays.append(arr)
                    sig.append(shape)
                    sig.append(dtype)
                    i += 1
                    continue
        if not _sign(a, i in dyn, sig, arrays, graph):
            return None
        i += 1
    if kwargs:
        sig.append(_KWARGS)
        strip = plan.strip
        for k, v in kwargs.items():
            if k in strip:
                continue
            sig.append(k)
            if not _sign(v, k in dyn, sig, arrays, graph):
                return None
    return tuple(sig)


def _sign(a, dyn: bool, sig: list, arrays: list, graph) -> bool:
    """Append ``a``'s part of a signature (see _signature); False if it has none.
    The parts read unambiguously: a torch.Size starts a tensor (then its dtype, or a
    tuple for a view), a list or tuple type starts a sequence (then its length), a
    pair (type, value) is a static number, a _Dyn is a float input."""
    if isinstance(a, _Tensor):
        storage = a.untyped_storage()
        arr = getattr(storage, PAYLOAD_ATTR, None)
        if type(arr) is not _ArrayImpl:
            if type(arr) is not LazyArray:
                return False
            if arr.array is not None:  # computed: its value stands for it from now on
                arr = arr.array
                set_payload(storage, arr)
            elif arr.graph is not graph:
                return False
        shape, dtype = a.shape, a.dtype
        if arr.dtype != _JAX_OF.get(dtype):
            return False
        arrays.append(arr)
        sig.append(shape)
        if arr.shape == shape and not a.storage_offset() and a.is_contiguous():
            sig.append(dtype)
            return True
        numel = arr.size
        pattern = view_pattern(shape, a.stride(), numel)
        if pattern[0] != "whole":
            offset = a.storage_offset()
            # the kept operand, read without moving it to the recent end of its cache
            operand = _kept_offset((offset, numel < 2**31))
            arrays.append(offset_operand(numel, offset) if operand is None else operand)
        sig.append((dtype, arr.shape, pattern))
        return True
    t = type(a)
    if t is float:
        if math.isnan(a):  # a NaN equals no other NaN: its signature would never be found again
            return False
        if dyn:
            arrays.append(np.float32(a))
            sig.append(_DYN)
        else:
            sig.append((float, a))
        return True
    if t is int or t is bool or t is complex:
        sig.append((t, a))
        return True
    if t is list or t is tuple:
        sig.append(t)
        sig.append(len(a))
        if dyn and a and all(type(v) is float for v in a):
            for v in a:
                arrays.append(np.float32(v))
                sig.append(_DYN)
            return True
        for v in a:
            if isinstance(v, _Tensor):  # a whole computed payload, inline (a foreach op's lists)
                arr = getattr(v.untyped_storage(), PAYLOAD_ATTR, None)
                if type(arr) is _ArrayImpl or (type(arr) is LazyArray and graph is not None and arr.graph is graph):
                    shape, dtype = v.shape, v.dtype
                    if arr.shape == shape and arr.dtype == _JAX_OF.get(dtype) and not v.storage_offset() and (
                        v.is_contiguous()
                    ):
                        arrays.append(arr)
                        sig.append(shape)
                        sig.append(dtype)
                        continue
            if not _sign(v, False, sig, arrays, graph):
                return False
        return True
    if a is None:
        sig.append(None)
        return True
    if t is torch.dtype or t is torch.device or t is torch.memory_format or t is torch.layout or t is str:
        sig.append((t, a))
        return True
    return False


def op_key(plan: _Plan, skel_args, skel_kwargs) -> tuple:
    """The executable key of one op call: overload, argument skeletons, and the settings
    its lowering reads while it is traced."""
    key = (plan.meta_op, skel_args, skel_kwargs)
    default = _default_dtype()
    if default is not _F32:  # a float meeting an integer tensor computes in the default dtype
        key += (("default dtype", default),)
    if config.numerics != "cpu" and plan.precision:  # TPU numerics change what products compile to
        key += (("numerics", config.numerics),)
    if plan.precision:  # the precision is read while tracing (ops/linalg.py)
        key += (("matmul precision", config.effective_precision()),)
    return key


class _JaxCompiles(threading.local):
    """JAX's own compile time on this thread while ``counting``: an eager-only op runs its
    lowering outside any program of ours, and JAX traces, lowers and compiles the primitives
    it dispatches (a gather for each new shape), time that is compiling, not waiting."""

    counting = False
    seconds = 0.0


_jax_compiles = _JaxCompiles()
# JAX's compile phases, each timed apart (none inside another)
_JAX_COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                                 "/jax/core/compile/jaxpr_to_mlir_module_duration",
                                 "/jax/core/compile/backend_compile_duration"})


def _heard_jax_duration(event: str, duration: float, **_: Any) -> None:
    if _jax_compiles.counting and event in _JAX_COMPILE_EVENTS:
        _jax_compiles.seconds += duration


jax.monitoring.register_event_duration_secs_listener(_heard_jax_duration)


def _report_value_read(read: list, seconds: float, compile_seconds: float) -> None:
    """An eager-only op (its output's shape depends on the data: nonzero, a boolean mask) read
    its device inputs on the host to run: a device-to-host sync the program did not ask for.
    ``compile_seconds`` of its ``seconds`` JAX spent compiling the op's own primitives."""
    first = max(read, key=lambda a: a.nbytes)
    probes.transferred(TransferInfo("d2h", int(sum(a.nbytes for a in read)), tuple(first.shape),
                                    str(first.dtype), "shape", max(0.0, seconds - compile_seconds),
                                    compile_seconds=compile_seconds))


def _run_lowered(plan: _Plan, args, kwargs, sig=None, fast_arrays=()):
    """``sig``: the call's signature (see _signature), whose arrays are ``fast_arrays``: the
    executable found is kept under it."""
    lowering = plan.lowering
    arrays: list = []
    key_data = None
    if lowering.rng and kwargs and kwargs.get("generator") is not None:
        kwargs = dict(kwargs)
        key_data = _random.key_from_generator(kwargs["generator"])
        kwargs["generator"] = None
    skel_args, skel_kwargs = _build_key(plan, args, kwargs, arrays, plan.dynamic_scalars)
    rng = lowering.rng
    if rng:
        arrays.append(_random.next_key() if key_data is None else key_data)
    eager_only = lowering.eager_only
    if eager_only is True or (eager_only and eager_only(args, kwargs)):
        if _dryrun.active is not None:  # shapes from values a dry run does not have, if it can
            return _finish(plan, args, kwargs, *_dry_shapes(_dryrun.active, plan, skel_args, skel_kwargs, arrays, rng))
        it = iter(arrays)
        a = [_fill(s, it) for s in skel_args]
        kw = {k: _fill(s, it) for k, s in skel_kwargs}
        if rng:
            kw["key"] = next(it)
        # the device inputs it reads on the host, looked at only when a guard or tracer listens
        read = [x for x in arrays if hasattr(x, "nbytes")] if probes._transfer_checks or probes._probes else []
        if probes._transfer_checks and read:  # a transfer guard may refuse the read (raises)
            first = max(read, key=lambda x: x.nbytes)
            probes.check_transfer("d2h", "shape", tuple(first.shape), str(first.dtype),
                                  int(sum(x.nbytes for x in read)))
        start = time.perf_counter()
        clock = _jax_compiles
        clock.counting, clock.seconds = True, 0.0
        try:
            with jax.enable_x64(True), jax.named_scope(f"aten::{plan.name}"):
                out = lowering.fn(*a, **kw)
        finally:
            clock.counting = False
        if probes._probes and read:
            _report_value_read(read, time.perf_counter() - start, clock.seconds)
        flat, struct = _flatten_out(out)
        return _finish(plan, args, kwargs, flat, struct, tuple(to_torch_dtype(o.dtype) for o in flat))
    key = op_key(plan, skel_args, skel_kwargs)
    if _dryrun.active is not None:  # a dry run: output shapes, the program to the target compiler
        return _dry_run_op(_dryrun.active, plan, args, kwargs, key, (skel_args, skel_kwargs), arrays, rng)
    exe = _lookup(key)
    if exe is None:
        try:
            exe = _compile(plan, key, skel_args, skel_kwargs, arrays, rng)
        except _NEEDS_VALUES:
            if not plan.dynamic_scalars:
                raise
            # this lowering needs its scalars' values while tracing: bake them in from now on
            plan.dynamic_scalars = False
            return _run_lowered(plan, args, kwargs)
        exe.stats.float64 = any(getattr(a, "dtype", None) in _F64_JAX for a in arrays) or any(
            d in _WIDE_TORCH for d in exe.out_dtypes
        )
        _cache.put(key, exe)
    else:
        exe.stats.hits += 1
    if sig is not None and len(arrays) == len(fast_arrays):  # (fewer: a float baked in)
        plan.fast[sig] = exe
    return _call(plan, args, kwargs, exe, key, arrays)


def _timed_call(name: str, exe: _Executable, key, arrays: list):
    """Run a cached executable with its run reported to the probes (a begin only when a
    probe listens for it: the usual tracers count runs, not spans)."""
    if probes._routes.on_execute_begin:
        probes.executing("eager", name, key)
    start = time.perf_counter()
    out = exe.fn(*arrays)
    probes.executed("eager", name, key, time.perf_counter() - start)
    return out


def _call(plan: _Plan, args, kwargs, exe: _Executable, key, arrays: list, donor=None):
    """Run cached executable ``exe`` (of ``key``) on ``arrays``, the results as ``plan``'s op
    returns them; ``donor`` (see _donor), when given, runs instead and takes the written
    tensors' buffers."""
    exe.stats.calls += 1
    if exe.spmd is not None:  # every rank must be about to run this same op
        _rankcheck.agree(exe.spmd)
    if donor is not None:
        flat = donor.run(plan.name, exe, key, arrays)
        if plan.kind != "inplace":
            return _finish(plan, args, kwargs, flat, exe.out_struct, exe.out_dtypes)
        # each new value has its tensor's shape and dtype and the tensor is its storage's whole
        # payload (_donor checked both for this signature): PyTorch's write checks pass, and the
        # value replaces the payload
        targets = args[0] if plan.writes[0][2] else [args[0]]
        if _tensor_module._track is None:
            for t, v in zip(targets, flat):
                setattr(t.untyped_storage(), PAYLOAD_ATTR, v)
        else:
            for t, v in zip(targets, flat):
                set_payload(t.untyped_storage(), v)
        return _return_written(plan, args, kwargs, targets)
    flat = _timed_call(plan.name, exe, key, arrays) if probes._probes else exe.fn(*arrays)
    if exe.stats.calls == 1:
        # the first call made JAX's C++ dispatch of the executable (jaxlib's PjitFunction):
        # later calls go to it directly, without ``jax.stages.Compiled.__call__``'s Python frame
        exe.fn = getattr(exe.fn, "_call", None) or exe.fn
        if exe.out_struct[0] and len(exe.out_dtypes) == 1:
            # one tensor out: a pure op's run_now wraps it without _finish
            exe.out_shape = torch.Size(flat[0].shape)
    return _finish(plan, args, kwargs, flat, exe.out_struct, exe.out_dtypes)


# -- a dry run's eager ops (runtime/dry_mode.py): outputs' avals, programs to the target compiler --


def _dry_run_op(mode: _dryrun.DryMode, plan: _Plan, args, kwargs, key, skels: tuple, arrays: list, rng: bool):
    """An eager op in a dry run: its outputs' avals (lowered once per key), written as the eager
    path writes; ``skels`` are its argument and keyword skeletons."""
    entry = mode.op_outputs.get(key)
    if entry is None:
        try:
            entry = _dry_lower(mode, plan, key, *skels, arrays, rng)
        except _NEEDS_VALUES:
            if not plan.dynamic_scalars:
                raise mode.needs(f"aten::{plan.name} (its lowering needs input values)") from None
            plan.dynamic_scalars = False  # as the eager path does: bake the scalars in
            return _run_lowered(plan, args, kwargs)
        mode.op_outputs[key] = entry
    mode.ops += 1
    avals, struct, dtypes = entry
    if probes._probes:
        probes.executing("eager", plan.name, key)
        start = time.perf_counter()
        flat = [_dryrun.Abstract(shape, dtype) for shape, dtype in avals]
        probes.executed("eager", plan.name, key, time.perf_counter() - start)
    else:
        flat = [_dryrun.Abstract(shape, dtype) for shape, dtype in avals]  # each output a payload of its own
    return _finish(plan, args, kwargs, flat, struct, dtypes)


def _dry_lower(mode: _dryrun.DryMode, plan: _Plan, key, skel_args, skel_kwargs, arrays: list,
               rng: bool) -> tuple[tuple, Any, tuple]:
    traced, struct_box = traced_function(plan, skel_args, skel_kwargs, rng)
    if probes._probes:
        probes.compiling("eager", plan.name)
    start = time.perf_counter()
    with jax.enable_x64(True):
        lowered = jax.jit(traced).lower(*arrays)
    seconds = time.perf_counter() - start
    leaves = jax.tree_util.tree_leaves(lowered.out_info)
    avals = tuple((tuple(a.shape), a.dtype) for a in leaves)
    dtypes = tuple(to_torch_dtype(a.dtype) for a in leaves)
    settings = tuple(k for k in key[3:] if type(k) is tuple and len(k) == 2)
    info = CompileInfo("eager", plan.name, key, _specs(plan.op._schema, skel_args, skel_kwargs),
                       seconds, lowered, None, settings=settings, lower_seconds=seconds, wall_seconds=seconds)
    mode.submit(lowered, "eager", plan.name)
    if probes._probes:
        probes.compiled(info)
    return avals, struct_box[0], dtypes


def _dry_shapes(mode: _dryrun.DryMode, plan: _Plan, skel_args, skel_kwargs, arrays: list,
                rng: bool) -> tuple[list, Any, tuple]:
    """An op whose output shape depends on values, in a dry run: its shapes if they can be had
    without them."""
    box: list = []

    def fn(*flat):
        it = iter(flat)
        a = [_fill(s, it) for s in skel_args]
        kw = {k: _fill(s, it) for k, s in skel_kwargs}
        if rng:
            kw["key"] = next(it)
        out_flat, struct = _flatten_out(plan.lowering.fn(*a, **kw))
        box.append(struct)
        return out_flat

    try:
        with jax.enable_x64(True):
            out = jax.eval_shape(fn, *arrays)
    except (*_NEEDS_VALUES, TypeError, ValueError):
        raise mode.needs(f"aten::{plan.name} (its output shape depends on values)") from None
    return ([_dryrun.Abstract(o.shape, o.dtype) for o in out], box[0], tuple(to_torch_dtype(o.dtype) for o in out))


def _finish(plan: _Plan, args, kwargs, flat, struct, dtypes):
    kind = plan.kind
    if kind is None:
        out = _wrap(flat, struct, dtypes)
        return out if plan.mask_pos < 0 else _masked_off(plan, args, kwargs, out)
    targets = _written_targets(plan, args, kwargs)
    if kind == "mutates":
        n_ret = len(flat) - len(targets)
        for t, v in zip(targets, flat[n_ret:]):
            write(t, v)
        returns = plan.op._schema.returns
        if not returns:
            return None
        if any(r.alias_info is not None for r in returns):
            return _aliased_returns(plan, args, kwargs, flat[:n_ret], dtypes[:n_ret])
        single, parts = struct
        ret_flat = list(flat[:n_ret])
        if len(returns) == 1 and not plan.returns_list:  # one Tensor return (rrelu_with_noise)
            return from_jax(ret_flat[0], dtypes[0])
        return _wrap(ret_flat, (single, _trim(parts, n_ret)), dtypes[:n_ret])
    # inplace / out: results go into the written arguments, which are returned
    if kind == "out":
        _check_out_memory(plan, args, kwargs, targets, [v.shape for v in flat])
    if plan.strip or kind == "inplace":
        # out= run through the functional lowering skipped PyTorch's out= checks; an in-place
        # meta kernel may accept a self it would broadcast (addr_ on a 0-d self)
        for t, v, d in zip(targets, flat, dtypes):
            _check_writable(plan, t, d, v.shape, args, kwargs)
    for t, v in zip(targets, flat):
        if kind == "out":
            _resize_out(t, v.shape)
        write(t, v)
    return _return_written(plan, args, kwargs, targets)


def _masked_off(plan: _Plan, args, kwargs, out):
    """``out`` with the outputs ``output_mask`` leaves off as None."""
    pos = plan.mask_pos
    mask = args[pos] if pos < len(args) else kwargs.get("output_mask")
    if mask is None or all(mask) or not isinstance(out, (list, tuple)) or len(out) != len(mask):
        return out
    return type(out)(o if keep else None for o, keep in zip(out, mask))


def _aliased_returns(plan: _Plan, args, kwargs, flat, dtypes):
    """Returns that alias an argument (``Tensor(a!)``) are that argument itself."""
    schema = plan.op._schema
    by_set = {}
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for name in a.alias_info.before_set:
                by_set[name] = value
    out = []
    for i, r in enumerate(schema.returns):
        if r.alias_info is not None:
            out.append(by_set[next(iter(r.alias_info.before_set))])
        else:
            out.append(from_jax(flat[i], dtypes[i]))
    return out[0] if len(out) == 1 else tuple(out)


def _trim(parts, n):
    out = []
    for p in parts:
        size = 1 if p == -1 else p
        if n <= 0:
            break
        out.append(p)
        n -= size
    return tuple(out)


def _return_written(plan: _Plan, args, kwargs, targets):
    returns = plan.op._schema.returns
    if not returns:
        return None
    if plan.writes and plan.writes[0][2]:  # a list argument written in place
        return targets
    if len(returns) == 1:
        return targets[0]
    return tuple(targets[: len(returns)])


# ---------------------------------------------------------------------------
# Decomposition and CPU fallback
# ---------------------------------------------------------------------------


def _decomposition(op: _OpOverload):
    from torch._decomp import decomposition_table

    # ops like native_batch_norm mutate inputs their schema does not declare; their
    # Python CompositeImplicit kernel routes to declared ops (_native_batch_norm_legit)
    kernel = op.py_kernels.get(torch._C.DispatchKey.CompositeImplicitAutograd)
    if kernel is not None:
        return kernel
    return decomposition_table.get(op)


def _structured_decomposition(plan: _Plan):
    """The decomposition of ``plan``'s functional op when calling that op would come back
    here as ``plan.op``, else None.

    A structured op's functional kernel for a backend with no kernel of its own is
    PyTorch's CompositeExplicitAutogradNonFunctional one: it allocates the result and
    calls the ``out=`` overload, which reaches the `tpu` fallback as ``plan.op`` again
    (``hardsigmoid_backward`` -> ``hardsigmoid_backward.grad_input`` -> ...). Running the
    functional op's decomposition instead breaks that loop."""
    functional = plan.functional
    qual = functional._schema.name
    if functional._overloadname != "default":
        qual += f".{functional._overloadname}"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(qual, "PrivateUse1") or not has(qual, "CompositeExplicitAutogradNonFunctional"):
        return None
    return _decomposition(functional)


def _call_by_schema(fn, schema, named: dict):
    """``fn`` called with the arguments ``named`` (by schema name) laid out as ``schema``
    orders them: decompositions take their arguments positionally, under their own names."""
    args, kwargs = [], {}
    for a in schema.arguments:
        if a.kwarg_only:
            if a.name in named:
                kwargs[a.name] = named[a.name]
        elif a.name in named:
            args.append(named[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            break
    return fn(*args, **kwargs)


def _run_functional_then_write(plan: _Plan, args, kwargs, run=None):
    """In-place / out= variant with no lowering: run the functional op (or ``run``, its
    decomposition), write back."""
    schema_args = plan.op._schema.arguments
    names = [a.name for a in schema_args]
    targets = _written_targets(plan, args, kwargs)
    fargs = list(args)
    fkwargs = {k: v for k, v in kwargs.items() if not any(k == n for _, n, _ in plan.writes)}
    fschema_names = [a.name for a in plan.functional._schema.arguments]
    call_kwargs = {}
    for i, v in enumerate(fargs):
        call_kwargs[names[i]] = v
    call_kwargs.update(fkwargs)
    call_kwargs = {k: v for k, v in call_kwargs.items() if k in fschema_names}
    if run is None:
        out = plan.functional(**call_kwargs)
    else:
        out = _call_by_schema(run, plan.functional._schema, call_kwargs)
    results = list(_iter_tensors(out))
    if plan.kind == "out":
        _check_out_memory(plan, args, kwargs, targets, [o.shape for o in results])
    for t, o in zip(targets, results):
        _check_writable(plan, t, o.dtype, o.shape, args, kwargs)
    flat = [to_jax(o) for o in results]
    for t, v in zip(targets, flat):
        if plan.kind == "out":
            _resize_out(t, v.shape)
        write(t, v)
    return _return_written(plan, args, kwargs, targets)


def _type_name(dtype: torch.dtype) -> str:
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def _check_writable(plan: _Plan, target: torch.Tensor, dtype: torch.dtype, shape, args, kwargs) -> None:
    """PyTorch's checks on writing a functional result into an in-place / out= argument:
    the result dtype must cast safely, and an output that is also an input is not resized."""
    if dtype != target.dtype and not torch.can_cast(dtype, target.dtype):
        raise OutputMismatchError(
            f"result type {_type_name(dtype)} can't be cast to the desired output type {_type_name(target.dtype)}"
        )
    if tuple(shape) == tuple(target.shape):
        return
    written = {name for _pos, name, _l in plan.writes}
    inputs = (*args, *(v for k, v in kwargs.items() if k not in written))
    if plan.kind == "inplace" or any(a is target for a in inputs):
        raise OutputMismatchError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(shape)}"
        )


def _cpu_fallback(plan: _Plan, args, kwargs):
    start = time.perf_counter()

    def to_host(v):
        if isinstance(v, _Tensor) and v.device.type == "tpu":
            return to_cpu(v, op=f"fallback:{plan.name}")
        if isinstance(v, (list, tuple)):
            return type(v)(to_host(x) for x in v)
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v

    cargs = [to_host(a) for a in args]
    ckwargs = {k: to_host(v) for k, v in kwargs.items()}
    out = plan.op(*cargs, **ckwargs)
    # written arguments: copy the CPU result back into the tpu tensors
    if plan.writes:
        for pos, name, is_list in plan.writes:
            dev = args[pos] if pos < len(args) else kwargs.get(name)
            host = cargs[pos] if pos < len(cargs) else ckwargs.get(name)
            if dev is None:
                continue
            pairs = zip(dev, host) if is_list else [(dev, host)]
            for d, h in pairs:
                if tuple(d.shape) != tuple(h.shape):
                    d.resize_(h.shape)
                write(d, _cpu_to_jax(h, op=f"fallback:{plan.name}"))
        if plan.kind in ("inplace", "out"):
            if probes._probes:
                probes.fell_back(FallbackInfo(plan.name, _fallback_specs(plan, args, kwargs),
                                              time.perf_counter() - start))
            return _return_written(plan, args, kwargs, _written_targets(plan, args, kwargs))

    def to_dev(v):
        if isinstance(v, _Tensor):
            return from_jax(_cpu_to_jax(v, op=f"fallback:{plan.name}"), v.dtype)
        if isinstance(v, (list, tuple)):
            return type(v)(to_dev(x) for x in v)
        return v

    result = to_dev(out)
    if probes._probes:
        probes.fell_back(FallbackInfo(plan.name, _fallback_specs(plan, args, kwargs), time.perf_counter() - start))
    return result


def _fallback_specs(plan: _Plan, args, kwargs) -> tuple[ArgSpec, ...]:
    names = [a.name for a in plan.op._schema.arguments]
    out = []
    for i, v in enumerate(list(args) + list(kwargs.values())):
        name = names[i] if i < len(args) and i < len(names) else list(kwargs)[i - len(args)]
        if isinstance(v, _Tensor):
            out.append(ArgSpec(name, tuple(v.shape), str(v.dtype).removeprefix("torch.")))
        elif isinstance(v, (int, float, bool, str)) or v is None:
            out.append(ArgSpec(name, static=v))
    return tuple(out)


def _missing(plan: _Plan) -> NoLoweringError:
    return NoLoweringError(
        f"aten::{plan.name} has no tpu lowering or decomposition. "
        "Set tpu_debug.runtime.config.cpu_fallback = True (or TPU_DEBUG_CPU_FALLBACK=1) "
        "to run it on CPU, or add a lowering under runtime/ops/."
    )


def run_now(op: _OpOverload, args, kwargs):
    """Run ``op`` op by op: its executable now, or its decomposition, or on CPU."""
    if op is _ADD_ and not kwargs and type(_current_node()) is _ACCUMULATE_GRAD:
        out = _defer_accumulation(*args)
        if out is not None:
            return out
    plan = _plans_by_id.get(id(op)) or plan_for(op)
    if plan.check is not None:
        plan.check(*args, **kwargs)
    if plan.values is not None and _dryrun.active is None and value_checks.wanted("eager"):
        value_checks.eager(op, plan.name, plan.values, args, kwargs)
    if plan.fast_ok and not probes._op_probes and _dryrun.active is None and not _placement.active:
        # a call whose signature found its executable: no key, no generic result walk
        arrays: list = []
        sig = _signature(plan, args, kwargs, arrays)
        if sig is not None:
            exe = plan.fast.get(sig)
            if exe is not None:
                stats = exe.stats
                stats.hits += 1
                # (an executable is shared by the plans of one key: out= through its functional
                # lowering writes its result, only a pure op's plan returns it)
                if exe.out_shape is None or plan.kind is not None or exe.spmd is not None:
                    donor = None
                    if plan.kind is not None and stats.calls >= _DONATE_AFTER:
                        donor = plan.donors.get(sig)
                        if donor is None:
                            donor = _donor(plan, exe, args, arrays)
                            if donor is not None:  # None: this call's tensors only, asked again next call
                                plan.donors[sig] = donor
                        if donor is None or donor is False or not donor.free(arrays):
                            donor = None
                    return _call(plan, args, kwargs, exe, stats.key, arrays, donor)
                stats.calls += 1
                (arr,) = _timed_call(plan.name, exe, stats.key, arrays) if probes._probes else exe.fn(*arrays)
                t = _create_empty(exe.out_shape, exe.out_dtypes[0])
                set_payload(t.untyped_storage(), arr)
                return t
        return _run_lowered(plan, args, kwargs, sig, arrays)
    if plan.lowering is not None:
        if probes._op_probes:  # divergence tracing sees each op's inputs and outputs
            return probes.observe_op(op, args, kwargs, lambda: _run_lowered(plan, args, kwargs))
        return _run_lowered(plan, args, kwargs)
    active = getattr(_guard, "ops", None)
    if active is None:
        active = _guard.ops = set()
    if op in active:
        # a decomposition called the op it decomposes: nothing left to try
        if config.cpu_fallback:
            return _cpu_fallback(plan, args, kwargs)
        raise _missing(plan)
    active.add(op)
    try:
        if plan.kind in ("inplace", "out") and plan.functional is not None:
            return _run_functional_then_write(plan, args, kwargs, _structured_decomposition(plan))
        decomp = _decomposition(op)
        if decomp is not None:
            return decomp(*args, **kwargs)
        if config.cpu_fallback:
            return _cpu_fallback(plan, args, kwargs)
        raise _missing(plan)
    finally:
        active.discard(op)


# ---------------------------------------------------------------------------
# In-place ops writing into the buffers they read (an optimizer's foreach updates)
# ---------------------------------------------------------------------------

# an in-place signature donates from this many calls of its executable on: a one-off
# in-place op does not pay a second compile
_DONATE_AFTER = 2
_refs = sys.getrefcount


class _Donor:
    """The program of an in-place op's signature with its written tensors' buffers donated:
    XLA writes their new values where the old ones were, instead of allocating every
    output and freeing every input (an optimizer step rewrites all parameters and their
    state each step). Its inputs ``0..n-1`` are the written tensors' payloads."""

    __slots__ = ("calls", "fn", "n")

    def __init__(self, fn, n: int) -> None:
        self.fn, self.n, self.calls = fn, n, 0

    def free(self, arrays: list) -> bool:
        """Whether nothing but the written storage holds each donated payload: no other
        tensor's storage (an alias made by a compiled graph, a saved tensor), no other input
        of this call. References: the storage's attribute, ``arrays``, getrefcount's argument."""
        for i in range(self.n):
            if _refs(arrays[i]) > 3:
                return False
        return True

    def run(self, name: str, exe: _Executable, key, arrays: list):
        fn = self.fn
        flat = _timed_call(name, _Executable(fn, (), (), exe.stats), key, arrays) if probes._probes else fn(*arrays)
        if not self.calls:  # JAX's C++ dispatch exists after the first call (as in _call)
            self.fn = getattr(fn, "_call", None) or fn
        self.calls += 1
        return flat


def _donor(plan: _Plan, exe: _Executable, args, arrays: list) -> _Donor | bool | None:
    """A donating program for this call's signature, or False where none applies: the op
    writes its first argument only (a tensor or a list of them), each written tensor is
    its storage's whole payload and the program's new value for it has its shape and dtype,
    so XLA can write it in place. None when only this call's tensors stand in the way (a
    view, a payload another storage holds): a later call of the signature may donate."""
    info = exe.info
    if exe.spmd is not None or info is None or info.jitted is None or plan.kind not in ("inplace", "mutates"):
        return False
    if len(plan.writes) != 1 or plan.writes[0][0] != 0 or not args:
        return False
    targets = args[0] if plan.writes[0][2] else [args[0]]
    n = len(targets)
    if not n or len(arrays) < n:
        return False
    for t, arr in zip(targets, arrays):
        if (not isinstance(t, _Tensor) or getattr(t.untyped_storage(), PAYLOAD_ATTR, None) is not arr
                or type(arr) is not _ArrayImpl or arr.shape != t.shape or t.storage_offset()
                or not t.is_contiguous()):
            return None
    outs = jax.tree_util.tree_leaves(info.lowered.out_info)
    written = outs[:n] if plan.kind == "inplace" else outs[len(outs) - n:]
    if len(written) != n or any((tuple(o.shape), o.dtype) != (tuple(a.shape), a.dtype)
                                for o, a in zip(written, arrays)):
        return False
    fn = getattr(info.jitted, "__wrapped__", None)
    if fn is None:
        return False
    with jax.enable_x64(True):
        lowered = jax.jit(fn, donate_argnums=tuple(range(n))).lower(*arrays)
        with local_compile() as cached:
            return _Donor(lowered.compile(cached.options), n)


# ---------------------------------------------------------------------------
# Gradient accumulation: autograd's adds into existing `.grad`s, one program a backward
# ---------------------------------------------------------------------------

_ADD_ = torch.ops.aten.add_.Tensor
_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad
_current_node = torch._C._current_autograd_node
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
# beyond this many bytes of pending sums they run at once: each old gradient stays alive
# until its sum is computed, so deferring holds at most this much more device memory
ACCUMULATION_BYTES = 64 << 20


class _Accumulation:
    """The sums autograd's AccumulateGrad asked for (``grad += new``, one per parameter
    whose ``.grad`` exists) since the last run, as the graph of their LazyArray payloads:
    they run as one program at the end of the backward, or as soon as one is read or
    written (LazyArray.value, tensor.write).

    Each sum is an op call of its own in op-by-op mode, a program call and its Python, a
    large share of a small model's step; here the call is a payload swap and the program
    has two inputs and one output a gradient."""

    __slots__ = ("key", "nbytes", "news", "olds", "storages", "values")

    def __init__(self) -> None:
        self.storages: list = []
        self.olds: list = []
        self.news: list = []
        self.values: list[LazyArray] = []
        self.key: list[tuple] = []  # per sum: the two payloads' shapes, the gradient's, the dtype
        self.nbytes = 0

    def recording(self) -> bool:
        return False  # an op reading a pending sum needs its value (tensor._readable)

    def materialize(self, trigger: str = "read") -> None:
        with _accumulation_lock:
            if _accumulating[0] is self:
                _accumulating[0] = None
            values = self.values
            if not values or values[0].array is not None:
                return  # already run
            key = tuple(self.key)
            fn = _accumulators.get(key)
            if fn is not None:
                outs = fn(*self.olds, *self.news)
            else:
                compiled = _compile_accumulator(key, self.olds, self.news)
                outs = compiled(*self.olds, *self.news)
                # the first call made JAX's C++ dispatch of the executable: later calls go to it
                _accumulators[key] = getattr(compiled, "_call", None) or compiled
            for storage, value, arr in zip(self.storages, values, outs):
                value.array = arr
                value.graph = None
                if getattr(storage, PAYLOAD_ATTR, None) is value:
                    set_payload(storage, arr)
            self.storages = self.olds = self.news = []

    def write(self, t: torch.Tensor, storage, value, old) -> None:
        """``tensor.write`` into a storage whose payload is a pending sum: the sums run first."""
        self.materialize("write")
        write(t, value)


_accumulation_lock = threading.RLock()
_accumulating: list[_Accumulation | None] = [None]  # the sums not run yet
_accumulators: dict[tuple, Any] = {}  # _Accumulation.key -> the summing executable


def _compile_accumulator(key: tuple, olds: list, news: list):
    n = len(olds)
    shapes = [shape for _, _, shape, _ in key]

    def sums(*arrays):
        # jnp's + of two operands of one dtype: the add lowering's program for add_(grad, new);
        # a payload of another shape (a bias's gradient, (1, n) for (n,)) is read as the
        # tensor's shape, as tensor.to_jax reads a dense tensor
        return [arrays[i].reshape(shapes[i]) + arrays[n + i].reshape(shapes[i]) for i in range(n)]

    with jax.enable_x64(True), local_compile():
        return jax.jit(sums).lower(*olds, *news).compile()


def _run_accumulation(*_unused) -> None:
    pending = _accumulating[0]
    if pending is not None:
        pending.materialize("backward")


def _defer_accumulation(grad, new, *rest):
    """``grad += new`` from autograd's AccumulateGrad as a pending sum, or None where the
    add runs as any op does: another eager mode, a listening probe (tracers see every op
    run), a dry run, a placement over devices, anything but two dense tensors of one
    dtype a TPU has, each its storage's whole payload."""
    if (rest or config.eager_mode != "defer_never" or probes._probes or _dryrun.active is not None
            or _placement.active or not isinstance(grad, _Tensor) or not isinstance(new, _Tensor)):
        return None
    storage = grad.untyped_storage()
    old = getattr(storage, PAYLOAD_ATTR, None)
    arr = getattr(new.untyped_storage(), PAYLOAD_ATTR, None)
    if type(old) is not _ArrayImpl or type(arr) is not _ArrayImpl or new.dtype is not grad.dtype:
        return None
    shape = grad.shape
    dtype = old.dtype
    numel = grad.numel()
    if (dtype != _JAX_OF.get(grad.dtype) or arr.dtype != dtype or dtype in _F64_JAX or new.shape != shape
            or old.size != numel or arr.size != numel or grad.storage_offset() or new.storage_offset()
            or not grad.is_contiguous() or not new.is_contiguous()):
        return None
    try:
        # every backward that deferred a sum runs them at its end (a second call finds none)
        _queue_callback(_run_accumulation)
    except RuntimeError:  # the node called outside a backward: nothing would run them
        return None
    shape = tuple(shape)
    with _accumulation_lock:
        pending = _accumulating[0]
        if pending is None:
            pending = _accumulating[0] = _Accumulation()
        value = LazyArray(shape, dtype, pending, len(pending.values))
        pending.storages.append(storage)
        pending.olds.append(old)
        pending.news.append(arr)
        pending.values.append(value)
        pending.key.append((old.shape, arr.shape, shape, dtype))
        pending.nbytes += numel * grad.element_size()
        set_payload(storage, value)
        if pending.nbytes > ACCUMULATION_BYTES:
            pending.materialize("memory")
    return grad
