"""``fast_local_compile`` (runtime/xla_options.py): XLA's backend optimization level 0 for the
programs compiled on this machine. The suite runs with it on (tests/conftest.py), so this file
holds the check that results do not depend on it: programs of each kind of kernel XLA's CPU
backend emits (elementwise loops with its own transcendental approximations, reductions,
library calls for dots and convolutions, scans), compiled at both levels, each against CPU
PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime.compile_cache import local_compile
from tpu_debug.runtime.config import config


@pytest.fixture
def level(request):
    saved = config.fast_local_compile
    config.fast_local_compile = request.param
    torch.tpu._clear_cache()  # every program below compiles at this level, none is served from before
    yield request.param
    config.fast_local_compile = saved
    torch.tpu._clear_cache()


@pytest.mark.parametrize("level", [False, True], indirect=True)
def test_a_local_compile_takes_backend_level_0_only_when_asked(level):
    with local_compile() as outcome:
        options = outcome.options or {}
    assert (options.get("xla_backend_optimization_level") == 0) is level


def _programs(x, w, img, kernel):
    return {
        "tanh_exp_erf": torch.tanh(x) * torch.exp(-x.abs()) + torch.special.erf(x),
        "softmax": torch.softmax(x * 3, dim=-1),
        "log_softmax_sum": F.log_softmax(x, dim=0).sum(dim=1),
        "matmul": x @ w,
        "conv2d": F.conv2d(img, kernel, padding=1),
        "layer_norm_gelu": F.gelu(F.layer_norm(x, (x.shape[-1],))),
        "cumsum": torch.cumsum(x, dim=1),
        "pow_rsqrt": torch.rsqrt(x.pow(2) + 1e-3),
    }


@pytest.mark.parametrize("level", [False, True], indirect=True)
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_results_equal_cpu_pytorch_at_either_level(level, mode):
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(33, 70, generator=gen), torch.randn(70, 17, generator=gen),
            torch.randn(2, 3, 12, 12, generator=gen), torch.randn(4, 3, 3, 3, generator=gen))
    expected = _programs(*args)
    fn = _programs if mode == "eager" else torch.compile(_programs, backend="tpu_debug", fullgraph=True)
    got = fn(*(a.to("tpu") for a in args))
    for name, value in expected.items():
        # torch.testing's float32 tolerances: the CPU backend's kernels at either level round
        # each operation in float32, and the order of a sum is XLA's choice, not LLVM's
        torch.testing.assert_close(got[name].cpu(), value, msg=lambda m, name=name: f"{name}: {m}")
