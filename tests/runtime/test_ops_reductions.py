"""Reductions, scans, sorting and softmax on `tpu`, checked against PyTorch on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close, make_tensor

import tpu_debug  # noqa: F401 - registers the tpu device

NAN = float("nan")
INF = float("inf")


def _tpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().to("tpu").requires_grad_(v.requires_grad)
    if isinstance(v, (list, tuple)):
        return type(v)(_tpu(a) for a in v)
    return v


def _compare(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert actual.device.type == "tpu", actual.device
        assert_close(actual.cpu(), expected, equal_nan=True)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _compare(a, e)
    else:
        assert actual == expected


def check(fn, *args, **kwargs):
    """Run ``fn`` on CPU and on tpu copies of the tensor arguments; compare."""
    expected = fn(*args, **kwargs)
    actual = fn(*_tpu(args), **{k: _tpu(v) for k, v in kwargs.items()})
    _compare(actual, expected)


def rand(*shape, dtype=torch.float32, low=None, high=None, seed=0):
    torch.manual_seed(seed)
    return make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high)


FLOATS = [torch.float32, torch.bfloat16]
ALL = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


# ---- sum / mean / prod --------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize("dtype", ALL + [torch.uint8])
def test_sum(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(torch.sum, x)
    check(torch.sum, x, 1)
    check(torch.sum, x, (0, -1), keepdim=True)
    check(torch.sum, x, [])
    check(lambda a: a.sum(dim=-2, dtype=torch.float64), x)


def test_sum_dtype_kwarg_and_edge_shapes():
    check(lambda a: a.sum(dtype=torch.int32), rand(4, 3, dtype=torch.int64, low=-5, high=5))
    check(torch.sum, torch.ones(0, 3))
    check(torch.sum, torch.ones(0, 3), 0)
    check(torch.sum, torch.ones(2, 0, dtype=torch.int64), 1, keepdim=True)
    check(torch.sum, torch.tensor(3.5))
    check(torch.sum, torch.tensor(3), 0)
    check(torch.sum, torch.tensor(True), -1, keepdim=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean(dtype):
    x = rand(4, 6, 2, dtype=dtype)
    check(torch.mean, x)
    check(torch.mean, x, 1)
    check(torch.mean, x, (0, 2), keepdim=True)
    check(torch.mean, x, [])
    check(lambda a: a.mean(1, dtype=torch.float64), x)
    check(torch.mean, torch.ones(0, 2), 0)
    check(lambda a: a.mean(dtype=torch.float32), rand(3, 3, dtype=torch.int64))


@pytest.mark.parametrize("dtype", ALL)
def test_prod(dtype):
    x = rand(3, 4, dtype=dtype, low=-2, high=2)
    check(torch.prod, x)
    check(torch.prod, x, 1)
    check(torch.prod, x, -2, keepdim=True)
    check(lambda a: a.prod(0, dtype=torch.float64), x)


def test_nansum_and_count_nonzero():
    x = torch.tensor([[1.0, NAN, 2.0], [NAN, NAN, 0.0]])
    check(torch.nansum, x)
    check(torch.nansum, x, 1)
    check(torch.nansum, x, (0,), keepdim=True)
    check(torch.nansum, rand(3, 2, dtype=torch.int32))
    check(torch.count_nonzero, x)
    check(torch.count_nonzero, x, 1)
    check(torch.count_nonzero, x, (0, 1))
    check(torch.count_nonzero, rand(3, 4, dtype=torch.bool), -1)


# ---- max / min ---------------------------------------------------------------------

X_NAN = torch.tensor([[1.0, NAN, 3.0, NAN], [2.0, 2.0, 1.0, 0.0], [-INF, -INF, -1.0, 5.0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])  # bfloat16: test_max_min_dim
def test_amax_amin(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    for fn in (torch.amax, torch.amin):
        check(fn, x)
        check(fn, x, 1)
        check(fn, x, (0, 2), keepdim=True)
        check(fn, x, -1)


def test_amax_nan_propagates():
    check(torch.amax, X_NAN, 1)
    check(torch.amin, X_NAN, 0)
    check(torch.amax, X_NAN)
    check(torch.max, X_NAN)
    check(torch.min, X_NAN)


@pytest.mark.parametrize("dtype", ALL)
def test_max_min_dim(dtype):
    x = rand(4, 5, dtype=dtype, low=-3, high=3)  # small range: plenty of ties
    for fn in (torch.max, torch.min):
        check(fn, x)
        check(fn, x, 1)
        check(fn, x, 0, keepdim=True)
        check(fn, x, -1)


def test_max_dim_nan_and_ties():
    check(torch.max, X_NAN, 1)
    check(torch.min, X_NAN, 1)
    check(torch.max, X_NAN, 0, keepdim=True)
    check(torch.max, torch.tensor(2.0), 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
def test_argmax_argmin(dtype):  # PyTorch rejects bool
    x = rand(3, 4, 2, dtype=dtype, low=-3, high=3)
    for fn in (torch.argmax, torch.argmin):
        check(fn, x)
        check(fn, x, 1)
        check(fn, x, -1, keepdim=True)
        check(fn, x, keepdim=True)
    check(torch.argmax, X_NAN, 1)
    check(torch.argmin, X_NAN, 1)
    check(torch.argmax, X_NAN)


def test_aminmax():
    x = rand(3, 5)
    check(torch.aminmax, x)
    check(torch.aminmax, x, dim=1)
    check(torch.aminmax, x, dim=-2, keepdim=True)
    check(torch.aminmax, X_NAN, dim=1)
    check(torch.aminmax, rand(4, dtype=torch.int64))


# ---- any / all ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8])
def test_any_all(dtype):
    x = rand(3, 4, dtype=dtype, low=0, high=2)
    for fn in (torch.any, torch.all):
        check(fn, x)
        check(fn, x, 1)
        check(fn, x, 0, keepdim=True)
        check(fn, x, (0, 1))
        check(fn, x, ())
    check(torch.any, torch.zeros(0, 2, dtype=dtype))
    check(torch.all, torch.zeros(0, 2, dtype=dtype), 0)


# ---- var / std -------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize("fn", [torch.var, torch.std, torch.var_mean, torch.std_mean])
def test_var_std(fn):
    x = rand(4, 5, 3)
    check(fn, x)
    check(fn, x, 1)
    check(fn, x, (0, 2), keepdim=True)
    check(fn, x, 1, correction=0)
    check(fn, x, -1, correction=2, keepdim=True)
    check(fn, x, unbiased=False)
    check(fn, rand(4, 5, dtype=torch.bfloat16), 1)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
def test_var_degenerate():
    check(torch.var, torch.ones(1))
    check(torch.var, torch.tensor([1.0, 2.0, 3.0]), correction=5)
    check(torch.std, torch.ones(0, 3), 0)


# ---- logsumexp / norms ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_logsumexp(dtype):
    x = rand(3, 6, dtype=dtype)
    check(torch.logsumexp, x, 1)
    check(torch.logsumexp, x, (0, 1), keepdim=True)
    check(torch.logsumexp, torch.tensor([[-INF, -INF], [INF, 1.0], [0.0, 1.0]]), 1)
    check(torch.logsumexp, rand(3, 4, dtype=torch.int64), 1)


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3, 0.5])
def test_vector_norm(ord):
    x = rand(3, 4)
    x[0, 0] = 0
    check(torch.linalg.vector_norm, x, ord)
    check(torch.linalg.vector_norm, x, ord, dim=1)
    check(torch.linalg.vector_norm, x, ord, dim=(0, 1), keepdim=True)
    check(torch.norm, x, ord, 1)


def test_norm_variants():
    x = rand(3, 4, dtype=torch.bfloat16)
    check(torch.norm, x)
    check(torch.norm, rand(3, 4))
    check(lambda a: a.norm(dim=1, keepdim=True), rand(3, 4))
    check(torch.linalg.vector_norm, rand(3, 4), dtype=torch.float64)


# ---- scans -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_cumsum_cumprod(dtype):
    x = rand(3, 4, dtype=dtype, low=-2, high=2)
    check(torch.cumsum, x, 0)
    check(torch.cumsum, x, -1)
    check(torch.cumprod, x, 1)
    check(lambda a: a.cumsum(1, dtype=torch.float64), x)
    check(torch.cumsum, torch.tensor(3, dtype=dtype), 0)
    check(torch.cumsum, torch.ones(0, 3, dtype=dtype), 0)


def test_logcumsumexp():
    check(torch.logcumsumexp, rand(3, 5), 1)
    check(torch.logcumsumexp, torch.tensor([-INF, 0.0, -INF, 2.0]), 0)


@pytest.mark.parametrize("dtype", ALL)
def test_cummax_cummin(dtype):
    x = rand(3, 6, dtype=dtype, low=-3, high=3)
    check(torch.cummax, x, 1)
    check(torch.cummin, x, 0)
    check(torch.cummax, x, -1)


def test_cummax_nan():
    x = torch.tensor([1.0, NAN, 2.0, NAN, 0.0, 3.0])
    check(torch.cummax, x, 0)
    check(torch.cummin, x, 0)
    check(torch.cummax, X_NAN, 1)


# ---- sort and selection -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable(dtype, descending):
    x = rand(4, 7, dtype=dtype, low=-3, high=3)  # many duplicates
    check(torch.sort, x, stable=True, descending=descending)
    check(torch.sort, x, dim=0, stable=True, descending=descending)
    check(torch.argsort, x, dim=1, stable=True, descending=descending)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_and_signed_zero(descending):
    x = torch.tensor([0.0, -0.0, NAN, 1.0, -INF, INF, NAN, -0.0, 0.0])
    check(torch.sort, x, stable=True, descending=descending)
    check(torch.sort, x, descending=descending)


def test_sort_edge_shapes():
    check(torch.sort, torch.tensor(2.0))
    check(torch.sort, torch.ones(0, 3), 0)


def test_topk_kthvalue():
    x = torch.randperm(40, generator=torch.Generator().manual_seed(1)).float().reshape(4, 10)
    check(torch.topk, x, 3)
    check(torch.topk, x, 2, dim=0, largest=False)
    check(torch.topk, x.to(torch.int64), 4, largest=True)
    check(torch.topk, torch.tensor([1.0, NAN, 3.0, 2.0]), 2)
    check(torch.kthvalue, x, 4)
    check(torch.kthvalue, x, 2, 0, keepdim=True)


def test_median():
    x = torch.randperm(35, generator=torch.Generator().manual_seed(2)).float().reshape(5, 7)
    check(torch.median, x)
    check(torch.median, x, 1)
    check(torch.median, x, 0, keepdim=True)
    check(torch.median, x[:, :6], 1)  # even count: lower median
    check(torch.median, torch.tensor([[1.0, NAN, 2.0], [3.0, 1.0, 2.0]]), 1)
    check(torch.median, torch.tensor([1.0, NAN, 2.0]))
    check(torch.nanmedian, torch.tensor([[1.0, NAN, 2.0, 5.0], [NAN, 3.0, NAN, NAN]]), 1)
    # an all-NaN row: the index PyTorch returns comes from nth_element's shuffle, unspecified
    check(lambda a: torch.nanmedian(a, 1).values, torch.tensor([[1.0, 2.0], [NAN, NAN]]))
    check(torch.nanmedian, torch.tensor([1.0, NAN, 2.0, 0.0]))
    check(torch.median, x.to(torch.int64), 1)


# ---- softmax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_forward(dtype):
    x = rand(3, 5, dtype=dtype)
    check(torch.softmax, x, -1)
    check(torch.softmax, x, 0)
    check(torch.softmax, rand(2, 3, 4, dtype=dtype), 1)
    check(torch.log_softmax, rand(2, 3, 4, dtype=dtype), -1)
    check(torch.log_softmax, x, 1)
    check(torch.log_softmax, x, 0)
    check(torch.softmax, torch.tensor(1.5), 0)
    check(torch.log_softmax, torch.tensor([[-INF, 0.0], [1.0, 1.0]]), 1)
    check(lambda a: torch.softmax(a, 1, dtype=torch.float32), x)


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax_grad(fn):
    x = rand(3, 5).requires_grad_()
    g = rand(3, 5, seed=1)
    xt = _tpu(x)
    fn(x, 1).backward(g)
    fn(xt, 1).backward(g.to("tpu"))
    assert_close(xt.grad.cpu(), x.grad)


# ---- autograd through reductions --------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.sum(),
        lambda a: a.sum(1).pow(2).sum(),
        lambda a: a.mean(),
        lambda a: a.mean(0, keepdim=True).sum(),
        lambda a: a.max(1).values.sum(),
        lambda a: a.amax(0).sum(),
        lambda a: a.var(1).sum(),
        lambda a: a.norm(),
        lambda a: a.logsumexp(1).sum(),
        lambda a: a.cumsum(1).sum(),
        lambda a: a.sort(1).values[:, 0].sum(),
    ],
    ids=["sum", "sum_dim", "mean", "mean_dim", "max_dim", "amax", "var", "norm", "logsumexp", "cumsum", "sort"],
)
def test_grad(fn):
    x = rand(3, 4, seed=3).requires_grad_()
    xt = _tpu(x)
    fn(x).backward()
    loss = fn(xt)
    loss.backward()
    assert_close(xt.grad.cpu(), x.grad)


# ---- out= and in-place variants --------------------------------------------------------------


def test_out_variants():
    x = rand(3, 4)
    xt = x.to("tpu")
    out = torch.empty(0, device="tpu")
    r = torch.sum(xt, 1, out=out)
    assert r is out
    assert_close(out.cpu(), torch.sum(x, 1))
    vals, idx = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.int64, device="tpu")
    torch.max(xt, 1, out=(vals, idx))
    ev, ei = torch.max(x, 1)
    assert_close(vals.cpu(), ev)
    assert_close(idx.cpu(), ei)
    out = torch.empty(3, 4, device="tpu")
    torch.cumsum(xt, 0, out=out)
    assert_close(out.cpu(), torch.cumsum(x, 0))
    sv, si = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.int64, device="tpu")
    torch.sort(xt, 1, out=(sv, si))
    assert_close(sv.cpu(), torch.sort(x, 1).values)
    assert_close(si.cpu(), torch.sort(x, 1).indices)


def test_inplace_variants():
    x = rand(3, 4)
    xt = x.to("tpu")
    xt.cumsum_(1)
    assert_close(xt.cpu(), x.clone().cumsum_(1))
    xt = x.to("tpu")
    view = xt[:, 1:]
    view.cumprod_(0)
    expected = x.clone()
    expected[:, 1:].cumprod_(0)
    assert_close(xt.cpu(), expected)


def test_reduction_of_view():
    x = rand(4, 6)
    check(lambda a: a.t().sum(1), x)
    check(lambda a: a[:, ::2].amax(0), x)
    check(lambda a: a[1:3].softmax(0), x)
    assert math.isclose(float(x.to("tpu").sum().item()), float(x.sum().item()), rel_tol=1e-6)
