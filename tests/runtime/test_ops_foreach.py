"""_foreach_* lowerings (runtime/ops/foreach.py) and the optimizers built on them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_debug.runtime import eager

TOL = {"rtol": 1.3e-6, "atol": 1e-5}


def _tensors(seed=0, dtype=torch.float32, positive=False):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), (2, 2, 2), ()]
    ts = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    return [t.abs() + 0.1 for t in ts] if positive else ts


def _tpu(ts):
    return [t.to("tpu") for t in ts]


def _assert_lists(got, ref, **tol):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), r, **(tol or TOL))


def _both(fn, *lists, **kw):
    """fn on CPU lists and on tpu copies, functional and in place (``fn_``)."""
    ref = fn(*lists, **kw)
    _assert_lists(fn(*(_tpu(x) if isinstance(x, list) else x for x in lists), **kw), ref)


XS, YS, ZS = _tensors(0), _tensors(1), _tensors(2, positive=True)


@pytest.mark.parametrize(
    "name, args, kw",
    [
        ("add", (XS, YS), {}),
        ("add", (XS, YS), {"alpha": -0.5}),
        ("add", (XS, 2.5), {}),
        ("add", (XS, [1.0, 2.0, -3.0, 4.0]), {}),
        ("add", (XS, torch.tensor(0.25)), {"alpha": 2}),
        ("sub", (XS, YS), {"alpha": 3}),
        ("sub", (XS, 1.5), {}),
        ("sub", (XS, [1.0, 2.0, -3.0, 4.0]), {}),
        ("mul", (XS, YS), {}),
        ("mul", (XS, 0.9), {}),
        ("mul", (XS, [1.0, 2.0, -3.0, 4.0]), {}),
        ("mul", (XS, torch.tensor(-2.0)), {}),
        ("div", (XS, ZS), {}),
        ("div", (XS, 3.0), {}),
        ("div", (XS, [1.0, 2.0, -3.0, 4.0]), {}),
        ("div", (XS, torch.tensor(4.0)), {}),
        ("maximum", (XS, YS), {}),
        ("maximum", (XS, 0.0), {}),
        ("minimum", (XS, [0.0, 0.1, 0.2, 0.3]), {}),
        ("clamp_min", (XS, -0.5), {}),
        ("clamp_max", (XS, YS), {}),
        ("pow", (ZS, YS), {}),
        ("pow", (ZS, 2.0), {}),
        ("pow", (ZS, 0.5), {}),
        ("pow", (ZS, [1.0, 2.0, 3.0, 0.5]), {}),
        ("pow", (0.9, ZS), {}),
        ("addcmul", (XS, YS, ZS), {}),
        ("addcmul", (XS, YS, ZS, 0.5), {}),
        ("addcmul", (XS, YS, ZS, [0.1, 0.2, 0.3, 0.4]), {}),
        ("addcdiv", (XS, YS, ZS, -0.01), {}),
        ("addcdiv", (XS, YS, ZS, [0.1, 0.2, 0.3, 0.4]), {}),
        ("lerp", (XS, YS, 0.1), {}),
        ("lerp", (XS, YS, [c.abs() for c in ZS]), {}),
        ("lerp", (XS, YS, [0.1, 0.2, 0.3, 0.4]), {}),
    ],
)
@pytest.mark.parametrize("inplace", [False, True])
def test_foreach_binary_and_ternary(name, args, kw, inplace):
    if isinstance(args[0], (int, float)) and inplace:
        pytest.skip("_foreach_pow.ScalarAndTensor has no in-place variant")
    if name == "lerp" and isinstance(args[2], list) and isinstance(args[2][0], float) and not hasattr(
        torch.ops.aten._foreach_lerp, "ScalarList"
    ):
        pytest.skip("this torch has no _foreach_lerp.ScalarList")
    fn = getattr(torch, f"_foreach_{name}_" if inplace else f"_foreach_{name}")

    def move(a, device):
        if isinstance(a, list):
            return [x.clone().to(device) if isinstance(x, torch.Tensor) else x for x in a]
        if isinstance(a, torch.Tensor):
            return a.to(device)
        return a

    ref_args = [move(a, "cpu") for a in args]
    tpu_args = [move(a, "tpu") for a in args]
    ref = fn(*ref_args, **kw)
    got = fn(*tpu_args, **kw)
    if inplace:
        assert torch.ops.aten._foreach_add_.Scalar(tpu_args[0], 0.0) is None
        ref, got = ref_args[0], tpu_args[0]
    _assert_lists(got, ref)


@pytest.mark.parametrize(
    "name",
    ["sqrt", "neg", "reciprocal", "sign", "abs", "exp", "log", "sigmoid", "tanh", "rsqrt", "floor", "trunc", "expm1"],
)
@pytest.mark.parametrize("inplace", [False, True])
def test_foreach_unary(name, inplace):
    xs = ZS if name in ("sqrt", "log", "rsqrt") else XS
    fn = getattr(torch, f"_foreach_{name}_" if inplace else f"_foreach_{name}")
    ref_args, tpu_args = [x.clone() for x in xs], _tpu(xs)
    ref, got = fn(ref_args), fn(tpu_args)
    if inplace:
        ref, got = ref_args, tpu_args
    _assert_lists(got, ref)


def test_foreach_unary_integer_promotes():
    ints = [torch.arange(6).reshape(2, 3), torch.tensor([4, 9])]
    _both(torch._foreach_sqrt, ints)
    _both(torch._foreach_neg, ints)
    _both(torch._foreach_abs, [-t for t in ints])


@pytest.mark.parametrize("ord", [2, 1, 3.0, float("inf"), 0])
def test_foreach_norm(ord):
    _both(torch._foreach_norm, XS, ord)
    _both(lambda xs: torch._foreach_norm(xs, ord, dtype=torch.float64), XS)


def test_foreach_norm_bfloat16():
    xs = _tensors(3, torch.bfloat16)
    ref = torch._foreach_norm(xs)
    _assert_lists(torch._foreach_norm(_tpu(xs)), ref, rtol=1e-2, atol=1e-2)


def test_foreach_copy_zero_max():
    a = _tpu(XS)
    torch._foreach_copy_(a, _tpu(YS))
    _assert_lists(a, YS)
    torch._foreach_zero_(a)
    _assert_lists(a, [torch.zeros_like(y) for y in YS])
    _both(torch._foreach_max, XS)


def test_foreach_copy_casts_and_mixed_dtypes():
    dst = [torch.zeros(3), torch.zeros(2, dtype=torch.float64)]
    src = [torch.arange(3), torch.tensor([1.5, 2.5], dtype=torch.float16)]
    a = _tpu(dst)
    torch._foreach_copy_(a, _tpu(src))
    torch._foreach_copy_(dst, src)
    _assert_lists(a, dst)
    _both(torch._foreach_add, [torch.ones(2), torch.ones(2, dtype=torch.int64)], 2)


def test_foreach_add_writes_through_views():
    base = torch.zeros(4, 4)
    dev = base.to("tpu")
    torch._foreach_add_([base[1], base[2:, 2]], [torch.ones(4), torch.full((2,), 2.0)])
    torch._foreach_add_([dev[1], dev[2:, 2]], [torch.ones(4, device="tpu"), torch.full((2,), 2.0, device="tpu")])
    torch.testing.assert_close(dev.cpu(), base)


def test_foreach_is_one_executable_per_list():
    eager.clear_cache()
    a = _tpu(XS)
    torch._foreach_mul_(a, 0.5)
    torch._foreach_mul_(a, 0.25)  # float scalars are executable inputs, not key fields
    stats = [s for s in eager.cache_stats() if s.op.startswith("_foreach_mul")]
    assert len(stats) == 1
    assert stats[0].calls == 2


def test_clip_grad_norm():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    tpu_model = copy.deepcopy(model).to("tpu")
    x = torch.randn(5, 4)
    model(x).pow(2).sum().backward()
    tpu_model(x.to("tpu")).pow(2).sum().backward()
    ref = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    got = nn.utils.clip_grad_norm_(tpu_model.parameters(), 0.5)
    torch.testing.assert_close(got.cpu(), ref, **TOL)
    for p, q in zip(model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL)


# ---- optimizers ---------------------------------------------------------------------------


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1),
    ],
    ids=["sgd", "sgd-momentum", "sgd-nesterov-wd", "adam", "adam-amsgrad-wd", "adamw", "adamw-wd"],
)
def test_optimizer_three_steps_match_cpu(make):
    ref_model = _mlp()
    tpu_model = copy.deepcopy(ref_model).to("tpu")
    # the CPU reference runs the same foreach algorithm the tpu gets by default
    ref_opt = make(list(ref_model.parameters()))
    for group in ref_opt.param_groups:
        group["foreach"] = True
    tpu_opt = make(list(tpu_model.parameters()))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        # both optimizers step from the CPU's gradients: this compares the optimizer kernels.
        # Gradients computed on each side differ by float32 rounding, and Adam's m / sqrt(v)
        # turns a rounding difference in a near-zero gradient into a step of up to +-lr.
        ref_opt.zero_grad()
        F.mse_loss(ref_model(x), y).backward()
        for p, q in zip(ref_model.parameters(), tpu_model.parameters()):
            q.grad = p.grad.to("tpu")
        ref_opt.step()
        tpu_opt.step()
    for (name, p), (_, q) in zip(ref_model.named_parameters(), tpu_model.named_parameters()):
        assert q.device.type == "tpu"
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-5, msg=name)


def test_optimizer_uses_foreach_kernels_without_recompiling():
    model = _mlp().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 6, device="tpu")).sum().backward()
    eager.clear_cache()
    opt.step()
    first = {s.op for s in eager.cache_stats()}
    assert any(op.startswith("_foreach_") for op in first), first
    compiled = len(eager.cache_stats())
    for _ in range(3):  # the bias corrections change every step: still no new executable
        opt.step()
    assert len(eager.cache_stats()) == compiled
