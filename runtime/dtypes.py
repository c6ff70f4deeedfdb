"""torch <-> JAX dtype mapping."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tpu_debug.core.errors import UnsupportedDtypeError

__all__ = ["TORCH_TO_JAX", "to_jax_dtype", "to_torch_dtype"]

_TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int64: jnp.dtype(jnp.int64),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
}
_JAX_TO_TORCH = {v: k for k, v in _TORCH_TO_JAX.items()}
# the mapping itself, for the hot paths that look a dtype up without a call
TORCH_TO_JAX = _TORCH_TO_JAX


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} is not supported on the tpu device; "
            f"use one of {', '.join(str(d) for d in _TORCH_TO_JAX)}"
        ) from None


def to_torch_dtype(dtype) -> torch.dtype:
    return _JAX_TO_TORCH[jnp.dtype(dtype)]
