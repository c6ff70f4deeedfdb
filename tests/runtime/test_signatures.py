"""Ops found by their call's signature (shapes, dtypes, static values) instead of their key.

The second call of an op with the same signature skips building the key, in eager and in
lazy mode. These tests call each op at least twice (the first call files the signature,
the later ones find it) and compare every result with PyTorch CPU's.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tpu_debug.runtime import eager, probes
from tpu_debug.core.errors import UnsupportedError

import tpu_debug

FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE


def _twice(fn, *cpu_args):
    """``fn`` on CPU and on `tpu` copies of ``cpu_args``, three times on `tpu` (the later
    calls find the first one's signature); every `tpu` result equals CPU's."""
    expected = fn(*cpu_args)
    for _ in range(3):
        got = fn(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args])
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


def test_an_out_variant_after_its_functional_op_writes_its_out_argument():
    # div.out runs div.Tensor's executable (one key for both): found by either signature,
    # the out= call must still write its result into ``out``
    x, y = torch.randn(5), torch.rand(5) + 1
    for _ in range(3):
        torch.testing.assert_close(torch.true_divide(x.to("tpu"), y.to("tpu")).cpu(), x / y)
        out = torch.empty(5, device="tpu")
        result = torch.true_divide(x.to("tpu"), y.to("tpu"), out=out)
        assert result is out
        torch.testing.assert_close(out.cpu(), x / y)


def test_in_place_ops_found_by_signature_write_their_argument():
    x = torch.randn(4, 3)
    dev = x.to("tpu")
    expected = x.clone()
    for _ in range(3):
        dev.mul_(1.5).add_(0.25)
        expected.mul_(1.5).add_(0.25)
    torch.testing.assert_close(dev.cpu(), expected)


def test_float_scalars_are_inputs_and_a_new_value_is_not_an_old_one():
    x = torch.randn(6)
    for scale in (0.5, 2.0, -3.25, 0.5):
        _twice(lambda t, s=scale: t * s, x)


def test_float64_math_bakes_its_scalar_in_and_each_value_stays_its_own():
    # a float64 operand keeps its float scalar a constant (float32 would round it): a
    # signature must not hand one value's executable to another value
    x = torch.randn(4, dtype=torch.float64)
    for scale in (1 / 3, 2 / 3, 1 / 3):
        _twice(lambda t, s=scale: t * s, x)


def _programs() -> int:
    """What eager and lazy mode have compiled or traced: executables, op templates, fused graphs."""
    kept = ("eager executables", "lazy op templates", "fused programs")
    return sum(c.entries for c in tpu_debug.runtime.cache_counts() if c.name in kept)


@pytest.mark.parametrize("mode", ["defer_never", "fuse"])
def test_a_float_in_a_tensor_argument_is_an_input_so_an_eager_adamw_compiles_no_step_after_its_first(mode):
    # Python's ``x / s`` calls div.Tensor with the float in its Tensor argument, and
    # AdamW(foreach=False) divides by sqrt(1 - beta2**step), a new float every step: an input,
    # as in div.Scalar, its steps after the first two compile nothing (the second step is the
    # first with a step count above 1, the shapes are the same), in either mode. Both runtimes
    # round each op's float32 result as PyTorch does (a fused graph keeps float32 ops in
    # float32); only the products' summation order may differ, so the parameters agree to
    # float32's tolerance.
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    dev = copy.deepcopy(cpu).to("tpu")
    x, y = torch.randn(10, 12), torch.randn(10, 3)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, foreach=False)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, foreach=False)
    counts = []
    with torch.tpu.set_eager_mode(FUSE if mode == "fuse" else torch.tpu.EagerMode.DEFER_NEVER):
        for _ in range(5):
            for model, opt, a, b in ((cpu, opt_cpu, x, y), (dev, opt_dev, x.to("tpu"), y.to("tpu"))):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(a), b).backward()
                opt.step()
            counts.append(_programs())
    assert counts[2:] == [counts[1]] * 3, counts
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach())


def test_a_float_meeting_an_integer_tensor_computes_in_the_default_dtype_it_is_called_under():
    # an integer tensor times a float gives the default dtype: the key holds it, and with a
    # float64 default the float is a constant (a float32 input would round 0.1)
    x = torch.arange(5)
    _twice(lambda t: t * 0.1, x)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _twice(lambda t: t * 0.1, x)
        _twice(lambda t: t / 3.0, x)
    finally:
        torch.set_default_dtype(before)
    _twice(lambda t: t * 0.1, x)


def test_static_values_are_part_of_the_signature():
    x = torch.randn(3, 4, 5)
    for dim in (0, 1, 2, 1):
        _twice(lambda t, d=dim: t.sum(dim=d), x)
        _twice(lambda t, d=dim: t.sum(dim=d, keepdim=True), x)


def test_a_nan_static_value_gives_pytorchs_result_every_time():
    x = torch.tensor([1.0, math.nan, -2.0])
    _twice(lambda t: torch.nan_to_num(t, nan=7.0), x)
    _twice(lambda t: torch.clamp(t, min=math.nan), x)


def test_views_are_read_as_views_at_every_offset():
    rows = torch.randn(8, 6)
    dev = rows.to("tpu")
    for i in list(range(8)) * 2:  # one signature for every row: the offset is an input
        torch.testing.assert_close((dev[i] * 2).cpu(), rows[i] * 2)
    w = torch.randn(6, 6)
    for _ in range(3):  # a transposed view, same shape as its storage
        torch.testing.assert_close((dev @ w.to("tpu").t()).cpu(), rows @ w.t())


def test_a_dtype_reinterpreting_view_is_not_read_as_its_storage():
    x = torch.randn(4)
    dev = x.to("tpu")
    c = torch.complex(x, x)
    dev_c = torch.complex(dev, dev)
    for _ in range(3):
        torch.testing.assert_close((torch.view_as_real(dev_c) * 2).cpu(), torch.view_as_real(c) * 2)
        # same shape and element size as its storage, another dtype: refused every time,
        # never run as the storage's own values
        with pytest.raises(UnsupportedError, match="dtype-reinterpreting view"):
            dev.view(torch.int32) + 1


def test_a_list_of_tensors_and_foreach_ops():
    xs = [torch.randn(3), torch.randn(2, 2), torch.randn(5)]
    dev = [x.to("tpu") for x in xs]
    expected = [x.clone() for x in xs]
    for _ in range(3):
        torch._foreach_mul_(dev, 0.5)
        torch._foreach_mul_(expected, 0.5)
        torch.testing.assert_close(torch.cat([d.reshape(-1) for d in dev]).cpu(),
                                   torch.cat([e.reshape(-1) for e in expected]))
    for d, e in zip(dev, expected):
        torch.testing.assert_close(d.cpu(), e)


def test_a_cleared_cache_compiles_again_though_a_signature_was_filed():
    x = torch.randn(7, 3)
    heard = []

    class Log:
        def on_compile(self, info):
            if info.mode == "eager" and info.name == "cos":
                heard.append(info.key)

    for _ in range(2):
        torch.cos(x.to("tpu"))
    eager.clear_cache()
    log = Log()
    probes.subscribe(log)
    try:
        for _ in range(2):
            torch.testing.assert_close(torch.cos(x.to("tpu")).cpu(), torch.cos(x))
    finally:
        probes.unsubscribe(log)
    assert len(heard) == 1  # compiled after the clear, then found


@pytest.mark.parametrize("grad", [False, True])
def test_lazy_mode_records_by_signature_and_matches_cpu(grad):
    w_cpu = torch.randn(6, 6, requires_grad=grad)
    x_cpu = torch.randn(4, 6)
    w = w_cpu.detach().to("tpu").requires_grad_(grad)
    x = x_cpu.to("tpu")

    def f(w, x):
        h = torch.relu(x @ w) * 0.5 + 1.0
        return (h[1:] * h[:-1]).sum()

    expected = f(w_cpu, x_cpu)
    if grad:
        expected.backward()
    with torch.tpu.set_eager_mode(FUSE):
        for _ in range(3):  # later steps record by signature, on pending values
            if grad:
                w.grad = None
            loss = f(w, x)
            if grad:
                loss.backward()
            torch.testing.assert_close(loss.cpu(), expected.detach())
            if grad:
                torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_a_precision_change_is_part_of_the_signature(monkeypatch):
    # TPU numerics: "medium" is one bfloat16 pass (inputs rounded to bfloat16, float32
    # accumulation), "high" three passes (float32 accuracy, as near as matters here).
    # Alternating them, each call must run its own precision's program.
    from tpu_debug.runtime.config import config

    monkeypatch.setattr(config, "numerics", "tpu")
    monkeypatch.setattr(config, "matmul_precision", None)
    before = torch.get_float32_matmul_precision()
    torch.manual_seed(0)
    x, w = torch.randn(8, 64), torch.randn(64, 4)
    exact = (x.double() @ w.double()).float()
    one_pass = (x.bfloat16().double() @ w.bfloat16().double()).float()
    assert not torch.allclose(one_pass, exact, atol=1e-3, rtol=0)  # the two are told apart
    try:
        for name in ("high", "medium", "high", "medium"):
            torch.set_float32_matmul_precision(name)
            got = (x.to("tpu") @ w.to("tpu")).cpu()
            # float32 accumulation of 64 products of size ~1: within 1e-4 of the double sum
            torch.testing.assert_close(got, exact if name == "high" else one_pass, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_float32_matmul_precision(before)


def test_runtime_scalars_shown_as_meta_placeholder_0_5(tmp_path):
    # SGD with momentum passes its Python floats (lr, momentum) to _foreach ops as inputs of
    # one executable: a signature shows no value for them, never shape inference's stand-in
    m = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    with tpu_debug.trace(logdir=tmp_path) as session:
        for _ in range(2):
            m(torch.randn(2, 8, device="tpu")).sum().backward()
            opt.step()
            opt.zero_grad()
    signatures = {c.signature for c in session.compiles()}
    foreach = sorted(s for s in signatures if s.startswith("_foreach_"))
    assert "_foreach_mul_.Scalar(float32[4,8], float32[4], scalar=runtime value)" in foreach, foreach
    assert not any("0.5" in s for s in signatures), sorted(signatures)
