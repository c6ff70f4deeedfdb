"""With TPU numerics, does a divergence disappear at precision "highest"?

``trace(numerics="tpu")`` runs float32 matmuls and convolutions the way a
TPU's default precision does (bfloat16 passes, float32 sums; see
``tpu_debug.runtime.config``). An op over tolerance there is re-run on the
device at precision ``"highest"`` and compared with the same CPU reference:
within tolerance then, the divergence is a matmul-precision effect
(``torch.tpu.precision.set("highest")`` removes it); still over, it is not.
The re-run is a hint: when it cannot run, the verdict is None ("not checked").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.fx
from tpu_debug.runtime import probes
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.tensor import from_jax, to_jax
from tpu_debug.tracers.recording.divergence.measures import measure
from tpu_debug.tracers.recording.divergence.op_facts import device_outputs, op_info, tpu_tensors
from tpu_debug.tracers.recording.divergence.tolerances import tolerance_for
from tpu_debug.tracers.recording.divergence.values import CPU, payload_of

__all__ = ["graph_at_highest", "op_at_highest"]


@contextlib.contextmanager
def _precision_highest() -> Iterator[None]:
    saved = runtime_config.matmul_precision
    runtime_config.matmul_precision = "highest"
    try:
        yield
    finally:
        runtime_config.matmul_precision = saved


def op_at_highest(
    op: Any,
    args: tuple,
    kwargs: dict,
    before: dict,
    outputs: list[torch.Tensor],
    refs: list[torch.Tensor | None],
    tolerances: Mapping | None,
    rounding: Callable[[list], bool] | None = None,
) -> bool | None:
    """Re-run an eager op on the device at precision "highest": is it then within tolerance?

    ``before`` holds the payloads of the op's argument storages before it ran
    (the inputs of the re-run), ``outputs`` the op's device results and
    ``refs`` the CPU results they were compared with (local measure);
    ``rounding(results)``: whether results (numpy) over the dtype's tolerance are as close
    to the exact result as CPU's float32 (a product of large values at float32's accuracy).
    """
    on_device = _DeviceInputs(before)
    try:
        h_args, h_kwargs = on_device.map(args), on_device.map(kwargs)
        with _precision_highest(), probes.quiet(), torch.no_grad():
            h_out = op(*h_args, **h_kwargs)
    except Exception:  # noqa: BLE001 - the re-run is a hint; without it the event says "not checked"
        return None
    h_outputs = tpu_tensors(*device_outputs(op_info(op), h_args, h_kwargs, h_out))
    if len(h_outputs) != len(outputs):
        return None
    values = [np.asarray(to_jax(t)) for t in h_outputs]
    for value, ref in zip(values, refs):
        if ref is None:
            continue
        rtol, atol = tolerance_for(ref.dtype, tolerances)
        if measure(value, ref, rtol, atol, False).over:
            return rounding is not None and rounding(values)
    return True


class _DeviceInputs:
    """An op's ``tpu`` arguments as fresh device tensors on the payloads they held before it ran
    (so an in-place op re-run writes neither the program's tensors nor their storages)."""

    __slots__ = ("before", "copies")

    def __init__(self, before: dict) -> None:
        self.before = before
        self.copies: dict[int, torch.Tensor] = {}  # flat device tensors by id of payload

    def map(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.copy(value) if value.device.type == "tpu" else value
        if isinstance(value, (list, tuple)):
            return type(value)(self.map(v) for v in value)
        if isinstance(value, dict):
            return {k: self.map(v) for k, v in value.items()}
        return value

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        payload = self.before.get(id(t.untyped_storage()), payload_of(t))
        if payload is None or not hasattr(payload, "reshape"):
            raise LookupError("no payload")
        base = self.copies.get(id(payload))
        if base is None:
            base = self.copies[id(payload)] = from_jax(payload.reshape(-1), t.dtype)
        return base.as_strided(t.shape, t.stride(), t.storage_offset())


def graph_at_highest(
    graph: Any,
    arrays: list,
    chosen: frozenset,
    over: Iterable[torch.fx.Node],
    input_value: Callable[[torch.fx.Node], torch.Tensor],
    tolerances: Mapping | None,
) -> dict[str, bool]:
    """Run a compiled graph's debug variant at precision "highest": which of the nodes
    ``over`` (over tolerance at the default precision) are then within tolerance?

    ``arrays`` are the graph call's inputs and ``chosen`` the nodes its debug
    variant returns; ``input_value(node)`` is a node's input value on CPU as
    the default-precision run gave it (raises when it was not returned).

    Returns:
        node name -> within tolerance; nodes with no verdict are left out.
    """
    try:
        with _precision_highest(), probes.quiet():
            values = graph.debug_values(arrays, chosen)
    except Exception:  # noqa: BLE001 - a hint only
        return {}

    def cpu_arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return input_value(a)
        if isinstance(a, torch.device) and a.type == "tpu":
            return CPU
        return a

    verdicts = {}
    for node in over:
        if node.name not in values:
            continue
        # the node's local reference is the CPU op on the (default-precision) inputs: compare the
        # highest-precision value with it, as the eager re-run does
        try:
            args = [cpu_arg(a) for a in node.args]
            with torch.no_grad():
                ref = node.target(*args, **dict(node.kwargs))
        except Exception:  # noqa: BLE001, S112 - no CPU reference for this node: no verdict
            continue
        rtol, atol = tolerance_for(ref.dtype, tolerances)
        verdicts[node.name] = not measure(np.asarray(values[node.name]), ref, rtol, atol, False).over
    return verdicts
