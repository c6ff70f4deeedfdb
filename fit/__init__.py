"""``tpu_debug.fit``: does a model train (or serve) on a TPU slice, and how fast?

Everything fit computes lives here, above the runtime and the tracers and below the face:

- :mod:`~tpu_debug.fit.options`: :class:`FitOptions`, what to compile (the keywords of
  :func:`fit`, the flags of ``tpu-debug fit``), checked when made;
- :mod:`~tpu_debug.fit.answer`: :func:`fit`, :func:`search`, :func:`fixes`, the answer
  (:class:`FitReport`) and keeping it as a run (:func:`record_fit`, :func:`record_search`);
- :mod:`~tpu_debug.fit.model_step`: a model's step traced into one JAX function
  (:func:`trace_step`), and compiled for one device of a target without data
  (:func:`compile_step`: does the model serve, or train, there?);
- :mod:`~tpu_debug.fit.sharded`: the ``(dp, fsdp, tp)`` mesh of a slice's compile-only
  devices, the parameters' placements and the one SPMD compile of the step;
- :mod:`~tpu_debug.fit.scan`: a training step whose decoder layers run as one loop;
- :mod:`~tpu_debug.fit.infer`: prefill and decode steps with a static KV cache;
- :mod:`~tpu_debug.fit.moe`: mixture-of-experts layers routed per batch shard;
- :mod:`~tpu_debug.fit.communication`: each collective kind beside the plan's bound
  (:class:`CollectiveBound`).

What reads an answer back stays with its layer: the ``FitEvent`` record in
``tracers/events.py``, the advisor's rules in ``tracers/advisor/fit_rules.py``, the report's
section in ``tpu_debug/report/fit.py``, the TUI's screen in ``tui/screens/fit.py`` and
the ``tpu-debug fit`` verb in ``tpu_debug/cli/fit.py``.

Example:
    >>> import tpu_debug
    >>> report = tpu_debug.fit("llama3-8b", "v5e-8", plan="fsdp", batch=8, seq=2048)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import sys
import types

from tpu_debug.fit.answer import (
    PRESETS,
    CollectiveCost,
    FitReport,
    Fixes,
    MemoryBreakdown,
    PlanSearch,
    StepEstimate,
    build_config,
    collective_costs,
    fit,
    fit_event,
    fixes,
    ici_rate,
    record_fit,
    record_search,
    remat_of,
    search,
)
from tpu_debug.fit.communication import CollectiveBound
from tpu_debug.fit.model_step import AdamW, StepCompile, TracedStep, compile_step, trace_step
from tpu_debug.fit.options import JOBS, FitOptions

__all__ = [
    "JOBS",
    "PRESETS",
    "AdamW",
    "CollectiveBound",
    "CollectiveCost",
    "FitOptions",
    "FitReport",
    "Fixes",
    "MemoryBreakdown",
    "PlanSearch",
    "StepCompile",
    "StepEstimate",
    "TracedStep",
    "build_config",
    "collective_costs",
    "compile_step",
    "fit",
    "fit_event",
    "fixes",
    "ici_rate",
    "record_fit",
    "record_search",
    "remat_of",
    "search",
    "trace_step",
]


class _CallablePackage(types.ModuleType):
    """``tpu_debug.fit`` names both this package and the function: once any submodule is
    imported, Python binds the package to ``tpu_debug``'s ``fit`` attribute, so the package
    answers a call as the function does."""

    def __call__(self, *args, **kwargs) -> FitReport:
        return fit(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        # help() and editors show the function's keywords, not (*args, **kwargs)
        return inspect.signature(fit)


# Python binds a subpackage over its parent's attribute of the same name when it is imported,
# so ``tpu_debug.fit`` is this package once anything imports ``tpu_debug.fit.*``. Both uses are
# public (``tpu_debug.fit(...)`` and ``tpu_debug.fit.fixes(...)``, ``from tpu_debug.fit import
# search``): renaming either breaks one, and a property on ``tpu_debug`` that hid the package
# would make ``import tpu_debug.fit as m`` give the function. A module whose class answers the
# call is the mechanism the language documents for module behaviour (the data model's
# "Customizing module attribute access": assign a ``types.ModuleType`` subclass to ``__class__``).
sys.modules[__name__].__class__ = _CallablePackage
