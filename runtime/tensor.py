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
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.config import config
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype

__all__ = ["to_jax", "from_jax", "write", "empty", "read_parts", "view_value", "LazyArray", "PAYLOAD_ATTR"]

PAYLOAD_ATTR = "_tpu_debug_payload"
_create_empty = torch._C._acc.create_empty_tensor


class _Uninit:
    """Storage allocated but never written (``torch.empty``): zeros on read."""

    __slots__ = ("numel", "dtype")

    def __init__(self, numel: int, dtype):
        self.numel = numel
        self.dtype = dtype

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


def _materialize(storage, payload: _Uninit) -> jax.Array:
    with jax.enable_x64(True):
        arr = jnp.asarray(np.zeros(payload.numel, dtype=payload.dtype))
    setattr(storage, PAYLOAD_ATTR, arr)
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
    if kind is _Uninit:
        arr = _materialize(storage, arr)
    elif kind is LazyArray:  # lazy mode: computed now if it was not yet
        arr = arr.value()
        setattr(storage, PAYLOAD_ATTR, arr)
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
            setattr(storage, PAYLOAD_ATTR, arr)
        elif not arr.graph.recording():
            arr = arr.value()
            setattr(storage, PAYLOAD_ATTR, arr)
    elif kind is _Uninit:
        arr = _materialize(storage, arr)
    return arr


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
    """(storage array, view geometry or None): what an executable needs to read ``t``
    (the array is a LazyArray while lazy mode records)."""
    arr = _readable(t)
    if arr.dtype != to_jax_dtype(t.dtype):
        return to_jax(t), None  # a reinterpreting view: its value, read here
    if arr.shape == t.shape and _is_dense(t):
        return arr, None
    return arr, (tuple(t.stride()), t.storage_offset())


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
    jdtype = to_jax_dtype(t.dtype)
    if arr.dtype != jdtype:
        with jax.enable_x64(True):
            arr = _reinterpreted(arr, jdtype, t)
    if arr.shape == t.shape and _is_dense(t):
        return arr
    size = tuple(t.shape)
    if _is_dense(t) and arr.size == math.prod(size):
        return arr.reshape(size)
    with jax.enable_x64(True):
        return _strided_read(arr, size, tuple(t.stride()), t.storage_offset())


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
        value = jnp.broadcast_to(value, tuple(t.shape))
    old = getattr(storage, PAYLOAD_ATTR, None)
    numel = t.numel()
    if old is None or (_is_dense(t) and old.size == numel and old.dtype == jdtype):
        setattr(storage, PAYLOAD_ATTR, value)
        return
    if type(old) is _Uninit:
        old = _materialize(storage, old)
    if numel == 0:
        return
    with jax.enable_x64(True):
        if old.dtype != jdtype:  # through a reinterpreting view: write its elements, then back
            seen = _reinterpreted(old, jdtype, t)
            new = _strided_write(seen, value, tuple(t.shape), tuple(t.stride()), t.storage_offset())
            new = _reinterpreted(new, old.dtype, t).reshape(old.shape)
        else:
            new = _strided_write(old, value, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    setattr(storage, PAYLOAD_ATTR, new)


def _write_lazy(t: torch.Tensor, storage, value) -> None:
    """``write`` where the value or the storage's payload is a LazyArray: a computed one
    stands for its value; a pending one makes the write a step of its graph."""
    old = getattr(storage, PAYLOAD_ATTR, None)
    if type(old) is LazyArray and old.array is not None:
        old = old.array
        setattr(storage, PAYLOAD_ATTR, old)
    if type(value) is LazyArray and value.array is not None:
        value = value.array
    pending = value if type(value) is LazyArray else old if type(old) is LazyArray else None
    if pending is None:
        write(t, value)
        return
    if type(old) is _Uninit:
        old = _materialize(storage, old)
    pending.graph.write(t, storage, value, old)


def from_jax(arr: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new `tpu` tensor holding ``arr`` (no copy)."""
    if dtype is None:
        dtype = to_torch_dtype(arr.dtype)
    t = _create_empty(arr.shape, dtype)
    setattr(t.untyped_storage(), PAYLOAD_ATTR, arr)
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
        setattr(t.untyped_storage(), PAYLOAD_ATTR, _Uninit(numel, to_jax_dtype(dtype)))
        t.set_(t.untyped_storage(), 0, size, tuple(stride))
        return t
    setattr(t.untyped_storage(), PAYLOAD_ATTR, _Uninit(numel, to_jax_dtype(dtype)))
    return t
