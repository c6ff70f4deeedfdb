"""``torch_tpu.utils`` and ``torch_tpu._internal.utils.utils`` (``.test_utils``,
``.tracer_utils``): TorchTPU's testing, tracing and model-inspection utilities.

``assert_close``, ``CheckValueMode``, ``OpTracer`` and ``pformat_op_tracer`` live in
:mod:`tpu_debug.runtime.tpu_utils`. ``format_model(model, *inputs, params=, pt=, aten=, shlo=)``
describes a model or a tensor function: its parameter count and estimated memory, PyTorch's
print of it, the aten ops a call dispatches (an ``OpTracer``), and the StableHLO of the
program that computes its outputs (the fused program DEFER_AND_FUSE mode records for one
call, as TorchTPU's ``sync.computation_mlir`` gives it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tpu_debug.runtime import lazy
from tpu_debug.runtime.torchtpu.execution_mode import EagerMode
from tpu_debug.runtime.torchtpu.sync import computation_mlir
from tpu_debug.runtime.tpu_utils import CheckValueMode, OpTracer, assert_close, pformat_op_tracer

__all__ = ["CheckValueMode", "EagerMode", "OpTracer", "assert_close", "format_model", "model_memory",
           "pformat_op_tracer"]


def model_memory(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> float:
    """GiB a model needs if every value is ``dtype``: its parameters (twice for those that
    take gradients) and its buffers."""
    count = sum(p.numel() * (2 if p.requires_grad else 1) for p in model.parameters())
    count += sum(b.numel() for b in model.buffers())
    return count * torch.empty((), dtype=dtype).element_size() / 1024.0**3


def format_model(model: torch.nn.Module | Callable[..., Any], *input_tensors: Any, params: bool = False,
                 pt: bool = False, aten: bool = False, shlo: bool = False) -> str:
    """Describe ``model`` (a module or a function of tensors) called on ``input_tensors``.

    Args:
        params: the parameter counts and :func:`model_memory`.
        pt: PyTorch's print of the model (a function: the FX graph ``make_fx`` traces of it).
        aten: the aten ops one call dispatches, as :func:`pformat_op_tracer` lists them.
        shlo: the StableHLO of the program computing the call's outputs (inputs on ``tpu``).

    Returns:
        The parts asked for, in that order.
    """
    shown = model
    if not isinstance(model, torch.nn.Module) and pt:
        shown = make_fx(model)(*input_tensors)
    text = ""
    if params:
        if not isinstance(model, torch.nn.Module):
            raise TypeError("format_model(params=True) needs an nn.Module")
        total = sum(p.numel() for p in model.parameters())
        train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        text += f"Parameters: {total}, Trainable: {train}\n"
        text += f"Estimated Memory: {model_memory(model):.3f} GB (based on # of parameters and dtype)\n"
    if pt:
        text += (shown.print_readable(print_output=False) if isinstance(shown, torch.fx.GraphModule)
                 else str(shown)) + "\n"
    if aten:
        with OpTracer() as tracer:
            model(*input_tensors)
        text += tracer._pformat() + "\n"
    if shlo:
        with lazy.set_eager_mode(EagerMode.DEFER_AND_FUSE):
            outputs = model(*input_tensors)
            text += computation_mlir(outputs) + "\n"
    return text
