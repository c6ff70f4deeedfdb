"""The `tpu` device: PrivateUse1 renamed, its kernels, and the torch.tpu module."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import threading
import time
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._C._dynamo import eval_frame as _eval_frame
from tpu_debug.core.errors import DeviceTakenError, TpuArgumentError
from tpu_debug.core.post_import import when_imported
from tpu_debug.runtime import accelerator as _accelerator
from tpu_debug.runtime import autocast as _autocast
from tpu_debug.runtime import eager, probes, value_checks
from tpu_debug.runtime import lazy as _lazy
from tpu_debug.runtime import memory_ledger as _memory_ledger  # noqa: F401 - hands memory tracking to the probes
from tpu_debug.runtime import ops as _ops
from tpu_debug.runtime import profiler as _profiler
from tpu_debug.runtime import rng_state as _random
from tpu_debug.runtime import tpu_utils as _tpu_utils
from tpu_debug.runtime import xla_options as _xla_options
from tpu_debug.runtime.compiled import install_backends
from tpu_debug.runtime.config import config
from tpu_debug.runtime.dry_mode import Abstract, value_needed
from tpu_debug.runtime.ops.registry import composites, registered
from tpu_debug.runtime.startup import dynamo_disabled as _dynamo_disabled
from tpu_debug.runtime.startup import first_use, start
from tpu_debug.runtime.tensor import (
    PAYLOAD_ATTR,
    LazyArray,
    Uninit,
    _create_empty,
    from_jax,
    set_payload,
    to_jax,
    write,
)
from tpu_debug.runtime.tensor import empty as _empty
from tpu_debug.runtime.torchtpu import compat
from tpu_debug.runtime.torchtpu.public import topology_aware_mesh

__all__ = ["DeviceTakenError", "TpuModule", "install", "installed", "start"]

aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_lock = threading.Lock()
# "libs": the torch.library.Library objects holding our kernels (a Library unregisters
# its kernels when it is garbage collected)
_state: dict[str, object] = {"installed": False, "libs": []}
# set at the device's first use (startup.first_use): read on every kernel call, so a plain module global
_started = False
_set_eval_frame = _eval_frame.set_eval_frame


# ---------------------------------------------------------------------------
# torch.tpu
# ---------------------------------------------------------------------------


class Precision(enum.Enum):
    """``torch.tpu.Precision``: XLA's dot precisions, as TorchTPU names them (each value is
    the ``torch.set_float32_matmul_precision`` name of the same product): ``DEFAULT`` one
    bfloat16 pass, ``HIGH`` three, ``HIGHEST`` float32 accuracy."""

    DEFAULT = "medium"
    HIGH = "high"
    HIGHEST = "highest"


class _Precision:
    """``torch.tpu.precision``: the default float32 matmul precision; called with a
    :class:`Precision` (``with torch.tpu.precision(torch.tpu.Precision.HIGHEST):``), the
    precision inside a block, as TorchTPU's context manager sets it."""

    _VALUES = ("highest", "high", "medium")

    def get(self) -> str:
        return config.effective_precision()  # what float32 products use now

    def set(self, value: str | Precision) -> None:
        value = value.value if isinstance(value, Precision) else value
        if value not in self._VALUES:
            raise TpuArgumentError(
                f"precision {value!r} is not one of {', '.join(self._VALUES)} (or a torch.tpu.Precision)")
        torch.set_float32_matmul_precision(value)
        config.matmul_precision = value  # explicit, so it holds under TPU numerics too

    @contextlib.contextmanager
    def __call__(self, mode: Precision | str) -> Iterator[None]:
        before = (torch.get_float32_matmul_precision(), config.matmul_precision)
        self.set(mode)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before[0])
            config.matmul_precision = before[1]


class Stream:
    """``torch.tpu.Stream``: a stream handle for code written for CUDA-like devices (FSDP2 makes
    several and orders them with events).

    The runtime issues every `tpu` op from the calling thread in program order, JAX runs
    each op after the ops whose results it reads, and a collective finishes on the host
    before its call returns: there is one ordered queue, so waits between streams have
    nothing to order and return at once; ``synchronize`` waits for all device work.
    """

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("tpu", 0)
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        TpuModule.synchronize()

    def __repr__(self) -> str:
        return f"torch.tpu.Stream(device={self.device}, priority={self.priority})"


class Event:
    """``torch.tpu.Event``: a point in the one ordered queue (see :class:`Stream`); with
    ``enable_timing`` it keeps the host time it was recorded at, after the work before it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        if self.enable_timing:
            TpuModule.synchronize()
            self._time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        TpuModule.synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds from this event to ``end_event``, both recorded with ``enable_timing=True``."""
        if self._time is None or end_event._time is None:
            raise TpuArgumentError("elapsed_time needs two events recorded with Event(enable_timing=True)")
        return (end_event._time - self._time) * 1000.0


_streams: dict[str, Stream] = {}


def _default_stream() -> Stream:
    stream = _streams.get("default")
    if stream is None:
        stream = _streams.setdefault("default", Stream())
    return stream


class _StreamContext:
    """``with torch.tpu.stream(s):`` makes ``s`` the current stream, and restores the one before."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self._prior: Stream | None = None

    def __enter__(self) -> Stream | None:
        self._prior = TpuModule.current_stream()
        if self.stream is not None:
            TpuModule.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            TpuModule.set_stream(self._prior)


@dataclasses.dataclass(frozen=True, slots=True)
class _DeviceProperties:
    """``torch.tpu.get_device_properties()``: the XLA device the runtime runs on."""

    name: str
    platform: str
    total_memory: int | None  # bytes, where XLA reports a capacity (None on CPU)


class TpuModule:
    """What ``torch.tpu`` holds."""

    EagerMode = _lazy.EagerMode
    Precision = Precision
    precision = _Precision()
    # ``with torch.tpu.set_eager_mode(mode):`` (a context manager, as in TorchTPU)
    set_eager_mode = _lazy.set_eager_mode
    # TorchTPU's submodules (runtime/torchtpu/public.py adds the others) and debugging
    # utilities (runtime/profiler.py, runtime/tpu_utils.py); ``__path__`` makes ``torch.tpu``
    # a package to ``import torch.tpu.<submodule>``
    __path__: tuple[str, ...] = ()
    __spec__ = None
    profiler = _profiler
    utils = _tpu_utils
    _get_cache_stats = staticmethod(_tpu_utils.get_cache_stats)
    _clear_cache = staticmethod(_tpu_utils.clear_caches)

    @staticmethod
    def _get_cache_requests() -> int:
        return _tpu_utils.get_cache_stats().num_cache_reqs

    @staticmethod
    def _get_cache_hits() -> int:
        return _tpu_utils.get_cache_stats().num_cache_hits

    @staticmethod
    def _get_cache_misses() -> int:
        return _tpu_utils.get_cache_stats().num_compilations

    @staticmethod
    def _hbm_usage_summary() -> _tpu_utils.HbmUsage:
        start()
        return _tpu_utils.hbm_usage()

    @property
    def allow_excess_precision(self) -> bool:
        """Whether XLA may keep more precision than a result's dtype; assigning sets it for
        the programs compiled from then on (also ``torch.backends.tpu.allow_excess_precision``)."""
        return _xla_options.excess_precision()

    @allow_excess_precision.setter
    def allow_excess_precision(self, allowed: bool) -> None:
        _xla_options.set_excess_precision(allowed)

    @staticmethod
    def get_device_properties(device=None) -> _DeviceProperties:
        start()
        dev = jax.devices()[0]
        return _DeviceProperties(TpuModule.get_device_name(), dev.platform,
                                 (dev.memory_stats() or {}).get("bytes_limit"))

    @staticmethod
    def device(device) -> contextlib.AbstractContextManager:
        """``with torch.tpu.device(0):`` (also checkpointing and ``fork_rng``, around the RNG
        state): the runtime has one eager device, tpu:0."""
        TpuModule.set_device(device)
        return contextlib.nullcontext()

    @staticmethod
    def device_of(obj) -> contextlib.AbstractContextManager:
        return TpuModule.device(obj.device if isinstance(obj, torch.Tensor) and obj.device.type == "tpu" else 0)

    @staticmethod
    def topology_aware_mesh(mesh_shape, **kwargs) -> torch.Tensor:
        return topology_aware_mesh(mesh_shape, **kwargs)

    # streams and events, as FSDP2 and other CUDA-style code ask a device module for them
    Stream = Stream
    Event = Event

    @staticmethod
    def current_stream(device=None) -> Stream:
        return _streams.get("current") or _default_stream()

    @staticmethod
    def default_stream(device=None) -> Stream:
        return _default_stream()

    @staticmethod
    def set_stream(stream: Stream) -> None:
        _streams["current"] = stream

    @staticmethod
    def stream(stream: Stream | None) -> _StreamContext:
        return _StreamContext(stream)

    @property
    def eager_mode(self) -> _lazy.EagerMode:
        """The eager mode in effect; assigning it sets the mode (TorchTPU's property)."""
        return _lazy.eager_mode()

    @eager_mode.setter
    def eager_mode(self, mode) -> None:
        _lazy.set_mode(mode)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return _state["installed"] is True

    @property
    def _initialized(self) -> bool:
        # torch.utils.checkpoint stashes a device's RNG state for the recomputation only when
        # its module says it is initialized (it reads torch.cuda._initialized the same way)
        return _state["installed"] is True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        start()
        return jax.local_device_count()

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device) -> None:
        index = torch.device("tpu", device).index if isinstance(device, int) else torch.device(device).index
        if index not in (None, 0):
            raise TpuArgumentError(
                f"tpu:{index} requested; the eager runtime runs on tpu:0 "
                "(use tpu_debug.runtime.distributed for multi-device meshes)"
            )

    @staticmethod
    def synchronize(device=None) -> None:
        start()
        _lazy.materialize("synchronize")  # lazy mode: what is pending runs now
        began = time.perf_counter() if probes._routes.on_synchronize else None
        jax.effects_barrier()
        for arr in jax.live_arrays():
            arr.block_until_ready()
        if began is not None:
            probes.synchronized(time.perf_counter() - began)
        value_checks.flush()  # every program has run: their value-check reports are read

    @staticmethod
    def get_device_name(device=None) -> str:
        start()
        dev = jax.devices()[0]
        return f"XLA {dev.platform.upper()} ({dev.device_kind})"

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def manual_seed(seed: int) -> None:
        _random.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        _random.manual_seed(seed)

    @staticmethod
    def seed() -> int:
        return _random.seed()

    @staticmethod
    def seed_all() -> int:
        return _random.seed()

    @staticmethod
    def initial_seed() -> int:
        return _random.initial_seed()

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return _random.get_rng_state()

    @staticmethod
    def set_rng_state(state, device=None) -> None:
        _random.set_rng_state(state)


# ---------------------------------------------------------------------------
# Kernels that are not lowerings: storage, views, copies, scalars
# ---------------------------------------------------------------------------


def _meta_view(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_META, *args, **kwargs)

    kernel.__name__ = f"view_{op._schema.name.split('::')[1]}"
    return kernel


def _shielded_meta_view(op, fn):
    """``_dynamo_disabled(_meta_view(op))`` (``fn``) in one frame: a model's step runs
    about as many views as ops."""
    redispatch = op._handle.redispatch_boxed

    def shielded(*args, **kwargs):
        prior = _set_eval_frame(None)
        try:
            if not _started:
                _first_use()
            return redispatch(_META, *args, **kwargs)
        finally:
            _set_eval_frame(prior)

    return probes.as_dynamo_disabled(shielded, fn)


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    t = _empty(size, dtype or torch.get_default_dtype())
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format) and t.dim() == 4:
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
        t = _empty(size, t.dtype, stride)
    return t


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype or torch.get_default_dtype(), stride)


def _resize(self, size, memory_format=None):
    size = tuple(size)
    numel = 1
    for n in size:
        numel *= n
    storage = self.untyped_storage()
    old = getattr(storage, PAYLOAD_ATTR, None)
    have = 0 if old is None else old.size
    need = self.storage_offset() + numel
    if need > have:
        grown = _empty((need,), self.dtype)
        if old is not None and have:
            kept = to_jax(torch.as_strided(self, (have,), (1,), 0)) if type(old) is not Uninit else None
            if kept is not None:
                write(torch.as_strided(grown, (have,), (1,), 0), kept)
        storage = grown.untyped_storage()
    stride = torch.empty(size, device="meta").stride()
    self.set_(storage, self.storage_offset(), size, stride)
    return self


def _set_tensor(self, source):
    return self.set_(source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


def _set_storage(self, source):
    payload = getattr(source, PAYLOAD_ATTR, None)
    n = 0 if payload is None else payload.size
    return aten.set_.source_Storage_storage_offset.redispatch(_META, self, source, 0, (n,), (1,))


def _has_compatible_shallow_copy_type(self, from_):
    """Whether ``self.data = from_`` may keep ``self``'s tensor object. PyTorch's own rule
    counts only its built-in dense backends (CPU, CUDA...), so without this kernel
    ``module.to("tpu")`` made a new Parameter per module that held a tied weight (an
    embedding shared with the LM head), and the copies trained apart. A `tpu` tensor is a
    plain strided TensorImpl like a CPU one, so the two are compatible both ways, as they
    are between CPU and CUDA."""
    dense = ("cpu", "tpu")
    return (
        self.layout == torch.strided
        and from_.layout == torch.strided
        and self.device.type in dense
        and from_.device.type in dense
    )


def _inplace_view(op):
    """``t_``, ``transpose_``, ``squeeze_``...: the new geometry comes from the
    same op on a meta stand-in, applied to ``self`` with ``set_`` (PyTorch's own
    kernels would bounds-check against our storage, which reports 0 bytes)."""

    def kernel(self, *args, **kwargs):
        extent = self.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(self.shape, self.stride()) if n)
        base = torch.empty(max(extent, 1), dtype=self.dtype, device="meta")
        stand_in = base.as_strided(self.shape, self.stride(), self.storage_offset())
        op(stand_in, *args, **kwargs)
        self.set_(self.untyped_storage(), stand_in.storage_offset(), stand_in.shape, stand_in.stride())
        return self

    kernel.__name__ = f"inplace_view_{op._schema.name.split('::')[1]}"
    return kernel


def _inplace_view_ops() -> list:
    ops = []
    for name in ("t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_"):
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.extend(getattr(packet, ov) for ov in packet.overloads())
    return ops


def _payload_nbytes(payload) -> int:
    if payload is None:
        return 0
    return int(payload.size) * np.dtype(payload.dtype).itemsize


def _patch_storages() -> None:
    """Python-level ``UntypedStorage`` methods for `tpu` storages, whose C++ side holds
    0 bytes (the data is the payload):

    - ``clone`` (what ``copy.deepcopy`` of a tensor or module calls): PyTorch allocates
      ``nbytes()`` and byte-copies, which copies nothing or crashes. The clone is a new
      storage holding the same payload: jax arrays are immutable and a write replaces
      the payload, so sharing it is a copy.
    - ``nbytes`` (and ``size``): the payload's bytes. FakeTensor (dynamo, AOTAutograd) sizes its meta
      storage from it; a 0-byte fake storage fails every ``set_`` an ``out=`` op makes.
    - ``cpu``: the payload's bytes in a CPU storage (``torch.save`` and friends).
    """
    cls = torch.UntypedStorage
    if getattr(cls.clone, "_tpu_debug", False):
        return
    original_clone, original_nbytes, original_cpu = cls.clone, cls.nbytes, cls.cpu

    def clone(self):
        if self.device.type != "tpu":
            return original_clone(self)
        new = _create_empty((0,), torch.uint8).untyped_storage()
        payload = getattr(self, PAYLOAD_ATTR, None)
        if type(payload) is Uninit:
            payload = Uninit(payload.numel, payload.dtype, payload.logical)
        if payload is not None:
            set_payload(new, payload)
        return new

    def nbytes(self):
        if self.device.type != "tpu":
            return original_nbytes(self)
        return _payload_nbytes(getattr(self, PAYLOAD_ATTR, None))

    def cpu(self):
        if self.device.type != "tpu":
            return original_cpu(self)
        payload = getattr(self, PAYLOAD_ATTR, None)
        if payload is None:
            return torch.UntypedStorage(0)
        if type(payload) is Uninit:
            host = np.zeros(payload.numel, payload.dtype)
        elif type(payload) is LazyArray:  # lazy mode: the pending graph runs first
            host = np.asarray(jax.device_get(payload.value())).reshape(-1)
        elif type(payload) is Abstract:  # a dry run's storage (torch.save, say): no data to copy
            raise value_needed("storage.cpu()")
        else:
            host = np.asarray(jax.device_get(payload)).reshape(-1)
        return torch.from_numpy(host.copy().view(np.uint8)).untyped_storage()

    original_resize = cls.resize_

    def resize_(self, size):
        if self.device.type != "tpu":
            return original_resize(self, size)
        _resize_storage(self, int(size))
        return self

    for name, fn, original in (("clone", clone, original_clone), ("nbytes", nbytes, original_nbytes),
                               ("cpu", cpu, original_cpu), ("resize_", resize_, original_resize)):
        fn._tpu_debug = True
        fn.__doc__ = original.__doc__
        setattr(cls, name, fn)


def _resize_storage(storage, nbytes: int) -> None:
    """``UntypedStorage.resize_`` for a `tpu` storage, whose bytes are its payload's. FSDP2 frees
    an unsharded parameter's memory with ``resize_(0)`` and allocates it again with
    ``resize_(nbytes)`` before writing it whole; a resize keeps the data it had up to the new
    size, as PyTorch's does, and new bytes read as zeros."""
    payload = getattr(storage, PAYLOAD_ATTR, None)
    dtype = np.dtype(payload.dtype) if payload is not None else np.dtype(np.uint8)
    if nbytes % dtype.itemsize:
        raise TpuArgumentError(
            f"resize_({nbytes}) of a tpu storage of {dtype}: give a multiple of its {dtype.itemsize}-byte items"
        )
    numel = nbytes // dtype.itemsize
    have = 0 if payload is None else int(payload.size)
    if have == numel:
        return
    if have == 0 or type(payload) is Uninit:
        set_payload(storage, Uninit(numel, dtype))
        return
    if numel == 0:
        set_payload(storage, Uninit(0, dtype))
        return
    value = payload.value() if type(payload) is LazyArray else payload
    if type(value) is Abstract:
        raise value_needed("storage.resize_()")
    flat = jnp.reshape(value, (-1,))
    kept = flat[:numel] if numel < have else jnp.concatenate([flat, jnp.zeros((numel - have,), flat.dtype)])
    set_payload(storage, kept)


def _local_scalar_dense(self):
    _lazy.computed(self)  # lazy mode: the graph runs before the copy, which is timed alone
    return eager.to_cpu(self, op="item").item()


def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    target = torch.device(device) if device is not None else self.device
    dtype = dtype or self.dtype
    if self.device.type != "tpu":  # host -> tpu
        return eager.from_cpu(self.to(dtype=dtype))
    if target.type == "tpu":
        # a pending value (lazy mode) is cast by a step of its graph
        arr = _lazy.value_of(self)
        if dtype != self.dtype:
            arr = _lazy.convert(arr, dtype)
        return from_jax(arr, dtype)
    _lazy.computed(self)
    host = eager.to_cpu(self, op="to")
    return host.to(device=target, dtype=dtype)


def _copy_(self, src, non_blocking=False):
    if self.device.type == "tpu":
        if src.device.type == "tpu":
            value = _lazy.value_of(src)  # pending in lazy mode: the copy is a graph step
        else:
            value = eager._cpu_to_jax(src)
        if tuple(value.shape) != tuple(self.shape) and type(value) is not LazyArray:
            # write() broadcasts, a dry run's shape-only value too
            value = value if type(value) is Abstract else jnp.broadcast_to(value, tuple(self.shape))
        with jax.enable_x64(True):
            write(self, value)
        return self
    # self is on the host, src on tpu
    _lazy.computed(src)
    self.copy_(eager.to_cpu(src, op="copy"))
    return self


def _copy_from(self, dst, non_blocking=False):
    return _copy_(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return _copy_(dst, self)


def dispatch(op, args, kwargs):
    """Run aten overload ``op`` on `tpu` tensors (the PrivateUse1 kernel) in the configured mode.

    The choice lives here, above both modes, so that op-by-op execution (``eager``) and the
    deferred, fused mode (``lazy``, which falls back to ``eager.run_now``) depend one way.
    """
    if config.eager_mode != "defer_never":  # deferred and fused, or launch blocking
        return _lazy.dispatch(op, args, kwargs)
    return eager.run_now(op, args, kwargs)


def _boxed_fallback(keyset, op, *args, **kwargs):
    return dispatch(op, args, kwargs)


def _lowered_kernel(op):
    def kernel(*args, **kwargs):
        return dispatch(op, args, kwargs)

    kernel.__name__ = f"tpu_{op._schema.name.split('::')[1]}"
    return kernel



def _shielded_lowered_kernel(op):
    """``_dynamo_disabled(_lowered_kernel(op))`` in one frame: the kernel of every lowered
    op, where the two frames it saves are a tenth of a small op's host time."""
    run_now = eager.run_now
    defer = _lazy.dispatch

    def shielded(*args, **kwargs):
        prior = _set_eval_frame(None)
        try:
            if not _started:
                _first_use()
            if config.eager_mode != "defer_never":  # deferred and fused, or launch blocking
                return defer(op, args, kwargs)
            return run_now(op, args, kwargs)
        finally:
            _set_eval_frame(prior)

    return probes.as_dynamo_disabled(shielded, _lowered_kernel(op))


def _view_ops() -> list:
    """Every aten view op whose backend kernels are per-device (no composite
    kernel): those need a PrivateUse1 kernel, and PyTorch's meta kernel builds
    exactly the alias we want (same storage, new size/stride/offset)."""
    names = [
        "view", "as_strided", "_reshape_alias", "unfold", "view_as_real", "view_as_complex",
        "_unsafe_view", "alias", "diagonal", "expand", "permute", "select", "slice",
        "squeeze", "unsqueeze", "transpose", "t", "split", "unbind", "narrow", "detach",
        "split_with_sizes", "chunk", "real", "imag", "_conj", "values", "indices",
    ]
    ops = []
    for name in names:
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            qual = op._schema.name + (f".{ov}" if ov != "default" else "")
            try:
                has = functools.partial(torch._C._dispatch_has_kernel_for_dispatch_key, qual)
                if has("CompositeExplicitAutograd") or has("CompositeImplicitAutograd") or not has("Meta"):
                    continue
            except RuntimeError:  # TorchScript list builtins (select.t) are not dispatcher ops
                continue
            if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                continue
            ops.append(op)
    return ops


def _first_use() -> None:
    """A kernel of the device ran (a `tpu` tensor made, moved or computed on): the runtime
    starts (:func:`startup.first_use`), then the kernels' flag."""
    global _started
    first_use()
    _started = True


def _shield_rng_functions() -> None:
    """``torch.tpu``'s RNG functions run eagerly inside compiled code: they read and set
    host-side state, which dynamo cannot trace (called from a compiled function, as
    ``freeze_rng_state`` does around a seeded op, dynamo breaks the graph there)."""
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
                 "get_rng_state", "set_rng_state"):
        fn = TpuModule.__dict__.get(name)
        if isinstance(fn, staticmethod) and not hasattr(fn.__func__, "_torchdynamo_disable"):
            setattr(TpuModule, name, staticmethod(_dynamo_disabled(fn.__func__, kernel=False)))


def _register_kernels() -> list:
    lib = torch.library.Library("aten", "IMPL")
    special = {
        aten.empty.memory_format: _empty_memory_format,
        aten.empty_strided.default: _empty_strided,
        aten.resize_.default: _resize,
        aten.set_.source_Storage_storage_offset: _meta_view(aten.set_.source_Storage_storage_offset),
        aten.set_.source_Tensor: _set_tensor,
        aten.set_.source_Storage: _set_storage,
        aten._local_scalar_dense.default: _local_scalar_dense,
        aten._has_compatible_shallow_copy_type.default: _has_compatible_shallow_copy_type,
        # observed: a cast or copy on the device keeps divergence tracing's CPU shadow in step
        aten._to_copy.default: probes.observed(aten._to_copy.default, _to_copy),
        aten.copy_.default: probes.observed(aten.copy_.default, _copy_),
        aten._copy_from.default: _copy_from,
        aten._copy_from_and_resize.default: _copy_from_and_resize,
    }
    for op in _view_ops():
        special.setdefault(op, _meta_view(op))
    views = {op for op, fn in special.items() if fn.__name__.startswith("view_")}
    for op in _inplace_view_ops():
        special.setdefault(op, _inplace_view(op))
    # Kernels run eagerly even inside a compiled region (after a graph break, in
    # autograd): dynamo must not try to trace into them, or into JAX.
    shielded = _dynamo_disabled

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overriding composite kernels for PrivateUse1 is the point
        for op, fn in special.items():
            lib.impl(op, _shielded_meta_view(op, fn) if op in views else shielded(fn), "PrivateUse1")
        done = set(special)
        # composite kernels also take the autograd key: the aten ops they call record
        # autograd and views, as PyTorch's composite kernels' calls do
        for op, fn in composites().items():
            lib.impl(op, shielded(fn), "PrivateUse1")
            lib.impl(op, shielded(fn), "AutogradPrivateUse1")
            done.add(op)
        for op, lowering in registered().items():
            if op in done or lowering.view or lowering.graph_only:
                continue
            lib.impl(op, _shielded_lowered_kernel(op), "PrivateUse1")
            done.add(op)
            # the in-place and out= variants go straight to our kernel too
            for variant in _variants(op):
                if variant not in done:
                    lib.impl(variant, _shielded_lowered_kernel(variant), "PrivateUse1")
                    done.add(variant)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(shielded(_boxed_fallback), "PrivateUse1", with_keyset=True)
    return [lib, fallback, *_autocast.register_kernels(shielded)]


def _variants(op) -> list:
    base = op._schema.name.split("::")[1]
    out = []
    inplace = getattr(aten, base + "_", None)
    if inplace is not None and op._overloadname in inplace.overloads():
        out.append(getattr(inplace, op._overloadname))
    packet = getattr(aten, base, None)
    if packet is not None:
        want = [a.name for a in op._schema.arguments]
        for ov in packet.overloads():
            cand = getattr(packet, ov)
            args = cand._schema.arguments
            writes = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
            if writes and all(a.kwarg_only for a in writes):
                if [a.name for a in args if a not in writes] == want:
                    out.append(cand)
    return out


@functools.cache
def _load_lowerings() -> None:
    _ops.load()  # each op family registers its lowerings as it is imported


def installed() -> bool:
    return _state["installed"] is True


def install() -> bool:
    """Register the `tpu` device once. Returns True if this call registered it.

    Raises:
        DeviceTakenError: PrivateUse1 is already registered under another name
            (a real TorchTPU, say): tpu_debug does not take it over.
    """
    with _lock:
        if _state["installed"]:
            return False
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", "tpu"):
            raise DeviceTakenError(
                f"PrivateUse1 is already registered as {current!r}; tpu_debug's runtime "
                "does not replace another backend. Its tracers still work on that backend's "
                "compiled programs where they can."
            )
        if current == "tpu" and hasattr(torch, "tpu") and not isinstance(getattr(torch, "tpu"), TpuModule):
            raise DeviceTakenError(
                "the 'tpu' device is already provided by another package (torch-tpu?); "
                "tpu_debug's runtime is not registered. Uninstall it or run tpu_debug in "
                "a separate environment to use tpu_debug's runtime."
            )
        from torch.utils import backend_registration as br

        setup = getattr(br, "_setup_privateuseone_for_python_backend", None)
        if setup is None:
            raise DeviceTakenError(
                f"torch {torch.__version__} lacks the Python PrivateUse1 backend API "
                "(torch.utils.backend_registration._setup_privateuseone_for_python_backend); "
                "install the torch version in constraints.txt"
            )
        _load_lowerings()
        compat.take_the_torch_tpu_name()  # a PyTorch that ships torch/tpu (runtime/torchtpu/compat.py)
        setup(rename="tpu", backend_module=TpuModule())
        # the rename makes PrivateUse1 PyTorch's accelerator: CPU stays it until the script uses tpu
        _accelerator.install()
        _state["libs"] = _register_kernels()
        _patch_storages()
        _shield_rng_functions()
        _profiler.install_profiler_hooks()
        # TorchTPU's torch.tpu submodules, torch.backends.tpu, `import torch_tpu`, libtpu's
        # command-line flags, torch.accelerator.synchronize (runtime/torchtpu/compat.py)
        compat.install(torch.tpu, _profiler, _tpu_utils)
        _state["installed"] = True
    # importing torch._dynamo costs about a second, which `import tpu_debug`
    # (and `tpu-debug tui`) should not pay; torch.compile and torch._dynamo's backend
    # registry import it first, so registering the backends then is in time
    when_imported("torch._dynamo", install_backends)
    if torch.distributed.is_available():
        # the c10d backends tpu and tpu_dist, as TorchTPU registers them with its device
        # deferred: optional: a torch built without distributed has no c10d for it to import
        from tpu_debug.runtime.distributed.c10d import register_backends

        register_backends()
    return True
