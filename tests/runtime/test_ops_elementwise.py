"""Elementwise and small nn lowerings on `tpu`, and eager in-place / ``out=`` handling,
checked against PyTorch on CPU (regressions found by the OpInfo harness)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import tpu_debug  # noqa: F401 - registers the tpu device


def _tpu(v):
    return v.to("tpu") if isinstance(v, torch.Tensor) else v


def check(fn, *args, **kwargs):
    """Run ``fn`` on CPU and on tpu copies of the tensor arguments; compare (NaNs equal)."""
    expected = fn(*args, **kwargs)
    actual = fn(*(_tpu(a) for a in args), **{k: _tpu(v) for k, v in kwargs.items()})
    _compare(actual, expected)


def _compare(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert actual.device.type == "tpu"
        assert_close(actual.cpu(), expected, equal_nan=True)
    elif isinstance(expected, tuple):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _compare(a, e)
    else:
        assert type(actual) is type(expected) and actual == expected


def test_equal_is_a_python_bool():
    a = torch.tensor([1.0, 2.0, float("nan")])
    check(torch.equal, a[:2], a[:2])
    check(torch.equal, a, a)  # NaN != NaN
    check(torch.equal, a[:2], torch.tensor([1, 2]))  # promoted
    check(torch.equal, torch.ones(2, 1), torch.ones(2))  # shapes differ


@pytest.mark.parametrize("op", ["clamp", "clamp_min", "clamp_max"])
def test_clamp_tensor_bounds_out(op):
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    lo, hi = torch.full((4,), -1.0), torch.full((3, 1), 2.0)
    bounds = {"clamp": (lo, hi), "clamp_min": (lo,), "clamp_max": (hi,)}[op]
    check(lambda x, *b: getattr(torch, op)(x, *b, out=torch.empty_like(x)), x, *bounds)


def test_out_picks_the_scalar_overload():
    x = torch.tensor([[True, False], [True, True]])
    check(lambda x: torch.all(x, dim=(0, 1), out=torch.empty((), dtype=torch.bool, device=x.device)), x)
    y = torch.tensor([-1.5, 2.0, -0.0])
    check(lambda y: torch.copysign(y, -2.0, out=torch.empty_like(y)), y)
    check(lambda y: torch.square(y, out=torch.empty_like(y)), y)
    check(lambda y: torch.lerp(y, y * 2, torch.full_like(y, 0.25), out=torch.empty_like(y)), y)
    bitwise_and = torch.ops.aten.bitwise_and.Scalar_Tensor_out
    check(lambda s: bitwise_and(6, s, out=torch.empty_like(s)), torch.tensor([3, 5, 7]))


def test_div_trunc():
    a = torch.tensor([[7, -7, 9], [3, -3, 8]])
    check(torch.div, a, torch.tensor([2, -4, 3]), rounding_mode="trunc")  # broadcast integer division
    torch.manual_seed(0)
    b = (torch.randn(200, 50) * 50).bfloat16()
    check(torch.div, b, torch.randn(50).bfloat16(), rounding_mode="trunc")  # quotient rounded to bfloat16 first


def test_integer_pow_negative_exponent():
    e = torch.tensor([-3, -2, -1, 0, 1, 2, 3])
    for base in (2, 1, -1, 0, -2):
        check(torch.pow, base, e)
    check(torch.pow, torch.tensor([[2], [-1], [1], [0]]), e)


def test_digamma_poles_and_sign_of_bool():
    check(torch.digamma, torch.tensor([0, -1, 3]))
    check(torch.digamma, torch.tensor([True, False]))
    check(torch.digamma, torch.tensor([0.0, -0.0, -2.0, 2.5]))
    check(torch.sign, torch.tensor([True, False]))
    check(torch.sgn, torch.tensor([True, False]))


def _raises_like_cpu(fn, *args):
    with pytest.raises(RuntimeError, match=".") as cpu:
        fn(*args)
    with pytest.raises(RuntimeError, match=".") as tpu:
        fn(*(_tpu(a) for a in args))
    assert str(tpu.value) == str(cpu.value)


def test_inplace_and_out_refuse_what_cpu_refuses():
    _raises_like_cpu(lambda x: x.deg2rad_(), torch.arange(3))  # float result into an int64 self
    _raises_like_cpu(lambda x: x.logit_(), torch.tensor([True, False]))
    _raises_like_cpu(lambda x, e: x.ldexp_(e), torch.ones(5, 1), torch.ones(5, 5, dtype=torch.long))  # no broadcast of self
    _raises_like_cpu(lambda x, y: torch.mul(x, y, out=x), torch.ones(5, 1), torch.ones(5, 5))  # out= is also an input
    _raises_like_cpu(lambda x: torch.mul(x, 0.5, out=torch.empty(3, dtype=torch.long, device=x.device)), torch.ones(3))
    with pytest.raises(RuntimeError, match=r"doesn\'t match the broadcast shape"):
        torch.tensor(1.0, device="tpu").addr_(torch.ones(3, device="tpu"), torch.ones(3, device="tpu"))


def test_out_still_resizes_and_casts_safely():
    check(lambda x, y: torch.mul(x, y, out=torch.empty(5, 1, device=x.device)), torch.ones(5, 1), torch.ones(5, 5))
    check(lambda x: torch.add(x, 1, out=torch.empty(3, device=x.device)), torch.arange(3))  # int64 into float32


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_addr(dtype):
    torch.manual_seed(0)
    s, v1, v2 = (torch.randn(shape).mul(3).to(dtype) for shape in ((5, 10), (5,), (10,)))
    check(torch.addr, s, v1, v2)
    check(torch.addr, s[0], v1, v2)  # self broadcasts
    if dtype.is_floating_point:
        check(torch.addr, s, v1, v2, beta=0.6, alpha=0.2)  # bfloat16: rounded step by step, as on CPU
        check(torch.addr, torch.full((5, 10), float("nan"), dtype=dtype), v1, v2, beta=0.0)


@pytest.mark.parametrize("args", [(0.0, -8.000001, -4.0), (1.5, 7.9, 2.5), (0, -10, -3), (2**40, 2**40 + 7, 2)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_arange_integer_truncates_like_cpu(args, dtype):
    expected = torch.arange(*args, dtype=dtype)
    assert torch.equal(torch.arange(*args, dtype=dtype, device="tpu").cpu(), expected)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("row, col, offset", [(4, 4, -1), (3, 5, 0), (5, 3, 1), (0, 3, 0), (4, 4, -5), (3, 3, 4)])
def test_tril_triu_indices_are_cpus_and_use_no_float64(fn, row, col, offset):
    from tpu_debug.runtime import probes

    compiled = []

    class Listen:
        def on_compile(self, info):
            compiled.append(info)

    listener = Listen()
    probes.subscribe(listener)
    try:
        got = fn(row, col, offset, device="tpu").cpu()
    finally:
        probes.unsubscribe(listener)
    assert torch.equal(got, fn(row, col, offset)) and got.dtype == torch.int64
    # one program of its own: no float64 arithmetic (PyTorch's decomposition's sqrt/floor)
    assert [c.name for c in compiled] in ([], [fn.__name__])


def test_rrelu_with_noise():
    x = torch.randn(6, 7)
    check(lambda x: torch.nn.functional.rrelu(x, 0.1, 0.3, training=False), x)  # leaky_relu, mean slope
    xt = x.to("tpu").requires_grad_()
    y = torch.nn.functional.rrelu(xt, 0.1, 0.3, training=True)
    y.sum().backward()
    y, grad = y.detach().cpu(), xt.grad.cpu()
    slope = torch.where(x <= 0, y / x, torch.ones_like(x))
    assert torch.equal(y[x > 0], x[x > 0])
    neg = slope[x <= 0]
    assert ((neg >= 0.1 - 1e-6) & (neg <= 0.3 + 1e-6)).all()
    torch.testing.assert_close(grad, slope)  # the gradient is the recorded noise


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    x, grid = torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 4, 5, 3) * 2.4 - 1.2
    check(torch.nn.functional.grid_sample, x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


@pytest.mark.parametrize("shape", [(5, 5), (5, 2), (2, 5), (3, 5, 4), (0, 5, 0)])
def test_geqrf_and_ormqr(shape):
    torch.manual_seed(0)
    a = torch.randn(shape)
    check(torch.geqrf, a)
    if a.numel():
        qr, tau = torch.geqrf(a)
        m = shape[-2]
        for left in (True, False):
            for transpose in (True, False):
                c = torch.randn(shape[:-2] + ((m, 3) if left else (3, m)))
                check(torch.ormqr, qr, tau, c, left, transpose)


def test_gelu_and_logit_half_precision_like_cpu():
    torch.manual_seed(0)
    x = torch.randn(10, 10).bfloat16()
    for approximate in ("none", "tanh"):
        check(torch.nn.functional.gelu, x, approximate=approximate)  # float32 inside, one rounding
    p = torch.rand(5, 25).bfloat16()
    check(torch.logit, p)  # bfloat16 rounding after every step, as CPU's kernel
    check(torch.logit, p, eps=0.2)
    _raises_like_cpu(lambda t: t.logit_(), torch.tensor([0, 1]))


def test_shift_operators():
    # `>>` / `<<` dispatch to aten::__rshift__ / __lshift__ (not composite), as the guide's unpack32 writes
    # them; out-of-range and negative shift amounts exercise the sign fill and the zero result.
    a = torch.tensor([5, -5, 7, 1 << 30], dtype=torch.int32)
    b = torch.tensor([1, 40, -1, 3], dtype=torch.int32)
    check(lambda a, b: a >> b, a, b)
    check(lambda a, b: a << b, a, b)
    check(lambda a: a >> 2, a)
    check(lambda a: a << 2, a)
    check(lambda p: (p.to(torch.int64) >> torch.arange(32, dtype=torch.int32, device=p.device)) & 1,
          torch.tensor([3095918765], dtype=torch.int64))  # int64 by int32: promoted
    check(lambda u: u >> torch.tensor([9], dtype=torch.uint8, device=u.device), torch.tensor([5], dtype=torch.uint8))
    check(lambda a, b: torch.ops.aten.__rshift__.Tensor_out(a, b, out=torch.empty_like(a)), a, b)
