"""View ops as values, for compiled (functional) graphs.

Eager mode never calls these: there a view aliases its base's storage (see
runtime/device.py). In an AOTAutograd graph views are pure functions of their
input, so they lower to reshapes, transposes, slices and gathers.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._common import canonical_dim, jdtype
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _shape(x, size):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = x.size // known if known else 0
    return tuple(size)


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default, view=True)
def view(x, size):
    return jnp.reshape(x, _shape(x, size))


@lower(aten._reshape_alias.default, view=True)
def reshape_alias(x, size, stride):
    return jnp.reshape(x, tuple(size))


@lower(aten.alias.default, aten.detach.default, aten.lift_fresh.default, view=True)
def alias(x):
    return x


@lower(aten.view.dtype, view=True)
def view_dtype(x, dtype):
    return lax.bitcast_convert_type(x, jdtype(dtype)) if jdtype(dtype).itemsize == x.dtype.itemsize else _bitcast(x, dtype)


def _bitcast(x, dtype):
    raise NoLoweringError(
        f"view({dtype}) of a {x.dtype} tensor has no tpu lowering in a compiled graph (the element sizes "
        "differ); view it as a dtype of the same size, or do it outside the compiled function"
    )


@lower(aten.t.default, view=True)
def t(x):
    return x.T if x.ndim == 2 else x


@lower(aten.transpose.int, view=True)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1) if x.ndim else x


@lower(aten.permute.default, view=True)
def permute(x, dims):
    return jnp.transpose(x, [canonical_dim(d, x.ndim) for d in dims])


@lower(aten.expand.default, view=True)
def expand(x, size, *, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    for i in range(x.ndim):
        if size[lead + i] == -1:
            size[lead + i] = x.shape[i]
    return jnp.broadcast_to(x, tuple(size))


@lower(aten.select.int, view=True)
def select(x, dim, index):
    dim = canonical_dim(dim, x.ndim)
    index = index + x.shape[dim] if index < 0 else index
    return lax.index_in_dim(x, index, dim, keepdims=False)


@lower(aten.slice.Tensor, view=True)
def slice_(x, dim=0, start=None, end=None, step=1):
    dim = canonical_dim(dim, x.ndim)
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@lower(aten.narrow.default, view=True)
def narrow(x, dim, start, length):
    dim = canonical_dim(dim, x.ndim)
    start = start + x.shape[dim] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lower(aten.squeeze.default, view=True)
def squeeze(x):
    return jnp.squeeze(x)


@lower(aten.squeeze.dim, aten.squeeze.dims, view=True)
def squeeze_dims(x, dim):
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(d for d in (canonical_dim(d, x.ndim) for d in dims) if x.ndim and x.shape[d] == 1)
    return jnp.squeeze(x, dims) if dims else x


@lower(aten.unsqueeze.default, view=True)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim + x.ndim + 1 if dim < 0 else dim)


@lower(aten.diagonal.default, view=True)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim))


@lower(aten.as_strided.default, view=True)
def as_strided(x, size, stride, storage_offset=None):
    offset = storage_offset or 0
    idx = np.full(tuple(size), offset, dtype=np.int64) if size else np.array(offset)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n) * s).reshape(shape)
    return x.reshape(-1)[idx]


@lower(aten.unfold.default, view=True)
def unfold(x, dimension, size, step):
    dim = canonical_dim(dimension, x.ndim)
    n = (x.shape[dim] - size) // step + 1 if x.ndim else 1
    if x.ndim == 0:
        return jnp.reshape(x, (1,))
    starts = np.arange(n) * step
    idx = starts[:, None] + np.arange(size)[None, :]
    moved = jnp.moveaxis(x, dim, -1)
    out = moved[..., idx]  # (..., n, size)
    return jnp.moveaxis(out, -2, dim)


@lower(aten.split.Tensor, view=True)
def split(x, split_size, dim=0):
    dim = canonical_dim(dim, x.ndim)
    n = x.shape[dim]
    bounds = list(range(split_size, n, split_size)) if split_size else []
    return list(jnp.split(x, bounds, axis=dim)) if n else [x]


@lower(aten.split_with_sizes.default, view=True)
def split_with_sizes(x, split_sizes, dim=0):
    dim = canonical_dim(dim, x.ndim)
    bounds = np.cumsum(split_sizes)[:-1].tolist()
    return list(jnp.split(x, bounds, axis=dim))


@lower(aten.unbind.int, view=True)
def unbind(x, dim=0):
    dim = canonical_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@lower(aten.view_as_real.default, view=True)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lower(aten.view_as_complex.default, view=True)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])
