"""How far a device result is from PyTorch's on CPU: :class:`Measures` and :func:`compare`.

Measures per result: max absolute error, max relative error, ULP distance
(floating point, counted in the CPU result's dtype), elements over tolerance,
NaN/Inf present on one side only, dtype mismatch, and ``ratio``: the worst
error in units of its tolerance. An element is over tolerance when
``|device - cpu| > atol + rtol * |cpu|`` or when it is NaN/Inf on one side
only; the same NaN/Inf on both sides is no divergence.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
from tpu_debug.runtime.dtypes import to_torch_dtype
from tpu_debug.tracers.recording.divergence.values import BF16

__all__ = ["Measures", "compare", "measure"]


@dataclasses.dataclass(slots=True)
class Measures:
    """How far a device result is from the CPU result (one output, or an op's worst)."""

    numel: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device_dtype: str = ""
    exact: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    ulp: float | None = None
    mismatched: int = 0
    ratio: float = 0.0  # the worst error in units of its tolerance
    allowed: float = 0.0  # the tolerance (absolute) at that element
    rtol: float = 0.0
    atol: float = 0.0
    device_nonfinite: int = 0  # NaN/Inf on the device only
    cpu_nonfinite: int = 0  # NaN/Inf on CPU only
    device_has_nonfinite: bool = False

    @property
    def over(self) -> bool:
        return self.mismatched > 0

    @property
    def dtype_mismatch(self) -> bool:
        return bool(self.device_dtype) and self.device_dtype != self.dtype

    def merge(self, other: Measures) -> Measures:
        """The op-level view of two outputs' measures: the worst of each, counts added."""
        worst = other if other.ratio > self.ratio or (other.over and not self.over) else self
        out = dataclasses.replace(worst)
        out.numel = self.numel + other.numel
        out.exact = self.exact and other.exact
        out.max_abs = max(self.max_abs, other.max_abs)
        out.max_rel = max(self.max_rel, other.max_rel)
        ulps = [u for u in (self.ulp, other.ulp) if u is not None]
        out.ulp = max(ulps) if ulps else None
        out.mismatched = self.mismatched + other.mismatched
        out.device_nonfinite = self.device_nonfinite + other.device_nonfinite
        out.cpu_nonfinite = self.cpu_nonfinite + other.cpu_nonfinite
        out.device_has_nonfinite = self.device_has_nonfinite or other.device_has_nonfinite
        if other.dtype_mismatch and not out.dtype_mismatch:
            out.dtype, out.device_dtype = other.dtype, other.device_dtype
        return out


def compare(
    device: np.ndarray, cpu: torch.Tensor, rtol: float, atol: float, *, detail: bool = True
) -> Measures:
    """Measures of ``device`` (the device's value, as numpy) against ``cpu`` (PyTorch's).

    Args:
        device: the device result.
        cpu: the CPU result (the reference).
        rtol, atol: an element is over tolerance when ``|device - cpu| > atol +
            rtol * |cpu|``; ``inf`` switches the check off.
        detail: also max relative error, ratio and ULP (without: only what
            decides whether to report, cheaper).

    Returns:
        The measures; ``exact`` when both hold the same bits.

    Example:
        >>> m = compare(np.float32([1, 2]), torch.tensor([1.0, 2.5]), 1.3e-6, 1e-5)
        >>> (m.max_abs, m.mismatched)
        (0.5, 1)
    """
    with np.errstate(all="ignore"):
        return measure(device, cpu, rtol, atol, detail)


def measure(device: np.ndarray, cpu: torch.Tensor, rtol: float, atol: float, detail: bool) -> Measures:
    """:func:`compare` for a caller that has switched numpy's floating-point warnings off
    (the tracer does so once around each op, not per comparison)."""
    ref = _numpy(cpu)
    m = Measures(
        numel=int(ref.size), shape=tuple(ref.shape), dtype=_dtype_name(cpu.dtype), rtol=rtol, atol=atol
    )
    m.device_dtype = m.dtype if device.dtype == ref.dtype else _dtype_name(device.dtype)
    floating = cpu.dtype.is_floating_point or cpu.dtype.is_complex
    off = math.isinf(rtol) or math.isinf(atol)
    if device.shape != ref.shape:
        m.exact = False
        m.mismatched = 0 if off else max(int(device.size), m.numel)
        m.max_abs = m.max_rel = m.ratio = math.inf
        return m
    same_dtype = device.dtype == ref.dtype
    if same_dtype and device.tobytes() == ref.tobytes():
        if floating and m.numel:
            m.device_has_nonfinite = not bool(
                np.isfinite(device.astype(np.float32) if device.dtype == BF16 else device).all()
            )
        return m
    m.exact = False
    if same_dtype and ref.dtype.kind == "f" and ref.dtype.itemsize >= 4:
        d, r = device, ref  # float32/64: compare as they are
    else:
        wide = np.complex128 if cpu.dtype.is_complex else np.float64
        d, r = device.astype(wide), ref.astype(wide)
    diff = np.abs(d - r)
    worst = float(diff.max()) if diff.size else 0.0
    if math.isfinite(worst):  # every element finite on both sides: the cheap tiers
        m.max_abs = worst
        if off or worst <= atol:
            return m
        allowed = atol + rtol * np.abs(r)
        over = diff > allowed
        m.mismatched = int(np.count_nonzero(over))
        if m.mismatched and detail:
            _fill_detail(m, device, ref, r, diff, allowed, None, cpu)
        return m
    _measure_nonfinite(m, device, ref, d, r, diff, off, detail, cpu)
    return m


def _measure_nonfinite(
    m: Measures, device, ref, d, r, diff, off: bool, detail: bool, cpu: torch.Tensor
) -> None:
    """NaN/Inf somewhere: which side holds them, and is it the same on both?"""
    fd, fr = np.isfinite(d), np.isfinite(r)
    m.device_has_nonfinite = not bool(fd.all())
    m.device_nonfinite = int((~fd & fr).sum())
    m.cpu_nonfinite = int((fd & ~fr).sum())
    both = fd & fr
    # off: infinite everywhere (atol + rtol * |cpu| would be inf + inf * 0, NaN, where cpu is 0)
    allowed = np.full(r.shape, math.inf) if off else m.atol + m.rtol * np.abs(r)
    if not off:
        over = ~(diff <= allowed)  # NaN differences count as over
        neither = ~(fd | fr)
        if neither.any():  # the same NaN/Inf on both sides is no divergence
            same = (d == r) | (np.isnan(d) & np.isnan(r))
            over &= ~(neither & same)
        m.mismatched = int(np.count_nonzero(over))
    if both.any():
        m.max_abs = float(diff[both].max())
        if detail:
            _fill_detail(m, device, ref, r, diff, allowed, both, cpu)
    if m.device_nonfinite or m.cpu_nonfinite:
        m.max_abs = m.max_rel = m.ratio = math.inf


def _fill_detail(m: Measures, device, ref, r, diff, allowed, both, cpu: torch.Tensor) -> None:
    """Max relative error, the worst ratio to tolerance and the ULP distance, over ``both``
    (the elements finite on both sides; None: all)."""
    db = (diff if both is None else diff[both]).astype(np.float64)
    rb = np.abs(r if both is None else r[both]).astype(np.float64)
    nonzero = rb > 0
    if nonzero.any():  # relative to exact zeros is infinite and says nothing: left out
        m.max_rel = float((db[nonzero] / rb[nonzero]).max())
    else:
        m.max_rel = math.inf if m.max_abs > 0 else 0.0
    ab = (allowed if both is None else allowed[both]).astype(np.float64)
    ratios = np.where(ab > 0, db / np.where(ab > 0, ab, 1.0), np.where(db > 0, np.inf, 0.0))
    i = int(np.argmax(ratios))
    m.ratio, m.allowed = float(ratios.flat[i]), float(ab.flat[i])
    if cpu.dtype.is_floating_point:
        m.ulp = _ulp(device, ref, both)


def _ulp(device: np.ndarray, ref: np.ndarray, both: np.ndarray | None) -> float:
    """Max distance in units in the last place of ``ref``'s dtype, over elements finite on both sides."""
    size = ref.dtype.itemsize
    ints = {2: np.int16, 4: np.int32, 8: np.int64}.get(size)
    if ints is None:
        return 0.0
    dev = device.astype(ref.dtype) if device.dtype != ref.dtype else device
    low = np.iinfo(ints).min

    def ordered(a: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(a).view(ints)
        bits = (bits if both is None else bits[both]).astype(np.int64)
        # sign-magnitude -> two's-complement order (-0.0 and 0.0 both map to 0)
        out = np.where(bits < 0, low - bits, bits)
        return out.astype(np.float64) if size == 8 else out

    return float(np.abs(ordered(dev) - ordered(ref)).max())


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as numpy (bfloat16 through ml_dtypes; conj and neg bits resolved)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """PyTorch's name of a torch or numpy dtype (``"float32"``), cached."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = _dtype_name_of(dtype)
    return name


def _dtype_name_of(dtype: Any) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")

    return str(to_torch_dtype(dtype)).removeprefix("torch.")
