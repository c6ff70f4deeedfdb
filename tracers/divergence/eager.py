"""Eager ops against PyTorch on CPU: each op's local error and drift.

- ``local``: the CPU op on the device op's own inputs. It isolates the op
  that introduces an error, since an op downstream of it gets the same
  (already wrong) inputs on both sides.
- ``drift``: the CPU op on the CPU shadows of its inputs (:mod:`.shadows`),
  so drift shows how error propagates. Inputs with no shadow take the
  device's values.

Random ops, uninitialised memory and data copied from the host are not
compared: their device values are copied into the shadow, so drift starts
from the same numbers. Backward ops are eager ops too, recorded with
``phase="backward"``, the autograd node that ran them, and the source line of
the forward op that node belongs to.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.tensor import PAYLOAD_ATTR, to_jax
from tpu_debug.tracers.divergence.measures import Measures, measure
from tpu_debug.tracers.divergence.ops import OpInfo, device_outputs, op_info, tpu_tensors
from tpu_debug.tracers.divergence.recording import EventLog, Subject
from tpu_debug.tracers.divergence.shadows import Shadows
from tpu_debug.tracers.divergence.tolerances import tolerance_for
from tpu_debug.tracers.divergence.tpu_numerics import op_at_highest
from tpu_debug.tracers.divergence.values import (
    all_finite,
    geometry,
    host_copy,
    is_float_payload,
    map_tpu,
    on_tpu,
    payload_of,
    single_threaded,
    tensors,
    value_at,
)
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import user_location

__all__ = ["EagerChecker"]

# forward lines kept for backward ops: beyond the limit, the oldest half is dropped
_FORWARD_LINES_LIMIT = 200_000


@dataclasses.dataclass(slots=True)
class _Compared:
    """One device output and the CPU results it was compared with."""

    device: np.ndarray
    local_ref: torch.Tensor
    drift_ref: torch.Tensor
    rtol: float
    atol: float


class EagerChecker:
    """Compares every eager op on a ``tpu`` tensor with PyTorch on CPU (``before_op``/``on_op``).

    Args:
        log: where divergences are counted and recorded.
        tolerances: a tolerance table (None: the defaults).
    """

    def __init__(self, log: EventLog, tolerances: Mapping | None) -> None:
        self.log = log
        self.tolerances = tolerances
        self.shadows = Shadows()
        self.uncompared: dict[str, str] = {}  # op -> why PyTorch on CPU could not run it
        self.ops_compared = 0
        self.ops_copied = 0
        self._pending = threading.local()
        self._forward_lines: dict[int, SourceLocation | None] = {}

    def before_op(self, op: Any, args: tuple, kwargs: dict) -> None:
        # jax payloads are immutable: holding the current ones is the pre-op snapshot
        # (a CPU tensor's storage has none: it maps to None, harmlessly)
        snapshot = {}
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                snapshot[id(storage)] = getattr(storage, PAYLOAD_ATTR, None)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, torch.Tensor):
                        storage = t.untyped_storage()
                        snapshot[id(storage)] = getattr(storage, PAYLOAD_ATTR, None)
        self._pending.op = (op, snapshot)

    def on_op(self, op: Any, args: tuple, kwargs: dict, out: Any) -> None:
        pending = getattr(self._pending, "op", None)
        self._pending.op = None
        if pending is None or pending[0] is not op:
            return
        self._note_forward_line(args, kwargs)
        with single_threaded():
            self._check(op, op_info(op), args, kwargs or {}, out, pending[1])

    def _check(self, op: Any, info: OpInfo, args: tuple, kwargs: dict, out: Any, before: dict) -> None:
        """One op call: its CPU results, measured against the device's; events for what diverges.

        ``before`` holds the payloads of the op's argument storages before it ran (by ``id`` of storage).
        """
        returned, written = device_outputs(info, args, kwargs, out)
        outputs = tpu_tensors(returned, written)
        if not outputs:
            return
        if info.skip is not None or _loaded(info, args, kwargs):
            self.ops_copied += 1
            self._adopt_device(outputs, before)
            return
        if info.name in self.uncompared:
            self._adopt_device(outputs, before)
            return
        refs = self._cpu_results(op, info, args, kwargs, returned, written, before)
        if refs is None:
            self._adopt_device(outputs, before)
            return
        local_refs, drift_refs = refs
        self.ops_compared += 1
        local, drift, compared = self._measure(outputs, local_refs, drift_refs, before)
        if local is None:
            return
        nan_origin = local.device_has_nonfinite and _made_nonfinite(before, args, kwargs)
        local_event = local.over or nan_origin or local.dtype_mismatch
        if not (local_event or drift.over):
            return
        subject = _subject(info, self._forward_lines)
        if local_event:
            highest = None
            if local.over:
                highest = self._highest(subject, op, args, kwargs, before, outputs, local_refs)
            detail = _detail(compared, "local")
            self.log.record(subject, "local", local, nan_origin=nan_origin, highest=highest, detail=detail)
        if drift.over:
            self.log.record(subject, "drift", drift, detail=_detail(compared, "drift"))

    def _adopt_device(self, outputs: list[torch.Tensor], before: dict) -> None:
        for t in outputs:
            self.shadows.adopt_device(t, before)

    def _cpu_results(
        self, op: Any, info: OpInfo, args: tuple, kwargs: dict, returned: list, written: list, before: dict
    ) -> tuple[list, list] | None:
        """The op run by PyTorch on CPU: on the device's inputs (local) and on their shadows
        (drift), lined up with the device outputs. None: PyTorch on CPU could not run it."""
        inputs = _CpuInputs(self.shadows, before, bool(info.writes))
        l_args, l_kwargs = map_tpu(args, inputs.local), map_tpu(kwargs, inputs.local)
        try:
            l_out = op(*l_args, **l_kwargs)
        except Exception as exc:  # noqa: BLE001 - no CPU kernel for this call: noted, not compared
            self.uncompared.setdefault(info.name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            return None
        local_refs = _lined_up(l_out, returned, written, l_args, l_kwargs)
        if info.writes:  # the drift run may write the same CPU tensors
            local_refs = [r.clone() if r is not None else None for r in local_refs]
        d_args, d_kwargs = map_tpu(args, inputs.drift), map_tpu(kwargs, inputs.drift)
        if not inputs.drifted:
            return local_refs, local_refs
        try:
            d_out = op(*d_args, **d_kwargs)
            return local_refs, _lined_up(d_out, returned, written, d_args, d_kwargs)
        except Exception:  # noqa: BLE001 - the shadow's values made the CPU op fail: restart from the device's
            return local_refs, local_refs

    def _measure(
        self, outputs: list[torch.Tensor], local_refs: list, drift_refs: list, before: dict
    ) -> tuple[Measures | None, Measures | None, list[_Compared]]:
        """The op's worst local and drift measures over its outputs (cheap tier); each output's
        shadow becomes its CPU result."""
        local = drift = None
        compared = []
        for t, l_ref, d_ref in zip(outputs, local_refs, drift_refs):
            if l_ref is None:
                continue
            dev = np.asarray(to_jax(t))
            rtol, atol = tolerance_for(l_ref.dtype, self.tolerances)
            lm = measure(dev, l_ref, rtol, atol, False)
            dm = lm if d_ref is l_ref else measure(dev, d_ref, rtol, atol, False)
            local = lm if local is None else local.merge(lm)
            drift = dm if drift is None else drift.merge(dm)
            compared.append(_Compared(dev, l_ref, d_ref, rtol, atol))
            self.shadows.update(t, d_ref, dm.exact, before)
        return local, drift, compared

    def _highest(
        self, subject: Subject, op: Any, args: tuple, kwargs: dict, before: dict, outputs: list, refs: list
    ) -> bool | None:
        """With TPU numerics, the op's verdict at precision "highest" (re-run once per site)."""
        site = self.log.site(subject, "local")
        if not site.checked_highest and runtime_config.product_passes():
            site.checked_highest = True
            site.highest = op_at_highest(op, args, kwargs, before, outputs, refs, self.tolerances)
        return site.highest

    def _note_forward_line(self, args: tuple, kwargs: dict) -> None:
        """Remember the line of a forward op that records an autograd node (its backward's line)."""
        if not torch.is_grad_enabled() or torch._C._current_autograd_node() is not None:
            return
        if any(t.requires_grad for t in tensors((args, kwargs))):
            lines = self._forward_lines
            if len(lines) > _FORWARD_LINES_LIMIT:
                for k in list(lines)[: _FORWARD_LINES_LIMIT // 2]:
                    del lines[k]
            # the op's node took the sequence number before its kernel ran
            lines[torch._C._autograd._get_sequence_nr() - 1] = user_location(1)


class _CpuInputs:
    """An op's ``tpu`` arguments as CPU tensors: ``local`` holds the device's values before the
    op, ``drift`` the storages' shadows (the device's values where there is none)."""

    __slots__ = ("before", "drifted", "fresh", "hosts", "shadows", "writes")

    def __init__(self, shadows: Shadows, before: dict, writes: bool) -> None:
        self.shadows = shadows
        self.before = before
        self.writes = writes
        self.drifted = False  # some argument has a shadow
        self.hosts: dict[int, torch.Tensor] = {}  # CPU copies by id of payload
        self.fresh: dict[int, torch.Tensor] = {}  # the same for the drift run, when the op writes

    def local(self, t: torch.Tensor) -> torch.Tensor:
        payload = self.before.get(id(t.untyped_storage()), payload_of(t))
        host = self.hosts.get(id(payload))
        if host is None:
            host = self.hosts[id(payload)] = host_copy(payload, t.dtype)
        return geometry(host, t)

    def drift(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        payload = self.before.get(id(storage), payload_of(t))
        entry = self.shadows.get(storage)
        if entry is not None and entry.payload is payload:
            self.drifted = True
            return geometry(entry.host, t)
        if not self.writes:
            return self.local(t)
        host = self.fresh.get(id(payload))  # the local run wrote its copies: start again
        if host is None:
            host = self.fresh[id(payload)] = host_copy(payload, t.dtype)
        return geometry(host, t)


def _loaded(info: OpInfo, args: tuple, kwargs: dict) -> bool:
    """A copy from the host: data loaded onto the device."""
    return info.copy_source is not None and not on_tpu(value_at(args, kwargs, info.copy_source, "src"))


def _lined_up(cpu_out: Any, returned: list, written: list, cpu_args: Any, cpu_kwargs: Any) -> list:
    """The CPU results lined up with the device outputs (returned, then written); None where
    the CPU op gave a different number of results."""
    refs: list = []
    cpu_returned = [cpu_out] if isinstance(cpu_out, torch.Tensor) else list(tensors(cpu_out))
    if len(cpu_returned) != len(returned):
        cpu_returned = [None] * len(returned)
    refs.extend(r for t, r in zip(returned, cpu_returned) if on_tpu(t))
    for _t, pos, name, i in written:
        value = value_at(cpu_args, cpu_kwargs, pos, name)
        refs.append(value[i] if isinstance(value, (list, tuple)) else value)
    return refs


def _subject(info: OpInfo, forward_lines: dict[int, SourceLocation | None]) -> Subject:
    """The op as events name it: a backward op carries its autograd node and its forward op's line."""
    node = torch._C._current_autograd_node()
    if node is not None:
        phase, autograd, location = "backward", node.name(), forward_lines.get(node._sequence_nr())
    else:
        phase, autograd, location = "forward", "", user_location(1)
    return Subject("eager", info.name, info.name, phase, location, autograd_node=autograd)


def _detail(compared: list[_Compared], which: str) -> Callable[[], Measures]:
    """The op's full measures (relative error, ratio, ULP), computed when an event is written."""

    def full() -> Measures:
        out = None
        for c in compared:
            ref = c.local_ref if which == "local" else c.drift_ref
            m = measure(c.device, ref, c.rtol, c.atol, True)
            out = m if out is None else out.merge(m)
        return out

    return full


def _made_nonfinite(before: dict, args: tuple, kwargs: dict) -> bool:
    """An op whose output holds NaN/Inf made them itself: its floating inputs (read before
    it wrote any) are finite. Not when there are none, or a scalar argument is NaN/Inf:
    an attention mask of -inf is made on purpose."""
    floats = [p for p in before.values() if is_float_payload(p)]
    if not floats:
        return False
    if any(not math.isfinite(v) for v in _floats((args, kwargs))):
        return False
    return all(all_finite(p) for p in floats)


def _floats(value: Any) -> Iterator[float]:
    """The Python floats in an op's arguments."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
