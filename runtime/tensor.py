"""The `tpu` tensor's payload: a jax.Array kept on the tensor's storage.

A `tpu` tensor is a plain PyTorch tensor on the PrivateUse1 key. Its data lives
in a ``jax.Array`` attached to the Python object of its ``UntypedStorage``
(PyTorch preserves that object for as long as the C++ storage lives, so the
payload is freed with the storage). Views share the storage and carry their
own size/stride/offset, exactly as PyTorch's view model does: a read gathers
the view's elements from the storage payload, a write scatters them back, so
every alias sees every write. The programs that read and write a view take its
storage offset as an operand: slicing a new row each step reuses one program.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from tpu_debug.core.errors import MissingPayloadError, UnsupportedError
from tpu_debug.runtime import dry_mode as _dryrun
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.config import config
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype

__all__ = [
    "to_jax", "from_jax", "write", "empty", "read_parts", "view_value", "view_pattern", "offset_operand",
    "set_payload", "LazyArray", "PAYLOAD_ATTR", "Uninit",
]

PAYLOAD_ATTR = "_tpu_debug_payload"
_create_empty = torch._C._acc.create_empty_tensor
# a dry run's payload: shape and dtype, no data (runtime/dry_mode.py)
Abstract = _dryrun.Abstract
# memory tracking's hook, ``Ledger.note(storage, payload)``, called after every payload is
# set while a probe listens for allocations (runtime/memory_ledger.py); None otherwise
_track = None


def set_payload(storage, payload) -> None:
    """Make ``payload`` the data of ``storage`` (and tell memory tracking, when on)."""
    setattr(storage, PAYLOAD_ATTR, payload)
    if _track is not None:
        _track(storage, payload)


class Uninit:
    """Storage allocated but never written (``torch.empty``): zeros on read. ``logical`` is
    the shape of the tensor it was made for (what memory tracking shows; the payload is flat)."""

    __slots__ = ("numel", "dtype", "logical", "__weakref__")

    def __init__(self, numel: int, dtype, logical: tuple[int, ...] | None = None):
        self.numel = numel
        self.dtype = dtype
        self.logical = logical

    @property
    def size(self) -> int:
        return self.numel

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.numel,)


class LazyArray:
    """A storage's value that lazy mode recorded and has not computed yet.

    Its shape and dtype are known when the op is recorded; its value comes from running
    the pending graph it belongs to (``graph``, runtime/lazy.py), which happens when
    something needs a value. ``slot`` is its place in that graph; once the graph ran,
    ``array`` holds the value and ``graph`` is None.
    """

    __slots__ = ("shape", "dtype", "graph", "slot", "array", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype, graph, slot: int) -> None:
        self.shape = shape
        self.dtype = dtype
        self.graph = graph
        self.slot = slot
        self.array = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def value(self) -> jax.Array:
        """The computed value (runs the pending graph first if it has not run)."""
        if self.array is None:
            if self.graph is not None:
                self.graph.materialize()
            if self.array is None:
                raise MissingPayloadError(
                    f"a pending tpu value ({self!r}) belongs to a lazy graph that no longer "
                    "runs; compute it again"
                )
        return self.array

    def __repr__(self) -> str:
        state = "computed" if self.array is not None else "pending"
        return f"LazyArray({self.dtype}{list(self.shape)}, {state})"


def _materialize(storage, payload: Uninit) -> jax.Array:
    # in the tensor's own shape where the storage holds exactly it: a flat payload is
    # reshaped inside every program that reads it, which on a TPU is a relayout copy
    # (tiles of the flat array are not the 2-D array's) a device tensor would not need
    logical = payload.logical
    shape = tuple(logical) if logical is not None and math.prod(logical) == payload.numel else (payload.numel,)
    if _dryrun.active is not None:
        arr = Abstract(shape, payload.dtype)
    else:
        with jax.enable_x64(True):
            arr = jnp.asarray(np.zeros(shape, dtype=payload.dtype))
    set_payload(storage, arr)
    return arr


def _payload(t: torch.Tensor):
    storage = t.untyped_storage()
    try:
        arr = getattr(storage, PAYLOAD_ATTR)
    except AttributeError:
        raise MissingPayloadError(
            f"tpu tensor of shape {tuple(t.shape)} has no data (it was created "
            "without going through tpu_debug, e.g. by a fake or meta tensor); "
            "create it with a factory function or .to('tpu')"
        ) from None
    kind = type(arr)
    if kind is Uninit:
        arr = _materialize(storage, arr)
    elif kind is LazyArray:  # lazy mode: computed now if it was not yet
        arr = arr.value()
        set_payload(storage, arr)
    return storage, arr


def _readable(t: torch.Tensor):
    """``t``'s storage payload as an op may read it: a LazyArray stays lazy while lazy
    mode records (a computed one is replaced by its value)."""
    storage = t.untyped_storage()
    try:
        arr = getattr(storage, PAYLOAD_ATTR)
    except AttributeError:
        return _payload(t)[1]
    kind = type(arr)
    if kind is LazyArray:
        if arr.array is not None:
            arr = arr.array
            set_payload(storage, arr)
        elif not arr.graph.recording():
            arr = arr.value()
            set_payload(storage, arr)
    elif kind is Uninit:
        arr = _materialize(storage, arr)
    return arr


@functools.lru_cache(maxsize=4096)  # called on every read of a view: a model has few geometries
def view_pattern(size, stride, storage_numel: int) -> tuple:
    """How a (size, stride) view is read from a storage of ``storage_numel`` elements,
    whatever its offset: the structure of the program that reads it.

    ``("whole",)``: the view is the whole storage, reshaped (its offset is 0);
    ``("slice",)``: a contiguous run of the storage; ``("permuted", perm)``: a
    contiguous block with its dimensions permuted (``t()``, ``transpose``,
    ``permute``); ``("strided", stride)``: any other layout, a gather. Where the view
    starts (its storage offset) is an operand of the program, not part of it, so
    ``x[i]`` for every ``i`` runs one program. The stride of a size-1 dimension never
    moves an element, so it does not count."""
    size = tuple(size)
    contiguous = _contiguous_strides(size)
    stride = tuple(c if n == 1 else s for n, s, c in zip(size, stride, contiguous))
    numel = math.prod(size)
    if stride == contiguous or numel == 0:
        return ("whole",) if numel == storage_numel else ("slice",)
    perm = tuple(sorted(range(len(size)), key=lambda d: -stride[d]))
    psize = tuple(size[d] for d in perm)
    if tuple(stride[d] for d in perm) == _contiguous_strides(psize):
        return ("permuted", perm)
    return ("strided", stride)


# Offsets as device scalars, kept: a numpy scalar operand is copied to the device on every
# call (about 20 µs of a 40 µs eager op on the CPU backend), a device array is not.
_OFFSETS_KEPT = 4096
_offsets: LruCache[tuple, jax.Array] = LruCache("view offsets", lambda: _OFFSETS_KEPT)


def offset_operand(storage_numel: int, offset: int) -> jax.Array:
    """A view's storage offset as a program operand: an int32 device scalar unless the
    storage has 2**31 elements or more (the type follows the storage's shape, in the key)."""
    key = (offset, storage_numel < 2**31)
    arr = _offsets.get(key)
    if arr is None:
        with jax.enable_x64(True):
            arr = jax.device_put(np.int32(offset) if key[1] else np.int64(offset))
        _offsets.put(key, arr)
    return arr


def view_value(src, size, pattern, offset):
    """The elements of a ``size`` view of storage array ``src`` read as ``pattern``
    (:func:`view_pattern`) from storage offset ``offset`` (traceable, ``offset`` a traced
    integer: used inside executables, so reading a view costs no extra op). A valid view
    lies inside its storage, so the dynamic slices never clamp."""
    flat = src.reshape(-1)
    numel = math.prod(size)
    kind = pattern[0]
    if kind == "whole":
        return flat.reshape(size)
    if numel == 0:
        return jnp.zeros(size, flat.dtype)
    if kind == "slice":
        return lax.dynamic_slice_in_dim(flat, offset, numel).reshape(size)
    if kind == "permuted":
        perm = pattern[1]
        block = lax.dynamic_slice_in_dim(flat, offset, numel).reshape(tuple(size[d] for d in perm))
        return jnp.transpose(block, np.argsort(perm))
    idx = _indices(tuple(size), pattern[1], flat.shape[0])
    return flat.at[idx + offset].get(mode="promise_in_bounds", wrap_negative_indices=False)


def _put_view(base, value, size, pattern, offset):
    """``base`` with ``value`` written into its ``size`` view read as ``pattern`` from
    storage offset ``offset`` (traceable; the inverse of :func:`view_value`)."""
    flat = base.reshape(-1)
    value = value.reshape(size).astype(flat.dtype)
    kind = pattern[0]
    if kind == "whole":
        return value.reshape(base.shape)
    if kind == "slice":
        flat = lax.dynamic_update_slice_in_dim(flat, value.reshape(-1), offset, 0)
    elif kind == "permuted":
        flat = lax.dynamic_update_slice_in_dim(flat, jnp.transpose(value, pattern[1]).reshape(-1), offset, 0)
    else:
        idx = _indices(tuple(size), pattern[1], flat.shape[0])
        flat = flat.at[idx + offset].set(value, mode="promise_in_bounds", wrap_negative_indices=False)
    return flat.reshape(base.shape)


def _contiguous_strides(size) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


# one program per (storage aval, view shape, pattern): the offset is an operand
_strided_read = jax.jit(view_value, static_argnums=(1, 2))
_strided_write = jax.jit(_put_view, static_argnums=(2, 3))


def read_parts(t: torch.Tensor):
    """(storage array, view or None): what an executable needs to read ``t`` (the array
    is a LazyArray while lazy mode records). A view is (pattern, offset operand or None):
    see :func:`view_pattern`; a ``"whole"`` view has no offset operand."""
    arr = _readable(t)
    if arr.dtype != to_jax_dtype(t.dtype):
        return to_jax(t), None  # a reinterpreting view: its value, read here
    if arr.shape == t.shape and _is_dense(t):
        return arr, None
    pattern = view_pattern(t.shape, t.stride(), arr.size)
    return arr, (pattern, None if pattern[0] == "whole" else offset_operand(arr.size, t.storage_offset()))


def _reinterpreted(arr, jdtype, t: torch.Tensor):
    """Storage array ``arr`` as a flat array of ``jdtype`` elements, for the views that
    reinterpret a storage: complex numbers as (real, imaginary) pairs of their real dtype
    (``view_as_real``) and back (``view_as_complex``). Other dtype views are refused."""
    flat = arr.reshape(-1)
    if jnp.issubdtype(arr.dtype, jnp.complexfloating) and jdtype == jnp.finfo(arr.dtype).dtype:
        return jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
    if jnp.issubdtype(jdtype, jnp.complexfloating) and arr.dtype == jnp.finfo(jdtype).dtype and flat.size % 2 == 0:
        pairs = flat.reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    raise UnsupportedError(
        f"reading a {t.dtype} view of {arr.dtype} storage is not supported on "
        "tpu (a dtype-reinterpreting view); use .to(dtype) instead of .view(dtype)"
    )


# what one cached index array costs beyond its data: the key tuple, the ndarray header
# and the cache's own entries (a 0-d index is nearly all overhead)
_INDEX_ENTRY_OVERHEAD = 512
_index_cache: LruCache[tuple, np.ndarray] = LruCache(
    "view index arrays",
    lambda: config.index_cache_bytes,
    weigh=lambda idx: idx.nbytes + _INDEX_ENTRY_OVERHEAD,
)


def _indices(size, stride, storage_numel: int) -> np.ndarray:
    """The storage position of each element of a (size, stride) view starting at offset
    0, in the offset operand's type for a storage of ``storage_numel`` elements
    (read-only: cached per geometry, within ``config.index_cache_bytes``)."""
    wide = storage_numel >= 2**31
    key = (size, stride, wide)
    idx = _index_cache.get(key)
    if idx is None:
        idx = _build_indices(size, stride, wide)
        idx.flags.writeable = False
        _index_cache.put(key, idx)
    return idx


def _build_indices(size, stride, wide: bool) -> np.ndarray:
    idx = np.zeros(size, dtype=np.int64) if size else np.array(0, dtype=np.int64)
    for dim, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return np.asarray(idx, dtype=np.int64 if wide else np.int32)


def _is_dense(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous()


def to_jax(t: torch.Tensor) -> jax.Array:
    """The value of `tpu` tensor ``t`` as a jax.Array of ``t``'s shape and dtype."""
    storage, arr = _payload(t)
    jdtype = to_jax_dtype(t.dtype)
    if type(arr) is Abstract:  # a view of a dry run's payload: its shape, still no data
        return Abstract(tuple(t.shape), jdtype)
    if arr.dtype != jdtype:
        with jax.enable_x64(True):
            arr = _reinterpreted(arr, jdtype, t)
    if arr.shape == t.shape and _is_dense(t):
        return arr
    size = tuple(t.shape)
    if _is_dense(t) and arr.size == math.prod(size):
        return arr.reshape(size)
    pattern = view_pattern(size, t.stride(), arr.size)
    with jax.enable_x64(True):
        return _strided_read(arr, size, pattern, offset_operand(arr.size, t.storage_offset()))


def write(t: torch.Tensor, value: jax.Array) -> None:
    """Write ``value`` (``t``'s shape) into ``t``, visible through every alias."""
    storage = t.untyped_storage()
    if type(value) is LazyArray or type(getattr(storage, PAYLOAD_ATTR, None)) is LazyArray:
        _write_lazy(t, storage, value)
        return
    jdtype = to_jax_dtype(t.dtype)
    if value.dtype != jdtype:
        value = value.astype(jdtype)
    if tuple(value.shape) != tuple(t.shape):
        value = Abstract(tuple(t.shape), jdtype) if type(value) is Abstract else jnp.broadcast_to(value, tuple(t.shape))
    old = getattr(storage, PAYLOAD_ATTR, None)
    numel = t.numel()
    if old is None or (_is_dense(t) and old.size == numel and old.dtype == jdtype):
        setattr(storage, PAYLOAD_ATTR, value)
        if _track is not None:
            _track(storage, value)
        return
    if type(old) is Uninit:
        old = _materialize(storage, old)
    if numel == 0:
        return
    pattern = view_pattern(t.shape, t.stride(), old.size)
    if type(old) is Abstract or type(value) is Abstract:
        # part of a storage written in a dry run: the storage holds no data from now on
        new = old if type(old) is Abstract else Abstract(tuple(old.shape), old.dtype)
    else:
        with jax.enable_x64(True):
            if old.dtype != jdtype:  # through a reinterpreting view: write its elements, then back
                seen = _reinterpreted(old, jdtype, t)
                seen_pattern = view_pattern(t.shape, t.stride(), seen.size)
                new = _strided_write(seen, value, tuple(t.shape), seen_pattern,
                                     offset_operand(seen.size, t.storage_offset()))
                new = _reinterpreted(new, old.dtype, t).reshape(old.shape)
            else:
                new = _strided_write(old, value, tuple(t.shape), pattern, offset_operand(old.size, t.storage_offset()))
    set_payload(storage, new)


def _write_lazy(t: torch.Tensor, storage, value) -> None:
    """``write`` where the value or the storage's payload is a LazyArray: a computed one
    stands for its value; a pending one makes the write a step of its graph."""
    old = getattr(storage, PAYLOAD_ATTR, None)
    if type(old) is LazyArray and old.array is not None:
        old = old.array
        set_payload(storage, old)
    if type(value) is LazyArray and value.array is not None:
        value = value.array
    pending = value if type(value) is LazyArray else old if type(old) is LazyArray else None
    if pending is None:
        write(t, value)
        return
    if type(old) is Uninit:
        old = _materialize(storage, old)
    pending.graph.write(t, storage, value, old)


def from_jax(arr: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new `tpu` tensor holding ``arr`` (no copy)."""
    if dtype is None:
        dtype = to_torch_dtype(arr.dtype)
    t = _create_empty(arr.shape, dtype)
    storage = t.untyped_storage()
    setattr(storage, PAYLOAD_ATTR, arr)
    if _track is not None:
        _track(storage, arr)
    return t


def empty(size, dtype: torch.dtype, stride=None) -> torch.Tensor:
    """An uninitialised `tpu` tensor (reads as zeros until written)."""
    size = tuple(size)
    t = _create_empty(size, dtype)
    numel = math.prod(size)
    if stride is not None and tuple(stride) != tuple(t.stride()) and numel:
        # storage must span the furthest element of the requested layout
        extent = 1 + sum((n - 1) * s for n, s in zip(size, stride))
        numel = max(numel, extent)
        set_payload(t.untyped_storage(), Uninit(numel, to_jax_dtype(dtype), size))
        t.set_(t.untyped_storage(), 0, size, tuple(stride))
        return t
    set_payload(t.untyped_storage(), Uninit(numel, to_jax_dtype(dtype), size))
    return t
