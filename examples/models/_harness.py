"""Run one of the example models on the `tpu` device, eagerly or compiled, beside the same
model on PyTorch's CPU, and compare forward output, loss, gradients and the parameters
after one optimizer step.

Tolerances. The models are float32 and small (contractions over at most a few hundred
terms). The device and CPU sum in different orders, so each result differs by rounding:
about sqrt(K) * 2^-24 relative to the magnitudes summed, compounded over a few layers
and through backward. ``rtol=1e-4`` with an absolute floor of ``1e-4`` times the largest
entry of the compared tensor covers that with a wide margin while still catching a wrong
lowering (those are off by O(1) relative). Gradients are compared against their own
scale: a parameter whose gradient is all near zero (an unused embedding row) must not
fail on rounding noise. The optimizer is SGD: its step is linear in the gradient, so
parameters after it inherit the gradients' tolerance (Adam divides by sqrt(v), which
turns rounding in near-zero gradients into +-lr steps; see tests/runtime/test_compiled.py).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from collections.abc import Callable

import torch

import tpu_debug  # noqa: F401 - registers the tpu device

RTOL = 1e-4
SCALE_ATOL = 1e-4


@dataclasses.dataclass
class Comparison:
    """Largest error of each compared quantity, relative to the tolerance (<= 1 passes)."""

    worst: dict[str, float]
    loss_cpu: float
    loss_tpu: float

    @property
    def ok(self) -> bool:
        return all(v <= 1.0 for v in self.worst.values())

    def summary(self) -> str:
        name, value = max(self.worst.items(), key=lambda kv: kv[1])
        return (
            f"loss cpu {self.loss_cpu:.6f} tpu {self.loss_tpu:.6f}; {len(self.worst)} tensors compared, "
            f"worst {name} at {value:.3f} of the tolerance: {'OK' if self.ok else 'MISMATCH'}"
        )


def _ratio(dev: torch.Tensor, ref: torch.Tensor, *, rtol: float, scale_atol: float) -> float:
    dev = dev.detach().cpu().to(ref.dtype)
    ref = ref.detach()
    if dev.shape != ref.shape:
        return float("inf")
    if ref.numel() == 0:
        return 0.0
    if not ref.is_floating_point():
        return 0.0 if torch.equal(dev, ref) else float("inf")
    atol = scale_atol * ref.abs().max().item() + 1e-12
    allowed = atol + rtol * ref.abs()
    return ((dev - ref).abs() / allowed).max().item()


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    return []


def compare(
    make_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[], tuple],
    loss_of: Callable[[Callable, tuple], tuple],
    mode: str,
    *,
    lr: float = 0.1,
    rtol: float = RTOL,
    scale_atol: float = SCALE_ATOL,
    to_device: Callable[[tuple, str], tuple] | None = None,
) -> Comparison:
    """``loss_of(model, batch) -> (output, loss)`` on CPU and on `tpu` (the module compiled
    with ``tpu_debug.compile`` when ``mode == "compiled"``), then backward and one SGD step."""
    if mode not in ("eager", "compiled"):
        raise ValueError(f"mode must be 'eager' or 'compiled', not {mode!r}")
    torch.manual_seed(0)
    cpu = make_model()
    dev = copy.deepcopy(cpu).to("tpu")
    if hasattr(dev, "tie_weights"):  # moving to tpu unties shared parameters: see mingpt.GPT.tie_weights
        dev.tie_weights()
    batch = make_batch()
    if to_device is None:
        dev_batch = tuple(b.to("tpu") if isinstance(b, torch.Tensor) else b for b in batch)
    else:
        dev_batch = to_device(batch, "tpu")
    runner = tpu_debug.compile(dev) if mode == "compiled" else dev

    out_c, loss_c = loss_of(cpu, batch)
    out_d, loss_d = loss_of(runner, dev_batch)
    loss_c.backward()
    loss_d.backward()
    worst = {}
    for i, (d, c) in enumerate(zip(_flat(out_d), _flat(out_c))):
        worst[f"output[{i}]"] = _ratio(d, c, rtol=rtol, scale_atol=scale_atol)
    worst["loss"] = _ratio(loss_d, loss_c, rtol=rtol, scale_atol=scale_atol)
    for (name, p_c), p_d in zip(cpu.named_parameters(), dev.parameters()):
        if p_c.grad is None:
            worst[f"grad {name}"] = 0.0 if p_d.grad is None else float("inf")
            continue
        if p_d.grad is None:
            worst[f"grad {name}"] = float("inf")
            continue
        worst[f"grad {name}"] = _ratio(p_d.grad, p_c.grad, rtol=rtol, scale_atol=scale_atol)
    for (name, b_c), b_d in zip(cpu.named_buffers(), dev.buffers()):  # batch norm's running statistics
        worst[f"buffer {name}"] = _ratio(b_d, b_c, rtol=rtol, scale_atol=scale_atol)
    for model in (cpu, dev):
        torch.optim.SGD(model.parameters(), lr=lr).step()
    for (name, p_c), p_d in zip(cpu.named_parameters(), dev.parameters()):
        worst[f"param {name}"] = _ratio(p_d, p_c, rtol=rtol, scale_atol=scale_atol)
    return Comparison(worst, float(loss_c.detach()), float(loss_d.detach().cpu()))


def main_for(description: str, run: Callable[[str], Comparison], argv: list[str] | None = None) -> int:
    """The examples' command line: ``--mode eager|compiled`` (default: both)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mode", choices=("eager", "compiled", "both"), default="both")
    args = parser.parse_args(argv)
    modes = ("eager", "compiled") if args.mode == "both" else (args.mode,)
    ok = True
    for mode in modes:
        result = run(mode)
        print(f"{mode:>8}: {result.summary()}")
        ok &= result.ok
    return 0 if ok else 1
