"""``torch.autocast("tpu")`` against ``torch.autocast("cpu")``: the same dtypes, the same
values within bfloat16 rounding, forward and backward, eager and compiled.

Tolerances: both sides compute the autocast ops in bfloat16 from the same
bfloat16-rounded inputs, but XLA and PyTorch's CPU kernels may accumulate in a
different order and round once differently; torch.testing's bfloat16 defaults
(rtol 1.6e-2, two units in the last place of an 8-bit mantissa) cover that.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime.autocast import LOWER_PRECISION, PROMOTE

import tpu_debug  # noqa: F401  (the tpu device)

BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-2}


def _both(fn, *inputs, dtype=torch.bfloat16):
    """``fn`` under CPU autocast on CPU tensors and under tpu autocast on their copies."""
    with torch.autocast("cpu", dtype=dtype):
        expected = fn(*inputs)
    with torch.autocast("tpu", dtype=dtype):
        got = fn(*(t.to("tpu") if isinstance(t, torch.Tensor) else t for t in inputs))
    return expected, got


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


CASES = {
    "mm": (torch.mm, (_rand(4, 8), _rand(8, 5))),
    "matmul": (torch.matmul, (_rand(2, 4, 8), _rand(8, 5))),
    "bmm": (torch.bmm, (_rand(2, 4, 8), _rand(2, 8, 3))),
    "addmm": (torch.addmm, (_rand(5), _rand(4, 8), _rand(8, 5))),
    "linear": (F.linear, (_rand(4, 8), _rand(6, 8), _rand(6))),
    "conv2d": (F.conv2d, (_rand(2, 3, 8, 8), _rand(4, 3, 3, 3), _rand(4))),
    "conv1d": (F.conv1d, (_rand(2, 3, 9), _rand(4, 3, 3))),
    "sdpa": (F.scaled_dot_product_attention, (_rand(1, 2, 4, 8), _rand(1, 2, 4, 8), _rand(1, 2, 4, 8))),
    "mse_loss": (F.mse_loss, (_rand(4, 8, dtype=torch.bfloat16), _rand(4, 8))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), (_rand(4, 5, dtype=torch.bfloat16), torch.tensor([0, 3, 1, 4]))),
    "prod": (lambda x: torch.prod(x, dim=1), (_rand(3, 4, dtype=torch.bfloat16),)),
    "cat (promote)": (lambda a, b: torch.cat([a, b]), (_rand(2, 3, dtype=torch.bfloat16), _rand(2, 3))),
    "stack (promote)": (lambda a, b: torch.stack([a, b]), (_rand(2, 3), _rand(2, 3, dtype=torch.bfloat16))),
    "add (not cast)": (torch.add, (_rand(2, 3, dtype=torch.bfloat16), _rand(2, 3, dtype=torch.bfloat16))),
    "relu (not cast)": (F.relu, (_rand(2, 3),)),
    "float64 mm (kept)": (torch.mm, (_rand(3, 4, dtype=torch.float64), _rand(4, 2, dtype=torch.float64))),
    "integer index_select": (lambda x, i: x.index_select(0, i), (_rand(4, 3), torch.tensor([2, 0]))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_class_computes_in_the_dtype_cpu_autocast_does(case):
    fn, inputs = CASES[case]
    expected, got = _both(fn, *inputs)
    assert got.device.type == "tpu"
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, **BF16_TOL)


def test_float16_autocast_lowers_to_float16():
    expected, got = _both(torch.mm, _rand(4, 8), _rand(8, 5), dtype=torch.float16)
    assert got.dtype == expected.dtype == torch.float16
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-3, atol=1e-3)  # float16: 11-bit mantissa


def test_every_named_op_has_a_cpu_autocast_kernel():
    # the lists name CPU autocast's classes; a name PyTorch no longer autocasts would be dead
    have = {
        name.split("::")[1].split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU")
    }
    assert LOWER_PRECISION | PROMOTE <= have


def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)
    )


def test_a_training_step_under_autocast_matches_cpu():
    cpu = _cnn()
    dev = _cnn().to("tpu")
    x, target = _rand(2, 3, 8, 8), torch.tensor([1, 4])
    for model, device in ((cpu, "cpu"), (dev, "tpu")):
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(x.to(device))
            loss = F.cross_entropy(logits, target.to(device))
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        loss.backward()
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters(), strict=True):
        assert p_dev.grad.dtype == p_cpu.grad.dtype == torch.float32, name
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, **BF16_TOL, msg=name)


def test_compiled_function_with_autocast_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
    dev.load_state_dict(cpu.state_dict())

    def step(model, x, device):
        with torch.autocast(device, dtype=torch.bfloat16):
            y = model(x)
        return y

    x = _rand(4, 8)
    expected = step(cpu, x, "cpu")
    got = torch.compile(step, backend="tpu_debug")(dev, x.to("tpu"), "tpu")
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), **BF16_TOL)


def test_autocast_off_inside_a_region_computes_in_float32():
    a, b = _rand(4, 8), _rand(8, 5)
    with torch.autocast("tpu", dtype=torch.bfloat16), torch.autocast("tpu", enabled=False):
        got = torch.mm(a.to("tpu"), b.to("tpu"))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), a @ b)
