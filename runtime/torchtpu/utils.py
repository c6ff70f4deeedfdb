"""``torch_tpu.utils`` and ``torch_tpu._internal.utils.utils`` (``.test_utils``,
``.tracer_utils``): TorchTPU's testing, tracing and model-inspection utilities.

``ActivationTracer(model)`` records each module's calls while its block runs (module hooks,
removed on exit), as TorchTPU's ``utils.ActivationTracer`` logs them for comparing two
implementations of a model module by module; ``pformat_activation_tracer`` draws the calls
as a tree, each tensor as ``get_tensor_summary`` puts it on one line.

``assert_close``, ``CheckValueMode``, ``OpTracer`` and ``pformat_op_tracer`` live in
:mod:`tpu_debug.runtime.tpu_utils`. ``format_model(model, *inputs, params=, pt=, aten=, shlo=)``
describes a model or a tensor function: its parameter count and estimated memory, PyTorch's
print of it, the aten ops a call dispatches (an ``OpTracer``), and the StableHLO of the
program that computes its outputs (the fused program DEFER_AND_FUSE mode records for one
call, as TorchTPU's ``sync.computation_mlir`` gives it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Self

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tpu_debug.runtime import lazy
from tpu_debug.runtime.torchtpu.execution_mode import EagerMode
from tpu_debug.runtime.torchtpu.sync import computation_mlir
from tpu_debug.runtime.tpu_utils import CheckValueMode, OpTracer, assert_close, pformat_op_tracer

__all__ = ["ActivationTracer", "CheckValueMode", "EagerMode", "Event", "OpTracer", "assert_close", "format_model",
           "get_tensor_summary", "model_memory", "pformat_activation_tracer", "pformat_op_tracer"]

Event = dict[str, Any]


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


class ActivationTracer(contextlib.ContextDecorator):
    """Inside the block, every call of ``model`` and of each module in it is logged, in order.

    Four lists of events (dicts, the form TorchTPU's tracer gives them): ``forward_pre_log``
    (``module``, ``args``, ``kwargs``) as a module's forward starts, ``forward_log`` (also
    ``output``) as it returns, ``backward_pre_log`` (``grad_output``) and ``backward_log``
    (``grad_input``, ``grad_output``) as autograd reaches it. Each event also has ``depth``
    (the model is 0, a child one more than its parent, except that the children of a
    ``ModuleList`` or ``ModuleDict`` share its depth), ``time`` (``time.perf_counter()``) and
    ``idx`` (its place among all four lists). Entering clears the lists.

    Example::

        with ActivationTracer(model) as trace:
            model(x)
        outputs = [event["output"] for event in trace.forward_log]
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._idx = 0
        self.forward_pre_log: list[Event] = []
        self.forward_log: list[Event] = []
        self.backward_pre_log: list[Event] = []
        self.backward_log: list[Event] = []

    def _log(self, log: list[Event], module: torch.nn.Module, depth: int, **fields: Any) -> None:
        log.append({"module": module, **fields, "depth": depth, "time": time.perf_counter(), "idx": self._idx})
        self._idx += 1

    def _hook(self, module: torch.nn.Module, depth: int) -> None:
        def forward_pre(m, args, kwargs):
            self._log(self.forward_pre_log, m, depth, args=args, kwargs=kwargs)

        def forward(m, args, kwargs, output):
            self._log(self.forward_log, m, depth, args=args, kwargs=kwargs, output=output)

        def backward_pre(m, grad_output):
            self._log(self.backward_pre_log, m, depth, grad_output=grad_output)

        def backward(m, grad_input, grad_output):
            self._log(self.backward_log, m, depth, grad_input=grad_input, grad_output=grad_output)

        self._handles += [module.register_forward_pre_hook(forward_pre, with_kwargs=True),
                          module.register_forward_hook(forward, with_kwargs=True),
                          module.register_full_backward_pre_hook(backward_pre),
                          module.register_full_backward_hook(backward)]
        container = isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
        for child in module.children():
            self._hook(child, depth if container else depth + 1)

    def __enter__(self) -> Self:
        for log in (self.forward_pre_log, self.forward_log, self.backward_pre_log, self.backward_log):
            log.clear()
        self._idx = 0
        self._hook(self._model, 0)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def get_tensor_summary(tensor: torch.Tensor, data: bool = True) -> str:
    """One line about ``tensor``: its shape, then (``data``) its minimum, maximum, mean,
    variance (of the values themselves: no Bessel correction) and whether it requires a
    gradient, then its dtype and device, e.g. ``(2, 3) Min:-0.85 Max:1.69 Mean:0.31 Var:0.77
    Grad:Y float32 cpu`` (TorchTPU's layout).

    Raises:
        TypeError: ``tensor`` is no tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"Expected a torch.Tensor, but got {type(tensor)}")
    parts = [str(tuple(tensor.shape))]
    if data:
        values = tensor.detach().cpu().double()
        if values.numel():
            parts += [f"Min:{values.min().item():.2f}", f"Max:{values.max().item():.2f}",
                      f"Mean:{values.mean().item():.2f}", f"Var:{values.var(correction=0).item():.2f}"]
        parts.append(f"Grad:{'Y' if tensor.requires_grad else 'N'}")
    parts += [str(tensor.dtype).removeprefix("torch."), str(tensor.device)]
    return " ".join(parts)


def _value_lines(prefix: str, args: tuple = (), kwargs: dict | None = None, output: Any = None) -> list[str]:
    def summary(item: Any) -> str:
        return get_tensor_summary(item) if isinstance(item, torch.Tensor) else type(item).__name__

    lines = [f"{prefix}Args[{key}]:   {summary(item)}" for key, item in [*enumerate(args), *(kwargs or {}).items()]]
    if isinstance(output, (list, tuple)):
        lines += [f"{prefix}Output[{i}]: {summary(item)}" for i, item in enumerate(output)]
    elif output is not None:
        lines.append(f"{prefix}Output:    {summary(output)}")
    return lines


def pformat_activation_tracer(tracer: ActivationTracer) -> str:
    """The forward calls an :class:`ActivationTracer` logged, as a tree: each module opens with
    ``+- Name (#idx)`` and its arguments and closes with its outputs and ``+- Name END (#idx)``,
    indented ``|  `` per depth (TorchTPU's ``tracer_utils`` layout).

    Raises:
        RuntimeError: the tracer holds a call that started and did not return (the block
            raised inside a module).
    """
    if len(tracer.forward_pre_log) != len(tracer.forward_log):
        raise RuntimeError("Pre-hook data and hook data are not the same length. "
                           f"{len(tracer.forward_pre_log)=}, {len(tracer.forward_log)=}")
    events = sorted([(e, True) for e in tracer.forward_pre_log] + [(e, False) for e in tracer.forward_log],
                    key=lambda pair: pair[0]["idx"])
    lines = ["ActivationTracer Collected Data:"]
    for n, (event, starts) in enumerate(events):
        indent = "|  " * event["depth"]
        name = type(event["module"]).__name__
        if starts:
            lines.append(f"{indent}+- {name} (#{event['idx']})")
            lines += _value_lines(indent + "|  ", event["args"], event["kwargs"])
            lines.append(f"{indent}|")
        else:
            lines += _value_lines(indent + "|  ", output=event["output"])
            lines.append(f"{indent}+- {name} END (#{event['idx']})")
            if n + 1 < len(events):
                lines.append(indent)
    return "\n".join(lines)
