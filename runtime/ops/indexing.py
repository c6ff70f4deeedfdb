"""Advanced indexing, gathers, scatters, sorted search, counting (bincount, histograms),
and the value-dependent-shape ops.

Index tensors follow PyTorch's (numpy's) rules: a ``None`` entry is a full
slice, a bool/uint8 tensor is a mask standing for its ``nonzero()`` over as
many dims as it has, the integer index tensors broadcast together, and their
result dims go where the first of them was when they are adjacent, in front
otherwise. Negative indices count from the end.

Ops whose output shape depends on values (``nonzero``, ``masked_select``,
``unique``, indexing with a mask) run ``eager_only`` on concrete arrays.
Everything else is traced and compiled like any other lowering; writes
through a mask (``x[mask] = v``) stay traceable because the number of
selected elements is read from the shape of ``v``.
"""

from __future__ import annotations

import builtins
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._checks import (
    OpArgumentError,
    OpIndexError,
    Refusal,
    ValueCheck,
    cpp_type,
    index_check,
    is_mask,
    require,
    scalar_type,
    sizes,
)
from tpu_debug.runtime.ops._common import canonical_dim, compute_dtype, is_array
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten

_MASK_DTYPES = (jnp.dtype(jnp.bool_), jnp.dtype(jnp.uint8))


def _is_mask(i) -> bool:
    return i is not None and jnp.dtype(i.dtype) in _MASK_DTYPES


def _add_at(x, where, values, *, mode=None):
    """``x.at[where].add(values)``; bool tensors accumulate as logical or, as in PyTorch."""
    if x.dtype == jnp.bool_:
        summed = x.astype(jnp.int32).at[where].add(values.astype(jnp.int32), mode=mode)
        return summed != 0
    return x.at[where].add(values, mode=mode)


def _key(indices):
    """A numpy-style index tuple: None becomes a full slice."""
    return tuple(slice(None) if i is None else i for i in indices)


def _result_shape(x_shape, index_shapes):
    """Shape of ``x[indices]`` for integer index arrays (None = full slice)."""
    adv = [p for p, s in enumerate(index_shapes) if s is not None]
    if not adv:
        return tuple(x_shape)
    b = tuple(np.broadcast_shapes(*(index_shapes[p] for p in adv)))
    if adv == list(range(adv[0], adv[-1] + 1)):
        return tuple(x_shape[: adv[0]]) + b + tuple(x_shape[adv[-1] + 1 :])
    rest = tuple(n for d, n in enumerate(x_shape) if d not in adv)
    return b + rest


def _adv_position(indices) -> int:
    """Where the broadcast index dims land in the result (see module doc)."""
    adv = [p for p, i in enumerate(indices) if i is not None]
    return adv[0] if adv == list(range(adv[0], adv[-1] + 1)) else 0


# ---- x[indices] ------------------------------------------------------------------


def _gather(x, indices):
    return x[_key(indices)]


_gather_jit = jax.jit(_gather)


def _concrete_masks(indices):
    """Replace each mask by its nonzero() index arrays (on concrete values)."""
    out = []
    for i in indices:
        if _is_mask(i):
            out.extend(jnp.asarray(a, dtype=jnp.int64) for a in np.nonzero(np.asarray(i)))
        else:
            out.append(i)
    return out


# ---- index ranges PyTorch's CPU kernels check (value checks: runtime/value_checks.py) --------


def _along_dim(x, dim: int, index):
    """``[(index, size of x along dim, dim)]`` for an op indexing ``x`` along ``dim``."""
    ndim = len(x.shape)
    d = dim + max(ndim, 1) if dim < 0 else dim
    return [(index, x.shape[d] if ndim else 1, d)]


def _out_of_bounds(value, dim, size) -> str:
    return f"index {value} is out of bounds for dimension {dim} with size {size}"


def _indexed(x, indices):
    """``x[indices]``: each index tensor with the size of the dimension it indexes, labelled
    as PyTorch's message counts it (among the index tensors, a mask counting its dims)."""
    entries, dim, k = [], 0, 0
    for i in indices:
        if i is None:
            dim += 1
        elif is_mask(i):
            dim, k = dim + len(i.shape), k + len(i.shape)
        else:
            if dim < len(x.shape):
                entries.append((i, x.shape[dim], k))
            dim, k = dim + 1, k + 1
    return entries


_INDEXED = index_check(lambda x, indices, *a, **kw: _indexed(x, indices), _out_of_bounds, error=OpIndexError,
                       negatives=True)
_GATHERED = index_check(lambda x, dim, index, *a, **kw: _along_dim(x, dim, index), _out_of_bounds)


def _has_mask(args, kwargs) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


@lower(aten.index.Tensor, eager_only=_has_mask, values=_INDEXED)
def index(x, indices):
    # a mask's result shape depends on its values: those calls run outside jit
    if any(_is_mask(i) for i in indices):
        indices = _concrete_masks(indices)
    return _gather(x, tuple(indices))


@lower(aten._unsafe_index.Tensor)
def unsafe_index(x, indices):
    return _gather(x, indices)


def _clamped(x, indices):
    return [
        None if i is None else jnp.clip(i, -x.shape[d], x.shape[d] - 1)
        for d, i in enumerate(indices)
    ]


@lower(aten._unsafe_masked_index.default)
def unsafe_masked_index(x, mask, indices, fill):
    taken = _gather(x, _clamped(x, indices))
    return jnp.where(mask, taken, jnp.asarray(fill).astype(x.dtype))


# ---- x[indices] = values -----------------------------------------------------------


def _mask_count(x, indices, values):
    """How many index entries each mask in ``indices`` expands to, and whether
    that is exact (read from ``values``/the other index shapes) or a padded
    upper bound (the mask's size; padding entries are dropped)."""
    shapes, dim = [], 0
    for i in indices:
        if _is_mask(i):
            shapes.extend([(1,)] * i.ndim)
            dim += i.ndim
        else:
            shapes.append(None if i is None else tuple(i.shape))
            dim += 1
    b = tuple(np.broadcast_shapes(*(s for s in shapes if s is not None)))
    if b and b[-1] > 1:
        return b[-1], True
    expanded = [s for s in shapes]
    pos = _adv_position(expanded)
    last = pos + len(b) - 1
    result_ndim = len(_result_shape(x.shape, expanded))
    v_axis = values.ndim - (result_ndim - last)
    if 0 <= v_axis < values.ndim and values.shape[v_axis] != 1:
        return values.shape[v_axis], True
    return max(int(np.prod(i.shape)) for i in indices if _is_mask(i)), False


def _traced_masks(x, indices, values):
    """Masks -> index arrays inside a trace (static length, see _mask_count)."""
    size, _exact = _mask_count(x, indices, values)
    out, dim = [], 0
    for i in indices:
        if _is_mask(i):
            fill = tuple(x.shape[dim : dim + i.ndim])  # out of bounds: dropped
            out.extend(a.astype(jnp.int64) for a in jnp.nonzero(i, size=size, fill_value=fill))
            dim += i.ndim
        else:
            out.append(i)
            dim += 1
    return out


def _index_put(x, indices, values, accumulate):
    indices = list(indices)
    if any(_is_mask(i) for i in indices):
        indices = _traced_masks(x, indices, values)
    shape = _result_shape(x.shape, [None if i is None else tuple(i.shape) for i in indices])
    values = jnp.broadcast_to(values.astype(x.dtype), shape)
    if accumulate:
        return _add_at(x, _key(indices), values, mode="drop")
    return x.at[_key(indices)].set(values, mode="drop")


@lower(aten.index_put.default, values=_INDEXED)
def index_put(x, indices, values, accumulate=False):
    return _index_put(x, indices, values, accumulate)


@lower(aten._index_put_impl.default, values=_INDEXED)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return _index_put(x, indices, values, accumulate)


@lower(aten._unsafe_index_put.default)
def unsafe_index_put(x, indices, values, accumulate=False):
    return _index_put(x, indices, values, accumulate)


@lower(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(x, mask, indices, values):
    values = jnp.where(mask, values, jnp.zeros((), values.dtype))
    return _index_put(x, _clamped(x, indices), values, True)


@lower(aten.put.default)
def put(x, index, source, accumulate=False):
    n = x.size
    idx = index.reshape(-1)
    idx = jnp.where(idx < 0, idx + n, idx)
    flat = x.reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    return (_add_at(flat, idx, src) if accumulate else flat.at[idx].set(src)).reshape(x.shape)


# ---- index_select / gather / take ------------------------------------------------------


def _selected(x, dim, index, *a, **kw):
    # CPU's kernel for the columns of a matrix raises an error of its own
    columns = len(x.shape) == 2 and dim in (1, -1)
    return [(index, x.shape[1], "columns")] if columns else _along_dim(x, dim, index)


def _selection_error(value, label, size):
    if label == "columns":
        return OpArgumentError(f"INDICES element is out of DATA bounds, id={value} axis_dim={size}")
    return OpIndexError("index out of range in self")


@lower(aten.index_select.default, values=index_check(_selected, _selection_error))
def index_select(x, dim, index):
    if x.ndim == 0:
        return jnp.take(x.reshape(1), index.reshape(-1), axis=0).reshape(())
    axis = canonical_dim(dim, x.ndim)
    return jnp.take(x, index.reshape(-1), axis=axis)


def _check_gather(x, dim, index, *, sparse_grad=False, out=None):
    if out is not None:
        require(out.dtype == x.dtype, f"Expected out tensor to have dtype {cpp_type(x.dtype)}, but got "
                f"{cpp_type(out.dtype)} instead")


@lower(aten.gather.default, check=_check_gather, values=_GATHERED)
def gather(x, dim, index, *, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0 or index.ndim == 0:
        flat = jnp.take(x.reshape(-1), index.reshape(-1), axis=0)
        return flat.reshape(index.shape)
    axis = canonical_dim(dim, x.ndim)
    x = x[tuple(slice(None) if d == axis else slice(0, index.shape[d]) for d in range(x.ndim))]
    return jnp.take_along_axis(x, index, axis)


def _check_take(x, index, **_out):
    require(x.numel() != 0 or index.numel() == 0, "take(): tried to take from an empty tensor", OpIndexError)


def _taken_error(value, _label, size):
    return f"out of range: tried to access index {value} on a tensor of {size} elements."


_TAKEN = index_check(lambda x, index, **kw: [(index, math.prod(x.shape), None)], _taken_error,
                     error=OpIndexError, negatives=True)


@lower(aten.take.default, check=_check_take, values=_TAKEN)
def take(x, index):
    n = x.size
    idx = jnp.where(index < 0, index + n, index)
    return jnp.take(x.reshape(-1), idx) if n else jnp.zeros(index.shape, x.dtype)


# ---- scatter family ---------------------------------------------------------------------


def _scatter_coords(index, axis):
    """Full coordinates of ``index``'s elements with ``index`` along ``axis``."""
    coords = [lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim)]
    coords[axis] = index.astype(jnp.int64)
    return tuple(coords)


def _scatter_setup(x, dim, index, src):
    """(x, coords, src values shaped like index, restore) with 0-dim inputs as 1-D."""
    zero_dim = x.ndim == 0
    if zero_dim:
        x, index = x.reshape(1), index.reshape(-1)
        if is_array(src):
            src = src.reshape(-1)
    axis = canonical_dim(dim, x.ndim)
    if is_array(src):
        src = src[tuple(slice(0, n) for n in index.shape)] if src.ndim else src
        src = jnp.broadcast_to(src.astype(x.dtype), index.shape)
    else:
        src = jnp.full(index.shape, src, x.dtype)
    coords = _scatter_coords(index, axis)
    return x, coords, src, (lambda r: r.reshape(())) if zero_dim else (lambda r: r)


_IDENTITY = {
    "sum": lambda dt: 0,
    "mean": lambda dt: 0,
    "prod": lambda dt: 1,
    "amax": lambda dt: -jnp.inf if jnp.issubdtype(dt, jnp.floating) else (
        False if dt == jnp.bool_ else jnp.iinfo(dt).min),
    "amin": lambda dt: jnp.inf if jnp.issubdtype(dt, jnp.floating) else (
        True if dt == jnp.bool_ else jnp.iinfo(dt).max),
}


def _reduce_into(x, coords, src, reduce, include_self):
    """scatter_reduce semantics on prepared coordinates."""
    if x.dtype == jnp.bool_:  # sum is or, prod is and, amax/amin likewise
        wide = _reduce_into(x.astype(jnp.int32), coords, src.astype(jnp.int32), reduce, include_self)
        return wide != 0
    if not include_self:
        x = x.at[coords].set(jnp.asarray(_IDENTITY[reduce](x.dtype), x.dtype))
    ref = x.at[coords]
    if reduce in ("sum", "mean"):
        out = ref.add(src)
    elif reduce == "prod":
        out = ref.multiply(src)
    elif reduce == "amax":
        out = ref.max(src)
    elif reduce == "amin":
        out = ref.min(src)
    else:
        raise NoLoweringError(f"{reduce!r} reduction has no tpu lowering; use sum, prod, mean, amax or amin")
    if reduce == "mean":
        start = jnp.ones if include_self else jnp.zeros
        count = start(x.shape, jnp.int64).at[coords].add(1)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.floating):
            out = out / count.astype(x.dtype)
        else:
            out = jnp.floor_divide(out, count.astype(x.dtype))
    if jnp.issubdtype(x.dtype, jnp.floating) and reduce in ("amax", "amin"):
        # NaN wins, as in PyTorch's CPU kernel
        nan_hit = jnp.zeros(x.shape, jnp.bool_).at[coords].max(jnp.isnan(src))
        out = jnp.where(nan_hit, jnp.asarray(jnp.nan, x.dtype), out)
    return out


@lower(aten.scatter.src, aten.scatter.value, values=_GATHERED)
def scatter(x, dim, index, src):
    x, coords, src, restore = _scatter_setup(x, dim, index, src)
    return restore(x.at[coords].set(src))


@lower(aten.scatter.reduce, aten.scatter.value_reduce, values=_GATHERED)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    x, coords, src, restore = _scatter_setup(x, dim, index, src)
    name = {"add": "sum", "multiply": "prod"}[reduce]
    return restore(_reduce_into(x, coords, src, name, True))


@lower(aten.scatter_add.default, values=_GATHERED)
def scatter_add(x, dim, index, src):
    x, coords, src, restore = _scatter_setup(x, dim, index, src)
    return restore(_add_at(x, coords, src))


@lower(aten.scatter_reduce.two, values=_GATHERED)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    x, coords, src, restore = _scatter_setup(x, dim, index, src)
    return restore(_reduce_into(x, coords, src, reduce, include_self))


# ---- index_add / index_copy / index_fill / index_reduce ------------------------------------


def _along(x, dim, index):
    """(x as >=1-D, index as 1-D, the index tuple selecting ``index`` along dim, restore)."""
    zero_dim = x.ndim == 0
    if zero_dim:
        x = x.reshape(1)
    axis = canonical_dim(dim, x.ndim)
    index = index.reshape(-1)
    where = (slice(None),) * axis + (index,)
    return x, axis, index, where, (lambda r: r.reshape(())) if zero_dim else (lambda r: r)


def _source_for(x, axis, index, source):
    shape = x.shape[:axis] + (index.shape[0],) + x.shape[axis + 1 :]
    return source.astype(x.dtype).reshape(shape)


def _check_index_add(x, dim, index, source, *, alpha=1, out=None):
    if x.dim() == 0 or source.dim() == 0:
        return
    d = dim + x.dim() if dim < 0 else dim
    same = source.dim() == x.dim() and all(i == d or source.shape[i] == x.shape[i] for i in range(x.dim()))
    require(same, "source tensor shape must match self tensor shape, excluding the specified dimension. Got "
            f"self.shape = {sizes(x.shape)} source.shape = {sizes(source.shape)}")


@lower(aten.index_add.default, check=_check_index_add, values=_GATHERED)
def index_add(x, dim, index, source, *, alpha=1):
    x, axis, index, where, restore = _along(x, dim, index)
    src = _source_for(x, axis, index, source)
    if alpha != 1:
        src = src * jnp.asarray(alpha, x.dtype)
    return restore(_add_at(x, where, src))


@lower(aten.index_copy.default, values=index_check(
    lambda x, dim, index, *a, **kw: _along_dim(x, dim, index),
    lambda value, dim, size: f"index_copy_(): index {value} is out of bounds for dimension {dim} with size {size}",
    error=OpIndexError))
def index_copy(x, dim, index, source):
    x, axis, index, where, restore = _along(x, dim, index)
    return restore(x.at[where].set(_source_for(x, axis, index, source)))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, values=index_check(
    lambda x, dim, index, *a, **kw: _along_dim(x, dim, index), _out_of_bounds, error=OpIndexError, negatives=True))
def index_fill(x, dim, index, value):
    x, _axis, _index, where, restore = _along(x, dim, index)
    return restore(x.at[where].set(jnp.asarray(value).astype(x.dtype)))


@lower(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    x, axis, index, _where, restore = _along(x, dim, index)
    src = _source_for(x, axis, index, source)
    coords = [lax.broadcasted_iota(jnp.int64, src.shape, d) for d in range(src.ndim)]
    coords[axis] = index.astype(jnp.int64)[coords[axis]]
    return restore(_reduce_into(x, tuple(coords), src, reduce, include_self))


# ---- masks ---------------------------------------------------------------------------------


@lower(aten.masked_select.default, eager_only=True)
def masked_select(x, mask):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    flat_mask = np.asarray(jnp.broadcast_to(mask, shape)).reshape(-1).astype(bool)
    idx = jnp.asarray(np.flatnonzero(flat_mask))
    return _gather_jit(jnp.broadcast_to(x, shape).reshape(-1), (idx,))


def _check_masked_scatter(x, mask, source, **_out):
    require(mask.dtype == torch.bool, "masked_scatter_ only supports boolean masks, but got mask with dtype "
            f"{scalar_type(mask.dtype)}")


def _scattered(x, mask, source, **_out):
    """The mask (its ones broadcast to the result) must not ask for more than the source holds."""
    shape = torch.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
    return (mask,), (tuple(shape), math.prod(source.shape))


def _count_ones(xp, arrays, statics):
    shape, available = statics
    ones = xp.sum(xp.broadcast_to(arrays[0], shape).astype(xp.int64))
    return xp.where(ones > available, 1, 0), ones


def _overrun(code, value, statics):
    return Refusal(OpArgumentError("Number of elements of source < number of ones in mask"), "mask", 0,
                   statics[1] + 1, "clamped")


@lower(aten.masked_scatter.default, check=_check_masked_scatter,
       values=ValueCheck(_scattered, _count_ones, _overrun))
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    xf = jnp.broadcast_to(x, shape).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    if src.size == 0:
        return xf.reshape(shape)
    pos = jnp.clip(jnp.cumsum(m.astype(jnp.int64)) - 1, 0, src.size - 1)
    return jnp.where(m, src[pos], xf).reshape(shape)


@lower(aten.nonzero.default, eager_only=True)
def nonzero(x):
    return jnp.asarray(np.argwhere(np.asarray(x)), dtype=jnp.int64)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if x.size == 0:
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    return jnp.argwhere(x, size=size, fill_value=fill_value).astype(jnp.int64)


# ---- sorted search ---------------------------------------------------------------------------


def _searchsorted(seq, values, right, sorter, out_int32):
    side = "right" if right else "left"
    out_dtype = jnp.int32 if out_int32 else jnp.int64
    if seq.shape[-1] == 0 or (is_array(values) and values.size == 0):
        shape = values.shape if is_array(values) else ()
        return jnp.zeros(shape, out_dtype)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    if is_array(values):
        comp, _ = compute_dtype(seq, values)
        seq, values = seq.astype(comp), values.astype(comp)
    else:
        values = jnp.asarray(values, seq.dtype)
    if seq.ndim <= 1:
        r = jnp.searchsorted(seq, values, side=side)
    else:
        lead = seq.shape[:-1]
        flat_seq = seq.reshape(-1, seq.shape[-1])
        flat_val = values.reshape(flat_seq.shape[0], -1)
        r = jax.vmap(functools.partial(jnp.searchsorted, side=side))(flat_seq, flat_val)
        r = r.reshape(lead + values.shape[len(lead):])
    return r.astype(out_dtype)


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        right = side == "right"
    return _searchsorted(sorted_sequence, values, right, sorter, out_int32)


def _check_bucketize(values, boundaries, **_kwargs):
    require(boundaries.dim() == 1, f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar, check=_check_bucketize)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, values, right, None, out_int32)


@lower(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    elements = jnp.asarray(elements)
    tests = jnp.asarray(test_elements).reshape(-1)
    hit = jnp.any(elements[..., None] == tests, axis=-1) if tests.size else jnp.zeros(elements.shape, bool)
    return ~hit if invert else hit


# ---- value-dependent shapes: unique, bincount; histograms ---------------------------------

_EMPTY_I64 = np.zeros((0,), np.int64)


def _unique_flat(x, return_inverse, return_counts):
    a = np.asarray(x).reshape(-1)
    u, inv, counts = np.unique(a, return_inverse=True, return_counts=True, equal_nan=False)
    inverse = inv.reshape(x.shape).astype(np.int64) if return_inverse else _EMPTY_I64
    counts = counts.astype(np.int64) if return_counts else _EMPTY_I64
    return jnp.asarray(u, dtype=x.dtype), jnp.asarray(inverse), jnp.asarray(counts)


@lower(aten._unique2.default, eager_only=True)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    return _unique_flat(x, return_inverse, return_counts)


@lower(aten._unique.default, eager_only=True)
def unique_(x, sorted=True, return_inverse=False):
    u, inv, _ = _unique_flat(x, return_inverse, False)
    return u, inv


@lower(aten.unique_dim.default, eager_only=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    axis = canonical_dim(dim, x.ndim)
    a = np.asarray(x)
    u, inv, counts = np.unique(a, return_inverse=True, return_counts=True, axis=axis)
    return (
        jnp.asarray(u, dtype=x.dtype),
        jnp.asarray(inv.reshape(-1).astype(np.int64) if return_inverse else _EMPTY_I64),
        jnp.asarray(counts.astype(np.int64) if return_counts else _EMPTY_I64),
    )


@lower(aten.unique_consecutive.default, eager_only=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    a = np.asarray(x)
    if dim is None:
        a = a.reshape(-1)
        axis = 0
    else:
        axis = canonical_dim(dim, a.ndim)
    moved = np.moveaxis(a, axis, 0)
    moved = moved.reshape(moved.shape[0], int(np.prod(moved.shape[1:])))
    n = moved.shape[0]
    change = np.ones(n, bool)
    if n > 1:
        change[1:] = np.any(moved[1:] != moved[:-1], axis=1)
    starts = np.flatnonzero(change)
    out = np.take(a, starts, axis=axis)
    inverse = (np.cumsum(change) - 1).astype(np.int64)
    if dim is None:
        inverse = inverse.reshape(np.shape(x))
    counts = np.diff(np.append(starts, n)).astype(np.int64)
    return (
        jnp.asarray(out, dtype=x.dtype),
        jnp.asarray(inverse if return_inverse else _EMPTY_I64),
        jnp.asarray(counts if return_counts else _EMPTY_I64),
    )


@lower(aten.bincount.default, eager_only=True)
def bincount(x, weights=None, minlength=0):
    a = np.asarray(x)
    length = max(int(a.max()) + 1 if a.size else 0, minlength)
    if weights is None:
        return jnp.bincount(x, length=length).astype(jnp.int64)
    out_dtype = weights.dtype if jnp.issubdtype(weights.dtype, jnp.floating) else jnp.float64
    return jnp.bincount(x, weights.astype(jnp.float64), length=length).astype(out_dtype)


@lower(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    # PyTorch computes each element's bin in the input dtype, rounding after
    # every step (it matters for bfloat16); float32 math rounded per step does it
    dt = x.dtype

    def rnd(v):
        return v.astype(dt).astype(jnp.float32) if dt in (jnp.bfloat16, jnp.float16) else v

    xf = x.astype(jnp.float32) if dt in (jnp.bfloat16, jnp.float16) else x
    lo = jnp.asarray(min, xf.dtype)
    hi = jnp.asarray(max, xf.dtype)
    if min == max and xf.size:
        lo, hi = jnp.min(xf), jnp.max(xf)
    same = lo == hi
    lo = rnd(jnp.where(same, lo - 1, lo))
    hi = rnd(jnp.where(same, hi + 1, hi))
    inside = (xf >= lo) & (xf <= hi)
    pos = rnd(rnd(rnd(xf - lo) * bins) / rnd(hi - lo))
    b = jnp.clip(pos.astype(jnp.int64), 0, bins - 1)
    counts = jnp.zeros((bins,), xf.dtype).at[b.reshape(-1)].add(inside.reshape(-1).astype(xf.dtype))
    return counts.astype(dt)


def _linspace(start, end, steps, dtype):
    # PyTorch's CPU linspace: the first half counts up from start, the second half down from end
    step = (end - start) / (steps - 1) if steps > 1 else jnp.zeros((), dtype)
    idx = jnp.arange(steps)
    up = start + step * idx.astype(dtype)
    down = end - step * (steps - 1 - idx).astype(dtype)
    return jnp.where(idx < steps // 2, up, down).astype(dtype)


def _histogram_counts(x, edges, weight, density):
    x = x.reshape(-1)
    nb = edges.shape[0] - 1
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    pos = jnp.searchsorted(edges, x, side="right") - 1
    pos = jnp.where(x == edges[-1], nb - 1, pos)  # the rightmost edge is inclusive
    inside = (x >= edges[0]) & (x <= edges[-1])
    hist = jnp.zeros((nb,), x.dtype).at[jnp.where(inside, pos, 0)].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


@lower(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = jnp.asarray(range[0], x.dtype), jnp.asarray(range[1], x.dtype)
    elif x.size:
        lo, hi = jnp.min(x), jnp.max(x)
    else:  # PyTorch: an empty input gets the range [0, 1]
        lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
    same = lo == hi  # PyTorch widens an empty range by 0.5 on each side
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return _histogram_counts(x, _linspace(lo, hi, bins + 1, x.dtype), weight, density)


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    return _histogram_counts(x, bins.astype(x.dtype), weight, density)


def _histogramdd_edges(x, bins, range):
    """Each dimension's bin edges, as PyTorch's CPU kernel picks them: ``range`` (pairs of
    bounds) or the points' extent, an empty extent widened by 0.5 on each side, an empty
    input spanning [0, 1]."""
    dims = x.shape[-1]
    points = x.reshape(-1, dims)
    edges = []
    for k in builtins.range(dims):
        if range is not None:
            lo, hi = jnp.asarray(range[2 * k], x.dtype), jnp.asarray(range[2 * k + 1], x.dtype)
        elif points.shape[0]:
            lo, hi = jnp.min(points[:, k]), jnp.max(points[:, k])
        else:
            lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
        same = lo == hi
        lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
        edges.append(_linspace(lo, hi, bins[k] + 1, x.dtype))
    return edges


def _histogramdd_counts(x, edges, weight, density):
    """Counts (or weights) of the points of ``x`` (the last dim holds coordinates) per
    cell; a point outside any dimension's edges is not counted, the last edge of each
    dimension is inclusive."""
    points = x.reshape(-1, x.shape[-1])
    sizes = tuple(e.shape[0] - 1 for e in edges)
    inside = jnp.ones(points.shape[:1], bool)
    cell = jnp.zeros(points.shape[:1], jnp.int64)
    for k, e in enumerate(edges):
        v = points[:, k]
        pos = jnp.searchsorted(e, v, side="right") - 1
        pos = jnp.where(v == e[-1], sizes[k] - 1, pos)
        inside = inside & (v >= e[0]) & (v <= e[-1])
        cell = cell * sizes[k] + jnp.clip(pos, 0, sizes[k] - 1)
    w = jnp.ones(points.shape[:1], x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((math.prod(sizes),), x.dtype).at[jnp.where(inside, cell, 0)].add(jnp.where(inside, w, 0))
    hist = hist.reshape(sizes)
    if density:  # CPU's order: by the total, then by each dimension's bin widths
        hist = hist / jnp.sum(hist)
        for k, e in enumerate(edges):
            shape = [1] * len(sizes)
            shape[k] = sizes[k]
            hist = hist / jnp.diff(e).reshape(shape)
    return hist


def _histogramdd_edges_meta(x, bins, *, range=None, weight=None, density=False):
    return [x.new_empty((b + 1,)) for b in bins]


def _histogramdd_bin_cts_meta(x, bins, *, range=None, weight=None, density=False):
    return x.new_empty(tuple(bins))


def _histogramdd_bin_tensors_meta(x, bins, *, weight=None, density=False):
    return x.new_empty(tuple(b.shape[0] - 1 for b in bins))


def _check_histogramdd(x, bins, **_kwargs):
    if isinstance(bins, (list, tuple)):
        require(len(bins) == x.shape[-1], "histogramdd: The size of bins must be equal to the innermost "
                "dimension of the input.")


# PyTorch has no meta kernels for these (its fake tensors would run the real kernel on no data)
@lower(aten._histogramdd_bin_edges.default, meta=_histogramdd_edges_meta, check=_check_histogramdd)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_edges(x, bins, range)


@lower(aten._histogramdd_from_bin_cts.default, meta=_histogramdd_bin_cts_meta)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_counts(x, _histogramdd_edges(x, bins, range), weight, density)


@lower(aten._histogramdd_from_bin_tensors.default, meta=_histogramdd_bin_tensors_meta)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd_counts(x, [b.astype(x.dtype) for b in bins], weight, density)
