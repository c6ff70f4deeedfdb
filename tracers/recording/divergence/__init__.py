"""Numerical divergence against PyTorch on CPU: the first op or graph node that drifts.

With ``trace(divergence=True)`` (``tpu-debug run --divergence``,
``TPU_DEBUG_DIVERGENCE=1``) every eager op on a ``tpu`` tensor is also run by
PyTorch on CPU, every compiled graph is also interpreted node by node on CPU,
and each result is compared with the device's.

Eager ops get two measures (:mod:`.eager`):

- ``local``: the CPU op on the device op's own inputs. It isolates the op
  that introduces an error, since an op downstream of it gets the same
  (already wrong) inputs on both sides.
- ``drift``: the CPU op on a CPU *shadow* of the whole computation. Each
  device storage maps (weakly: the shadow dies with the storage) to a CPU
  copy holding what a pure-CPU run would hold there, so drift shows how error
  propagates. Inputs with no shadow (data loaded onto the device, tensors made
  before the trace, storages written behind the runtime's back) take the
  device values as their shadow. Random ops (``randn``, ``dropout``,
  ``bernoulli``, ...) and uninitialised memory (``empty``) are not compared:
  their device values are copied into the shadow, so drift starts from the
  same numbers.

Backward ops are eager ops too: they are compared the same way, with
``phase="backward"``, the autograd node that ran them, and the source line of
the forward op that node belongs to.

Compiled graphs, forward and backward (:mod:`.compiled`): a debug variant of
the graph's XLA program also returns the values of the graph's tensor nodes
(every node, or every ``sample``-th); the FX graph is interpreted on CPU copies
of the same inputs, and each node is compared: ``drift`` is the CPU
interpretation against XLA's value, ``local`` the node's op on XLA's own values
of its inputs (when those were returned).

That debug variant is another program than the one the backend runs, so each
compiled call is also checked on what the real program computes
(:mod:`.fused`): ``output`` compares the real program's outputs (and the new
values of inputs it mutates) with the CPU interpretation's; when one leaves
tolerance, ``fused`` names the first node that drifts, found by bisection over
programs that compute a single node as the fused program does (``log2(n) + 1``
of them, once per graph, at most 8 graphs a run). The events are triaged with
what the node check found about that node; none found means the drift is the
fused program's own (constants folded, a reduction reassociated, an
intermediate kept in another precision). Compiled calls are checked on a
bounded schedule: each graph's first 8 calls, then every 50th.

Measures per op (over all its tensor outputs and written arguments;
:mod:`.measures`): max absolute error, max relative error, ULP distance,
elements over tolerance, NaN/Inf present on one side only, dtype mismatch, and
``ratio``: the worst error in units of its tolerance. An element is over
tolerance when ``|device - cpu| > atol + rtol * |cpu|`` (the rule of
``torch.testing.assert_close``) or when it is NaN/Inf on one side only.
Default tolerances (:mod:`.tolerances`), ``assert_close``'s:

    =====================  ========  ======
    dtype                  rtol      atol
    =====================  ========  ======
    float64, complex128    1e-7      1e-7
    float32, complex64     1.3e-6    1e-5
    float16                1e-3      1e-5
    bfloat16               1.6e-2    1e-5
    integers, bool         0         0
    =====================  ========  ======

Override them with ``tolerances=`` (``{"float32": (1e-4, 1e-6)}`` or the
string ``"float32=1e-4:1e-6,bfloat16=0.05"``; ``TPU_DEBUG_TOLERANCES``), or
switch them off with ``"off"``: nothing is then over tolerance, but an op
whose device output holds NaN/Inf while its device inputs were finite is still
reported (``nan_origin``). The first op over tolerance is marked ``first``
(per measure in eager mode, per graph and measure in compiled mode).

With TPU numerics (``trace(numerics="tpu")``, see
``tpu_debug.runtime.config``; :mod:`.tpu_numerics`), an op over tolerance is
re-run on the device at precision ``"highest"`` (first occurrence per op and
line; once per graph in compiled mode): ``highest=True`` says the divergence
disappears there.

Recording (:mod:`.recording`): events for ops over tolerance, NaN/Inf origins
and dtype mismatches, at most ``max_per_site`` per (op, line, measure); every
occurrence is counted in the run's ``divergence`` metadata, with how many ops
and nodes were compared and which could not be (no CPU kernel for them).

A verdict on a divergence computed once per site (as :mod:`.tpu_numerics`
does) belongs in a module of its own beside it, called from where the eager
and compiled checkers record a local event.
"""

from __future__ import annotations

from tpu_debug.tracers.recording.divergence.measures import Measures, compare
from tpu_debug.tracers.recording.divergence.tolerances import (
    DEFAULT_TOLERANCES,
    format_tolerances,
    parse_tolerances,
)
from tpu_debug.tracers.recording.divergence.tracer import DivergenceTracer

__all__ = [
    "DEFAULT_TOLERANCES",
    "DivergenceTracer",
    "Measures",
    "compare",
    "format_tolerances",
    "parse_tolerances",
]
