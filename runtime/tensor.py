"""The `tpu` tensor's payload: a jax.Array kept on the tensor's storage.

A `tpu` tensor is a plain PyTorch tensor on the PrivateUse1 key. Its data lives
in a ``jax.Array`` attached to the Python object of its ``UntypedStorage``
(PyTorch preserves that object for as long as the C++ storage lives, so the
payload is freed with the storage). Views share the storage and carry their
own size/stride/offset, exactly as PyTorch's view model does: a read gathers
the view's elements from the storage payload, a write scatters them back, so
every alias sees every write.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from tpu_debug.errors import MissingPayloadError, UnsupportedError
from tpu_debug.runtime import dryrun as _dryrun
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.config import config
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype

__all__ = ["to_jax", "from_jax", "write", "empty", "read_parts", "view_value", "set_payload", "PAYLOAD_ATTR"]

PAYLOAD_ATTR = "_tpu_debug_payload"
_create_empty = torch._C._acc.create_empty_tensor
# a dry run's payload: shape and dtype, no data (runtime/dryrun.py)
Abstract = _dryrun.Abstract
# memory tracking's hook, ``Ledger.note(storage, payload)``, called after every payload is
# set while a probe listens for allocations (runtime/memory.py); None otherwise
_track = None


def set_payload(storage, payload) -> None:
    """Make ``payload`` the data of ``storage`` (and tell memory tracking, when on)."""
    setattr(storage, PAYLOAD_ATTR, payload)
    if _track is not None:
        _track(storage, payload)


class _Uninit:
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


def _materialize(storage, payload: _Uninit) -> jax.Array:
    if _dryrun.active is not None:
        arr = Abstract((payload.numel,), payload.dtype)
    else:
        with jax.enable_x64(True):
            arr = jnp.asarray(np.zeros(payload.numel, dtype=payload.dtype))
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
    if type(arr) is _Uninit:
        arr = _materialize(storage, arr)
    return storage, arr


def view_value(src, size, stride, offset):
    """The elements of a (size, stride, offset) view of storage array ``src``
    (traceable: used inside executables, so reading a view costs no extra op)."""
    flat = src.reshape(-1)
    numel = math.prod(size)
    if tuple(stride) == _contiguous_strides(size):
        return lax.slice(flat, (offset,), (offset + numel,)).reshape(size)
    # a permuted contiguous block (t(), transpose, permute): slice + transpose, not a gather
    perm = sorted(range(len(size)), key=lambda d: -stride[d])
    psize = tuple(size[d] for d in perm)
    if tuple(stride[d] for d in perm) == _contiguous_strides(psize) and offset + numel <= flat.shape[0]:
        block = lax.slice(flat, (offset,), (offset + numel,)).reshape(psize)
        return jnp.transpose(block, np.argsort(perm))
    idx = _indices(size, stride, offset)
    return flat[idx].reshape(size)


def _contiguous_strides(size) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


_strided_read = jax.jit(view_value, static_argnums=(1, 2, 3))


def read_parts(t: torch.Tensor):
    """(storage array, view geometry or None): what an executable needs to read ``t``."""
    _storage, arr = _payload(t)
    if arr.shape == t.shape and _is_dense(t):
        return arr, None
    if arr.dtype != to_jax_dtype(t.dtype):
        to_jax(t)  # raises the dtype-view error
    return arr, (tuple(t.stride()), t.storage_offset())


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _strided_write(base, value, size, stride, offset):
    flat = base.reshape(-1)
    idx = _indices(size, stride, offset)
    flat = flat.at[idx.reshape(-1)].set(value.reshape(-1).astype(flat.dtype))
    return flat.reshape(base.shape)


# what one cached index array costs beyond its data: the key tuple, the ndarray header
# and the cache's own entries (a 0-d index is nearly all overhead)
_INDEX_ENTRY_OVERHEAD = 512
_index_cache: LruCache[tuple, np.ndarray] = LruCache(
    "view index arrays",
    lambda: config.index_cache_bytes,
    weigh=lambda idx: idx.nbytes + _INDEX_ENTRY_OVERHEAD,
)


def _indices(size, stride, offset) -> np.ndarray:
    """The storage position of each element of a (size, stride, offset) view (read-only:
    cached per geometry, within ``config.index_cache_bytes``)."""
    key = (size, stride, offset)
    idx = _index_cache.get(key)
    if idx is None:
        idx = _build_indices(size, stride, offset)
        idx.flags.writeable = False
        _index_cache.put(key, idx)
    return idx


def _build_indices(size, stride, offset) -> np.ndarray:
    idx = np.full(size, offset, dtype=np.int64) if size else np.array(offset)
    for dim, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    idx = np.asarray(idx)
    if idx.size and idx.max() < 2**31:
        idx = idx.astype(np.int32)
    return idx


def _is_dense(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous()


def to_jax(t: torch.Tensor) -> jax.Array:
    """The value of `tpu` tensor ``t`` as a jax.Array of ``t``'s shape and dtype."""
    storage, arr = _payload(t)
    if arr.shape == t.shape and _is_dense(t):
        return arr
    jdtype = to_jax_dtype(t.dtype)
    if type(arr) is Abstract:  # a view of a dry run's payload: its shape, still no data
        return Abstract(tuple(t.shape), jdtype)
    if arr.dtype != jdtype:
        raise UnsupportedError(
            f"reading a {t.dtype} view of {arr.dtype} storage is not supported on "
            "tpu (a dtype-reinterpreting view); use .to(dtype) instead of .view(dtype)"
        )
    size = tuple(t.shape)
    if _is_dense(t) and arr.size == math.prod(size):
        return arr.reshape(size)
    with jax.enable_x64(True):
        return _strided_read(arr, size, tuple(t.stride()), t.storage_offset())


def write(t: torch.Tensor, value: jax.Array) -> None:
    """Write ``value`` (``t``'s shape) into ``t``, visible through every alias."""
    storage = t.untyped_storage()
    jdtype = to_jax_dtype(t.dtype)
    if value.dtype != jdtype:
        value = value.astype(jdtype)
    if tuple(value.shape) != tuple(t.shape):
        value = Abstract(tuple(t.shape), jdtype) if type(value) is Abstract else jnp.broadcast_to(value, tuple(t.shape))
    old = getattr(storage, PAYLOAD_ATTR, None)
    numel = t.numel()
    if old is None or (_is_dense(t) and old.size == numel):
        setattr(storage, PAYLOAD_ATTR, value)
        if _track is not None:
            _track(storage, value)
        return
    if type(old) is _Uninit:
        old = _materialize(storage, old)
    if numel == 0:
        return
    if type(old) is Abstract or type(value) is Abstract:
        # part of a storage written in a dry run: the storage holds no data from now on
        new = old if type(old) is Abstract else Abstract(tuple(old.shape), old.dtype)
    else:
        with jax.enable_x64(True):
            new = _strided_write(old, value, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    set_payload(storage, new)


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
        set_payload(t.untyped_storage(), _Uninit(numel, to_jax_dtype(dtype), size))
        t.set_(t.untyped_storage(), 0, size, tuple(stride))
        return t
    set_payload(t.untyped_storage(), _Uninit(numel, to_jax_dtype(dtype), size))
    return t
