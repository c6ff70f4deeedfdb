"""TorchTPU's debugging utilities on this runtime (runtime/tpu_utils.py): cache
statistics against the calls the test made, the op tracer against the ops the test
ran, assert_close against torch.testing.assert_close."""

from __future__ import annotations

import re

import pytest
import torch
from tpu_debug.runtime import clear_cache
from tpu_debug.runtime.config import config

NEVER = torch.tpu.EagerMode.DEFER_NEVER
FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE


def _cache(name):
    return next(c for c in torch.tpu._get_cache_stats().caches if c.name == name)


def test_eager_cache_stats_count_the_calls_made():
    clear_cache()
    a, b = torch.ones(3, device="tpu"), torch.ones(5, device="tpu")
    with torch.tpu.set_eager_mode(NEVER):
        for _ in range(4):
            torch.mul(a, a)
        for _ in range(2):
            torch.mul(b, b)  # another shape: a second executable
    muls = [e for e in _cache("eager executables").entries if e.name == "mul.Tensor"]
    assert sorted(e.requests for e in muls) == [2, 4]
    assert sorted(e.hits for e in muls) == [1, 3]
    assert all(e.compile_seconds > 0 for e in muls)
    stats = _cache("eager executables")
    assert stats.requests - stats.hits == stats.misses == len(stats.entries)


def test_fused_program_stats_count_its_runs():
    # a shape no other test uses, so the graph is new to this process; entries share names
    # (one per graph shape of ops), so the cache's totals are compared, not entries by name
    from tpu_debug.runtime import lazy

    lazy._fused.clear()  # a cache left full by earlier tests would evict as this one adds
    x = torch.ones(3, 29, device="tpu")
    before = _cache("fused programs")
    with torch.tpu.set_eager_mode(FUSE):
        for _ in range(3):
            ((x * 3.0).sin() + 1.0).cpu()  # the same graph, run three times
    after = _cache("fused programs")
    assert after.requests - before.requests == 3
    assert after.hits - before.hits == 2  # compiled by its first run
    assert len(after.entries) == len(before.entries) + 1


def test_op_tracer_counts_the_ops_run():
    x, w = torch.randn(4, 8, device="tpu"), torch.randn(8, 2, device="tpu")
    with torch.tpu.utils.OpTracer() as tracer:
        for _ in range(3):
            y = x @ w
        y.add_(1.0)
        y.add_(2.0)
    aten = tracer.ops_log["aten"]
    assert aten["aten.mm.default"] == 3
    assert aten["aten.add_.Tensor"] == 2
    assert tracer.num_atens() == sum(aten.values()) >= 5
    text = torch.tpu.utils.pformat_op_tracer(tracer)
    assert "  aten.mm.default: 3" in text.splitlines()
    assert text.splitlines()[0] == f"Ops for namespace: 'aten' ({len(aten)} ops)"


def test_op_tracer_as_a_decorator_starts_afresh_each_call():
    tracer = torch.tpu.utils.OpTracer()

    @tracer
    def f(x):
        return x.relu()

    f(torch.ones(2, device="tpu"))
    f(torch.ones(2, device="tpu"))
    assert tracer.ops_log["aten"] == {"aten.relu.default": 1}


def _torch_says(actual, expected, **kw) -> bool:
    try:
        torch.testing.assert_close(actual, expected, **kw)
    except AssertionError:
        return False
    return True


def _ours_says(actual, expected, **kw) -> bool:
    try:
        torch.tpu.utils.assert_close(actual, expected, **kw)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("scale", [0.0, 1e-7, 1e-5, 1e-3, 1e-1])
@pytest.mark.parametrize(
    "tols", [{"rtol": 1e-6, "atol": 1e-6}, {"rtol": 1e-3, "atol": 0.0}, {"rtol": 0.0, "atol": 1e-4}]
)
def test_assert_close_with_explicit_tolerances_agrees_with_torch(scale, tols):
    expected = torch.linspace(-2.0, 2.0, 33)
    actual = expected + scale * torch.cos(torch.arange(33.0))
    assert _ours_says(actual.to("tpu"), expected, **tols) == _torch_says(actual, expected, **tols)


def test_assert_close_defaults_follow_the_matmul_precision(monkeypatch):
    expected = torch.ones(8)
    actual = expected * (1 + 1e-3)  # within bfloat16's rtol (1.6e-2), not float32's (1.3e-6)
    monkeypatch.setattr(config, "matmul_precision", "highest")
    assert _ours_says(actual, expected) == _torch_says(actual, expected) is False
    monkeypatch.setattr(config, "matmul_precision", "medium")
    assert _ours_says(actual, expected) is True
    assert _torch_says(actual, expected, rtol=1.6e-2, atol=1e-5)  # torch's bfloat16 defaults


def test_assert_close_suggests_tolerances_that_pass():
    expected = torch.tensor([1.0, 10.0, -3.0, 0.5])
    actual = expected + torch.tensor([1e-3, -2e-2, 5e-3, 0.0])
    with pytest.raises(AssertionError, match=r"suggested tolerances: rtol=\S+ \(with atol=1e-05\)") as info:
        torch.tpu.utils.assert_close(actual, expected, rtol=1e-6, atol=1e-5)
    found = re.search(r"rtol=(\S+) \(with atol=1e-05\) or atol=(\S+) \(with rtol=1e-06\)", str(info.value))
    rtol, atol = float(found.group(1)), float(found.group(2))
    assert _torch_says(actual, expected, rtol=rtol, atol=1e-5)
    assert _torch_says(actual, expected, rtol=1e-6, atol=atol)
    # the suggestions are tight: 10% less fails
    assert not _torch_says(actual, expected, rtol=rtol * 0.9, atol=1e-5)
    assert not _torch_says(actual, expected, rtol=1e-6, atol=atol * 0.9)


def test_assert_close_fills_a_missing_tolerance_with_the_default_as_torchtpu_does():
    # torch refuses one tolerance alone; TorchTPU's assert_close takes the dtype's default
    # for the other, so rtol=0.1 alone passes a 5% error that float32's default atol cannot
    expected = torch.full((4,), 2.0)
    actual = expected * 1.05
    assert _ours_says(actual, expected, rtol=0.1)
    assert not _ours_says(actual, expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"^Both 'rtol' and 'atol' must be either specified or omitted"):
        torch.testing.assert_close(torch.ones(2), torch.ones(2), rtol=1e-3)
