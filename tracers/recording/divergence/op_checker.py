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
from tpu_debug.tracers.recording.divergence.measures import Measures, measure
from tpu_debug.tracers.recording.divergence.op_facts import OpInfo, device_outputs, op_info, tpu_tensors
from tpu_debug.tracers.recording.divergence.emulated_precision import (
    PRECISION,
    changed_decision,
    emulated,
    measure_product,
)
from tpu_debug.tracers.recording.divergence.event_log import EventLog, Subject
from tpu_debug.tracers.recording.divergence.shadows import Shadows
from tpu_debug.tracers.recording.divergence.tolerances import tolerance_for
from tpu_debug.tracers.recording.divergence.tpu_numerics import op_at_highest
from tpu_debug.tracers.recording.divergence.triage import (
    BRANCHES,
    RESULT_BRANCHES,
    Causes,
    Triaged,
    Verdict,
    as_close_as_cpu,
    base_name,
    crossings_in,
    crossings_out,
    eager_in_float64,
    eager_module,
    op_where,
)
from tpu_debug.tracers.recording.divergence.values import (
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
from tpu_debug.tracers.events import Crossing, SourceLocation
from tpu_debug.tracers.location import user_location

__all__ = ["EagerChecker"]

# forward lines kept for backward ops: beyond the limit, the oldest half is dropped
_FORWARD_LINES_LIMIT = 200_000


@dataclasses.dataclass(slots=True)
class _Compared:
    """One device output and the CPU results it was compared with."""

    tensor: torch.Tensor
    device: np.ndarray
    local_ref: torch.Tensor
    drift_ref: torch.Tensor
    drift_exact: bool
    rtol: float
    atol: float


@dataclasses.dataclass(slots=True)
class _CpuRun:
    """An op run by PyTorch on CPU: its results lined up with the device's (local: on the
    device's inputs; drift: on their shadows), why its inputs differ from the CPU run
    (``causes``) and the elements it took another branch on (``crossed``, a non-smooth op)."""

    local_refs: list
    drift_refs: list
    drifted: bool  # some input had a shadow
    causes: frozenset
    crossed: tuple[str, int, int] | None
    local_args: tuple = ()  # the CPU copies of the op's inputs the local results were made from
    local_kwargs: dict = dataclasses.field(default_factory=dict)


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
        self.causes = Causes()

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
        run = self._cpu_results(op, info, args, kwargs, returned, written, before)
        if run is None:
            self._adopt_device(outputs, before)
            return
        self.ops_compared += 1
        product = emulated(op)  # a product at the emulated TPU precision: held to that precision
        local, drift, compared = self._measure(outputs, run.local_refs, run.drift_refs, product)
        if local is None:
            return
        devices, refs = [c.device for c in compared], [c.local_ref for c in compared]
        args_kwargs = (run.local_args, run.local_kwargs)
        if local.over and not info.writes and as_close_as_cpu(op, *args_kwargs, devices, refs):
            local.mismatched = 0  # float32 rounding of large values: within what float32 itself allows
        # a product that differs from CPU at all: the emulated precision's difference, a cause of
        # what differs after it
        precision = product and not local.exact
        nan_origin = local.device_has_nonfinite and _made_nonfinite(before, args, kwargs)
        local_event = local.over or nan_origin or local.dtype_mismatch
        crossed = run.crossed or (_result_crossings(info, compared) if run.drifted else None)
        subject = _subject(info, self._forward_lines) if (local_event or drift.over or crossed or precision) else None
        # why the outputs differ from the CPU run: their inputs' causes, a crossing here, and
        # this op itself when it is over tolerance on its own inputs (its float64 verdict) or is
        # a product whose difference is the emulated precision's
        new = []
        crossing = None
        if crossed:
            branch, elements, numel = crossed
            loc = subject.location
            crossing = Crossing(
                info.name, elements, numel, branch, eager_module() if subject.phase == "forward" else "",
                loc.file if loc else "", loc.line if loc else 0, subject.phase,
            )
            new.append(self.causes.new("crossing", crossing=crossing))
        verdict = None
        if local.over:
            verdict = self._verdict(subject, op, args, kwargs, before, local.max_abs)
            kind = Causes.of_op(verdict)
            new.append(self.causes.new(PRECISION if product and kind == "noise" else kind,
                                       where=op_where(info.name, subject.location)))
        elif precision:
            new.append(self.causes.new(PRECISION, where=op_where(info.name, subject.location)))
        decided = changed_decision(info.name, crossed, run.causes, crossing) if crossing is not None else None
        causes = Causes.merge(run.causes, new) if new else run.causes
        for c in compared:
            self.shadows.update(c.tensor, c.drift_ref, c.drift_exact, before, causes)
        if not (local_event or drift.over):
            return
        own = (lambda: Triaged.from_float64(verdict)) if local.over else None
        if local_event:
            highest = None
            if local.over:
                rounding = None if info.writes else (lambda devs: as_close_as_cpu(op, *args_kwargs, devs, run.local_refs))
                highest = self._highest(subject, op, args, kwargs, before, outputs, run.local_refs, rounding)
            detail = _detail(compared, "local")
            self.log.record(subject, "local", local, nan_origin=nan_origin, highest=highest, detail=detail,
                            triage=own)
        if drift.over:
            self.log.record(subject, "drift", drift, detail=_detail(compared, "drift"),
                            triage=own or ((lambda: decided) if decided else (lambda: Causes.triage(causes))))

    def _adopt_device(self, outputs: list[torch.Tensor], before: dict) -> None:
        for t in outputs:
            self.shadows.adopt_device(t, before)

    def _cpu_results(
        self, op: Any, info: OpInfo, args: tuple, kwargs: dict, returned: list, written: list, before: dict
    ) -> _CpuRun | None:
        """The op run by PyTorch on CPU: on the device's inputs (local) and on their shadows
        (drift), lined up with the device outputs. None: PyTorch on CPU could not run it."""
        inputs = _CpuInputs(self.shadows, before, bool(info.writes))
        l_args, l_kwargs = map_tpu(args, inputs.local), map_tpu(kwargs, inputs.local)
        # the drift inputs are the shadows, or copies of their own when the op writes: mapped
        # before either run, so a non-smooth op's branches are read from inputs not yet written
        d_args, d_kwargs = map_tpu(args, inputs.drift), map_tpu(kwargs, inputs.drift)
        crossed = None
        if inputs.drifted and base_name(info.name) in BRANCHES:
            crossed = crossings_in(info.name, (l_args, l_kwargs), (d_args, d_kwargs))
        try:
            l_out = op(*l_args, **l_kwargs)
        except Exception as exc:  # noqa: BLE001 - no CPU kernel for this call: noted, not compared
            self.uncompared.setdefault(info.name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            return None
        local_refs = _lined_up(l_out, returned, written, l_args, l_kwargs)
        if info.writes:  # the drift run may write the same CPU tensors
            local_refs = [r.clone() if r is not None else None for r in local_refs]
        if not inputs.drifted:
            return _CpuRun(local_refs, local_refs, False, inputs.causes, None, l_args, l_kwargs)
        try:
            d_out = op(*d_args, **d_kwargs)
            drift_refs = _lined_up(d_out, returned, written, d_args, d_kwargs)
        except Exception:  # noqa: BLE001 - the shadow's values made the CPU op fail: restart from the device's
            return _CpuRun(local_refs, local_refs, False, frozenset(), None, l_args, l_kwargs)
        return _CpuRun(local_refs, drift_refs, True, inputs.causes, crossed, l_args, l_kwargs)

    def _verdict(
        self, subject: Subject, op: Any, args: tuple, kwargs: dict, before: dict, max_abs: float
    ) -> Verdict | None:
        """The op's float64 verdict (:mod:`.triage`; re-run once per site)."""
        site = self.log.site(subject, "local")
        if not site.checked_verdict:
            site.checked_verdict = True
            site.verdict = eager_in_float64(op, args, kwargs, before, max_abs, self.tolerances)
        return site.verdict

    def _measure(
        self, outputs: list[torch.Tensor], local_refs: list, drift_refs: list, product: bool = False
    ) -> tuple[Measures | None, Measures | None, list[_Compared]]:
        """The op's worst local and drift measures over its outputs (cheap tier); ``product``: a
        product at the emulated TPU precision, measured at that precision (see :mod:`.precision`)."""
        local = drift = None
        compared = []
        for t, l_ref, d_ref in zip(outputs, local_refs, drift_refs):
            if l_ref is None:
                continue
            dev = np.asarray(to_jax(t))
            if product and l_ref.dtype.is_floating_point:
                lm = measure_product(dev, l_ref, False)
                dm = lm if d_ref is l_ref else measure_product(dev, d_ref, False)
                rtol, atol = lm.rtol, lm.atol
            else:
                rtol, atol = tolerance_for(l_ref.dtype, self.tolerances)
                lm = measure(dev, l_ref, rtol, atol, False)
                dm = lm if d_ref is l_ref else measure(dev, d_ref, rtol, atol, False)
            local = lm if local is None else local.merge(lm)
            drift = dm if drift is None else drift.merge(dm)
            compared.append(_Compared(t, dev, l_ref, d_ref, dm.exact, rtol, atol))
        return local, drift, compared

    def _highest(
        self, subject: Subject, op: Any, args: tuple, kwargs: dict, before: dict, outputs: list, refs: list,
        rounding: Callable[[list], bool] | None = None,
    ) -> bool | None:
        """With TPU numerics, the op's verdict at precision "highest" (re-run once per site);
        ``rounding``: whether device results are as close to CPU as float32 rounding allows."""
        site = self.log.site(subject, "local")
        if not site.checked_highest and runtime_config.product_passes():
            site.checked_highest = True
            site.highest = op_at_highest(op, args, kwargs, before, outputs, refs, self.tolerances, rounding)
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

    __slots__ = ("before", "causes", "drifted", "fresh", "hosts", "shadows", "writes")

    def __init__(self, shadows: Shadows, before: dict, writes: bool) -> None:
        self.shadows = shadows
        self.before = before
        self.writes = writes
        self.drifted = False  # some argument has a shadow
        self.causes: frozenset = frozenset()  # why the shadowed arguments differ
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
            if entry.causes:
                self.causes = Causes.merge(self.causes, entry.causes)
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


def _result_crossings(info: OpInfo, compared: list[_Compared]) -> tuple[str, int, int] | None:
    """An op whose branch is an integer or bool result (a comparison, argmax): the elements
    that differ from the CPU run's, where its result on its own inputs matches CPU."""
    if base_name(info.name) not in RESULT_BRANCHES:
        return None
    local_same = all(
        c.local_ref is not None and np.array_equal(c.device, c.local_ref.numpy()) for c in compared
        if not (c.local_ref.is_floating_point() or c.local_ref.is_complex())
    )
    if not local_same:
        return None
    return crossings_out(info.name, [c.device for c in compared], [c.drift_ref for c in compared])


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
