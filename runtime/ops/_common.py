"""Helpers shared by lowerings: PyTorch's type promotion on JAX values."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype

__all__ = ["Kind", "promote", "compute_dtype", "is_array", "jdtype", "canonical_dim", "canonical_dims"]


def is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval")


def jdtype(dtype: torch.dtype):
    return to_jax_dtype(dtype)


@functools.lru_cache(maxsize=4096)
def _dtypes_for(sig: tuple, kind: Kind):
    stand_ins = []
    for item in sig:
        if isinstance(item, tuple):
            ndim, dt = item
            stand_ins.append(torch.empty((1,) * ndim, dtype=dt, device="meta"))
        else:
            stand_ins.append(item(1) if item is not bool else True)
    return elementwise_dtypes(*stand_ins, type_promotion_kind=kind)


def _sig(args) -> tuple:
    sig = []
    for a in args:
        if a is None:
            continue
        if is_array(a):
            sig.append((a.ndim, to_torch_dtype(a.dtype)))
        elif isinstance(a, (bool, int, float, complex)):
            sig.append(type(a))
    return tuple(sig)


def compute_dtype(*args, kind: Kind = Kind.DEFAULT):
    """(computation dtype, result dtype) by PyTorch's rules, as JAX dtypes."""
    comp, res = _dtypes_for(_sig(args), kind)
    return to_jax_dtype(comp), to_jax_dtype(res)


def promote(*args, kind: Kind = Kind.DEFAULT):
    """Cast array arguments to PyTorch's computation dtype; scalars stay weak."""
    comp, _ = compute_dtype(*args, kind=kind)
    return tuple(
        a.astype(comp) if is_array(a) and a.dtype != comp else a for a in args
    )


def canonical_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    return dim + n if dim < 0 else dim


def canonical_dims(dims, ndim: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    if ndim == 0:
        return ()
    return tuple(sorted(canonical_dim(d, ndim) for d in dims))


def scalar_like(value, x):
    """A Python scalar as a weakly-typed JAX value next to array ``x``."""
    return jnp.asarray(value, dtype=x.dtype) if is_array(x) else value
