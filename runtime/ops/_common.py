"""Helpers shared by lowerings: PyTorch's type promotion on JAX values, and its
``opmath`` (half-precision inputs compute in float32)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype

__all__ = [
    "HALF",
    "Kind",
    "canonical_dim",
    "canonical_dims",
    "compute_dtype",
    "float_opmath",
    "is_array",
    "jdtype",
    "ntuple",
    "opmath",
    "promote",
    "round_to",
]

HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


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


def float_opmath(*args):
    """PyTorch's promotion to a float dtype (integers compute in the default float
    dtype), with float16/bfloat16 arrays widened to float32, PyTorch's ``opmath``."""
    args = promote(*args, kind=Kind.INT_TO_FLOAT)
    return tuple(a.astype(jnp.float32) if is_array(a) and a.dtype in HALF else a for a in args)


def opmath(x):
    """``x`` in the dtype PyTorch's kernels compute it in: float32 for a half dtype."""
    return x.astype(jnp.float32) if x.dtype in HALF else x


def round_to(dtype):
    """A function rounding float32 values to ``dtype``'s precision, where a kernel
    PyTorch runs rounds an intermediate to a half dtype: XLA would keep float32
    inside a fusion, and drops a ``reduce_precision`` applied to a half value."""
    info = jnp.finfo(dtype)
    return lambda v: lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def ntuple(v, n: int) -> tuple:
    """An int or a sequence of ints as an ``n``-tuple (a 1-element sequence repeats)."""
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


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
