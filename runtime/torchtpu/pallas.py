"""``torch_tpu._internal.pallas``: JAX functions and Pallas kernels as PyTorch ops
(:mod:`tpu_debug.runtime.pallas`)."""

from __future__ import annotations

from tpu_debug.runtime.pallas import get_pallas_mesh, jax_op

__all__ = ["get_pallas_mesh", "jax_op"]
