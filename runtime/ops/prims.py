"""Lowerings of the ``prims`` ops that PyTorch's decompositions leave in compiled graphs.

``prims.fma`` is defined by ``torch._inductor.inductor_prims``, which the
decompositions ``torch.compile`` applies import. Importing it takes seconds and
pulls in ``torch._dynamo``, which ``import tpu_debug`` must not do
(tests/cli/test_startup.py), and until it is imported the op does not exist. So
these lowerings are defined here like any other but registered by ``register()``,
which the dynamo backend calls before it lowers a graph.
"""

from __future__ import annotations

import threading

import torch

from tpu_debug.runtime.ops._common import jdtype, promote
from tpu_debug.runtime.ops.registry import lookup, lower

__all__ = ["register"]


def fma(a, b, c):
    """``prims.fma``, ``a * b + c``: what PyTorch's decompositions of in-place
    ``addcmul_``/``addcdiv_`` leave in compiled graphs (an optimizer's
    ``exp_avg_sq.addcmul_(grad, grad)``)."""
    a, b, c = promote(a, b, c)
    return a * b + c


def convert_element_type(a, dtype):
    """``prims.convert_element_type``: a dtype cast. Dynamo passes a Python float argument
    that changed between calls as a float64 0-d tensor input, and AOTAutograd casts it to the
    other operand's dtype with this prim (HF attention's ``scaling``, a learning rate)."""
    return a.astype(jdtype(dtype))


def div(a, b):
    """``prims.div``: true division of floating point operands, division truncated toward zero
    of integer ones (C's, not Python's floor): what decompositions of ``div(rounding_mode=
    "trunc")`` leave (Mixtral's expert routing through ``histc``)."""
    import jax

    a, b = promote(a, b)
    return jax.lax.div(a, b)


_LOWERINGS = {"fma": fma, "convert_element_type": convert_element_type, "div": div}
_lock = threading.Lock()


def register() -> None:
    """Register the prims lowerings whose ops exist by now; those registered stay."""
    prims = getattr(torch.ops, "prims", None)
    with _lock:
        for name, fn in _LOWERINGS.items():
            packet = getattr(prims, name, None)
            if packet is not None and lookup(packet.default) is None:
                lower(packet.default)(fn)
