"""``torch_tpu._internal.pallas`` (and ``.pallas``, ``.mesh``): JAX functions and Pallas kernels as
PyTorch ops (:mod:`tpu_debug.runtime.pallas`)."""

from __future__ import annotations

from tpu_debug.runtime.pallas import JAX_TO_TORCH_DTYPE_MAP, JaxCallable, get_pallas_mesh, jax_op

__all__ = ["JAX_TO_TORCH_DTYPE_MAP", "JaxCallable", "get_pallas_mesh", "jax_op"]
