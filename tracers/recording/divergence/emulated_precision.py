"""With TPU numerics, what the emulated precision allows a product, and the decisions it changes.

``trace(numerics="tpu")`` computes float32 matmuls and convolutions as a TPU
does at the precision in effect (``runtime/ops/linalg.py``): operands rounded
to bfloat16, exact products, float32 sums; one pass at "medium" (a TPU's
default), three at "high". Against PyTorch's float32 on CPU every such product
differs by far more than float32's tolerance, by design: comparing it at
float32's tolerance would make every model's first matmul a divergence.

A product is judged by what the emulated precision does to its result instead.
One pass keeps 8 significant bits of each operand, so a product's rounding
error is about 2**-8 of the magnitude of the terms it sums, the same for every
element of the result; that is the precision working as a TPU works, not a
divergence. It becomes one when the error is as large as what the result
carries: how much the result varies (its *spread*, the root mean square of its
deviation from the mean over its first dimension, the batch of most products).
Operands at an offset from zero 2**7 times their variation (sensor readings
near 1000 varying by 1, features near 1e5 varying by 10) keep one bit of that
variation, and a bias that cancels the product leaves only the error: the root
mean square of the difference then reaches half the spread, the tolerance
:func:`measure_product` holds a product to (:data:`SIGNAL_SHARE`). It applies
to the local and the drift measures of a product alike; a product that differs
from CPU at all is a ``"precision"`` cause of what follows it.

A discrete decision (argmax, argmin, topk, sort, a comparison) on values that
came from such products takes another branch wherever two candidates are
closer than the precision resolves. A few near-ties do that at any precision;
when :data:`DECISION_SHARE` of the decisions or more change, the values the
decision compares differ by less than the emulated precision keeps: on a TPU at
this precision the program decides otherwise. :func:`changed_decision` turns
such a change into the verdict ``"precision"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.ops.registry import lookup
from tpu_debug.tracers.recording.divergence.measures import Measures, measure
from tpu_debug.tracers.recording.divergence.tolerances import DEFAULT_TOLERANCES
from tpu_debug.tracers.recording.divergence.triage import RESULT_BRANCHES, Cause, Triaged, base_name

__all__ = ["DECISIONS", "DECISION_SHARE", "PRECISION", "SIGNAL_SHARE", "changed_decision", "emulated", "measure_product"]

# the kind of cause (see triage.Causes) a product is when its difference from CPU is the
# emulated precision's own: rounding, as "noise" is, but a TPU's and not float32's
PRECISION = "precision"
# the ops of triage.RESULT_BRANCHES whose branch result is what a program uses: an index chosen
# (argmax, argmin; topk and sort, whose indices route tokens and order items) or a comparison's
# bool. max/min over a dimension and max pooling are left out: their first result is a value,
# continuous in their inputs, and which index holds it matters only where the indices are read
DECISIONS = frozenset(name for name in RESULT_BRANCHES if name not in (
    "max", "min", "max_pool2d_with_indices", "max_pool3d_with_indices"))
# the share of an op's decisions that must change for the change to be the precision's rather
# than a few near-ties (a classifier's argmax over well-separated scores changes none)
DECISION_SHARE = 0.01
# a product's difference from CPU is a divergence when its root mean square reaches this share of
# the result's spread: the result then carries no more than twice the rounding error
SIGNAL_SHARE = 0.5


def emulated(op: Any) -> bool:
    """Whether ``op`` (an aten overload) is a float32 product computed now in bfloat16 passes
    (TPU numerics at precision "medium" or "high"; "highest" is float32's accuracy)."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    lowering = lookup(op)
    return lowering is not None and lowering.precision and runtime_config.product_passes() in (1, 3)


def _spread(ref: np.ndarray) -> float:
    """How much a result varies: the RMS deviation from its mean over the first dimension (of
    the whole, for a vector), or its magnitude for a single value or a constant result."""
    if ref.size <= 1:
        return float(np.abs(ref).max(initial=0.0))
    if ref.ndim >= 2 and ref.shape[0] >= 2:
        centred = ref - ref.mean(axis=0, keepdims=True)
    else:
        centred = ref - ref.mean()
    spread = float(np.sqrt(np.mean(np.square(centred))))
    return spread if spread > 0 else float(np.sqrt(np.mean(np.square(ref))))


def measure_product(device: np.ndarray, ref: torch.Tensor, detail: bool) -> Measures:
    """A product's result measured at the emulated precision (see the module docstring):
    elements against :data:`SIGNAL_SHARE` of the result's spread (plus bfloat16's atol), and
    within tolerance while the root mean square of the difference is. NaN/Inf on one side
    only is over, as for any op."""
    cpu = ref.detach().to(torch.float64).numpy()
    finite = cpu[np.isfinite(cpu)] if not np.isfinite(cpu).all() else cpu
    allowed = DEFAULT_TOLERANCES[torch.bfloat16][1] + SIGNAL_SHARE * (_spread(finite) if finite.size else 0.0)
    m = measure(device, ref, 0.0, allowed, detail)
    if m.mismatched and not (m.device_nonfinite or m.cpu_nonfinite) and device.shape == cpu.shape:
        diff = np.asarray(device, dtype=np.float64) - cpu
        if np.isfinite(diff).all() and float(np.sqrt(np.mean(np.square(diff)))) <= allowed:
            m.mismatched = 0
    return m


def changed_decision(name: str, crossed: tuple[str, int, int] | None, causes: Iterable[Cause],
                     crossing: Any) -> Triaged | None:
    """The verdict on a decision op ``name`` whose result differs from the CPU run's on
    ``crossed`` = (branch, elements, numel) while matching CPU on its own inputs: ``"precision"``
    when a product at the emulated precision is among the causes of its inputs' difference and
    :data:`DECISION_SHARE` of its decisions or more changed; None otherwise (a near-tie, or no
    emulated precision involved). ``crossing`` is the :class:`Crossing` that records it."""
    if crossed is None or base_name(name) not in DECISIONS:
        return None
    _, elements, numel = crossed
    if not numel or elements < DECISION_SHARE * numel:
        return None
    ordered = sorted(causes, key=lambda c: c.seq)
    if any(c.kind == "wrong" for c in ordered):
        return None  # an op before it computes something else: that is the divergence
    precision = next((c for c in ordered if c.kind == PRECISION), None)
    if precision is None:
        return None
    return Triaged(PRECISION, "upstream", upstream=precision.where, crossings=(crossing,))
