"""Advanced indexing, gathers, scatters, embedding, searches and the
value-dependent-shape ops on `tpu`, checked against PyTorch on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close, make_tensor

import tpu_debug  # noqa: F401 - registers the tpu device

aten = torch.ops.aten
NAN = float("nan")


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
    expected = fn(*args, **kwargs)
    actual = fn(*_tpu(args), **{k: _tpu(v) for k, v in kwargs.items()})
    _compare(actual, expected)


def rand(*shape, dtype=torch.float32, seed=0, low=None, high=None):
    torch.manual_seed(seed)
    return make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high)


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


# ---- x[...] -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_int(dtype):
    x = rand(4, 5, 6, dtype=dtype)
    i, j = idx(0, 3, -1), idx(1, 1, 4)
    check(lambda t, a: t[a], x, i)
    check(lambda t, a, b: t[a, b], x, i, j)
    check(lambda t, a, b: t[:, a, b], x, i, j)  # adjacent: result dims stay in place
    check(lambda t, a, b: t[a, :, b], x, i, j)  # separated: result dims go first
    check(lambda t, a: t[..., a], x, j)
    check(lambda t, a: t[a.reshape(3, 1), a.reshape(1, 3)], x, i)  # broadcasting index tensors
    check(lambda t, a: t[a[:0]], x, i)  # empty index
    check(lambda t, a: t[a[0]], x, i)  # 0-dim index tensor
    check(aten.index.Tensor, x, [None, j])


def test_index_bool_mask():
    x = rand(4, 5, 3)
    m2 = rand(4, 5, dtype=torch.bool, seed=1)
    check(lambda t, m: t[m], x, m2)
    check(lambda t, m: t[m[0]], x[0], m2)
    check(lambda t, m: t[:, m[0]], x, m2)
    check(lambda t, m: t[t > 0], x, m2)
    check(lambda t, m, i: t[m[:, 0], i], x, m2, idx(0, 2, 1, 1)[: int(m2[:, 0].sum())])
    check(lambda t, m: t[m & False], x, m2)  # no element selected
    check(lambda t, m: t[m.to(torch.uint8).bool()], x, m2)


def test_unsafe_index_and_masked_index():
    x = rand(4, 5)
    check(aten._unsafe_index.Tensor, x, [idx(0, 3), None])
    check(aten._unsafe_index.Tensor, x, [idx(0, 3), idx(1, 4)])
    mask = torch.tensor([[True], [False], [True]])
    check(aten._unsafe_masked_index, x, mask, [idx(0, 9, 3), None], 0.5)
    check(aten._unsafe_masked_index_put_accumulate, x, mask, [idx(0, 9, 0), None], rand(3, 5, seed=1))


# ---- x[...] = v --------------------------------------------------------------------------------


def _setitem(key_fn, value):
    def run(t, *keys):
        t = t.clone()
        t[key_fn(*keys)] = value if not isinstance(value, torch.Tensor) else value.to(t.device)
        return t

    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_index_put(dtype):
    x = rand(4, 5, dtype=dtype)
    i, j = idx(0, 2, -1), idx(4, 0, 1)
    v = rand(3, dtype=dtype, seed=1)
    check(aten.index_put, x, [i, j], v)
    check(aten.index_put, x, [i, j], v, True)
    check(aten.index_put, x, [None, j], rand(4, 3, dtype=dtype, seed=2))
    check(aten.index_put, x, [i], rand(5, dtype=dtype, seed=3))  # broadcast values
    check(aten.index_put, x, [idx(1, 1, 1, 3)], rand(4, 5, dtype=dtype, seed=4), True)  # duplicates sum
    check(_setitem(lambda a: a, v[0]), x, i)


def test_index_put_duplicates_without_accumulate():
    # PyTorch leaves the winner unspecified: any of the candidates is right
    xt = torch.zeros(3, device="tpu")
    xt[torch.tensor([1, 1], device="tpu")] = torch.tensor([5.0, 7.0], device="tpu")
    assert xt.cpu()[1].item() in (5.0, 7.0)


def test_index_put_bool_mask():
    x = rand(4, 5)
    m = x > 0
    n = int(m.sum())
    check(aten.index_put, x, [m], rand(n, seed=1))
    check(aten.index_put, x, [m], rand(n, seed=1), True)
    check(aten.index_put, x, [m], torch.tensor(2.0))  # broadcast 0-dim value
    check(aten.index_put, x, [m[:, 0]], rand(5, seed=2))  # mask over dim 0, values broadcast
    check(aten.index_put, x, [None, m[0]], rand(4, 1, seed=2))
    check(aten.index_put, x, [m & False], torch.tensor(1.0))
    check(_setitem(lambda mm: mm, 3.0), x, m)  # masked_fill_ path
    check(_setitem(lambda mm: mm, rand(n, seed=3)), x, m)


def test_index_put_inplace_on_view():
    x = rand(4, 6)
    xt = x.to("tpu")
    view = xt[:, 1::2]
    view[idx(0, 2).to("tpu")] = torch.ones(3, device="tpu")
    expected = x.clone()
    expected[:, 1::2][idx(0, 2)] = torch.ones(3)
    assert_close(xt.cpu(), expected)
    out = aten.index_put_(xt, [idx(3).to("tpu")], torch.tensor(9.0, device="tpu"), True)
    assert out is xt
    expected.index_put_([idx(3)], torch.tensor(9.0), True)
    assert_close(xt.cpu(), expected)


# ---- index_select / gather / take ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(dtype):
    x = rand(4, 5, dtype=dtype)
    check(torch.index_select, x, 0, idx(3, 0, 3))
    check(torch.index_select, x, -1, idx(4))
    check(torch.index_select, x, 1, idx(2)[0])
    check(torch.index_select, torch.tensor(3.0), 0, idx(0))
    check(torch.index_select, x, 0, idx(1, 2)[:0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype):
    x = rand(3, 4, dtype=dtype)
    check(torch.gather, x, 1, idx(0, 3, 3, 1).reshape(2, 2))
    check(torch.gather, x, 0, torch.tensor([[2, 0, 1, 1], [0, 0, 0, 2]]))
    check(torch.gather, x, -1, torch.tensor([[1], [0], [3]]))
    check(torch.gather, torch.tensor(2.0), 0, torch.tensor(0))
    check(torch.gather, x, 1, torch.zeros(3, 0, dtype=torch.int64))
    check(torch.take_along_dim, x, torch.tensor([[1], [0], [3]]), 1)


def test_take():
    x = rand(3, 4)
    check(torch.take, x, torch.tensor([[0, 11], [-1, 5]]))
    check(torch.take, x.t(), torch.tensor([1, 2, -12]))


# ---- scatter family -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_scatter(dtype):
    x = rand(3, 5, dtype=dtype)
    index = torch.tensor([[0, 1, 2], [4, 3, 2]])  # unique per row: the result is defined
    src = rand(2, 4, dtype=dtype, seed=1)
    check(torch.scatter, x, 1, index, src)
    check(torch.scatter, x, 1, index, 2)
    check(torch.scatter, x, 0, torch.tensor([[0, 1, 2, 0, 1]]), src[:1, :1].expand(1, 5).contiguous())
    check(lambda t, i, s: t.clone().scatter_(1, i, s), x, index, src)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_add_and_reduce_duplicates(dtype):
    x = rand(3, 5, dtype=dtype, low=-4, high=4)
    index = torch.tensor([[0, 0, 2, 0], [4, 4, 4, 1], [1, 1, 3, 3]])
    src = rand(3, 4, dtype=dtype, seed=1, low=-4, high=4)
    check(torch.scatter_add, x, 1, index, src)
    check(torch.scatter_add, x, 0, torch.tensor([[2, 0, 2, 2]]), src)
    check(torch.scatter, x, 1, index, src, reduce="add")
    check(torch.scatter, x, 1, index, src, reduce="multiply")
    check(torch.scatter, x, 1, index, 3, reduce="add")
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(torch.scatter_reduce, x, 1, index, src, reduce, include_self=include_self)


def test_scatter_reduce_nan():
    x = torch.tensor([1.0, NAN, 3.0, 4.0])
    src = torch.tensor([NAN, 2.0, 5.0, 0.0])
    index = torch.tensor([0, 1, 2, 2])
    for reduce in ("amax", "amin", "sum"):
        check(torch.scatter_reduce, x, 0, index, src, reduce)
        check(torch.scatter_reduce, x, 0, index, src, reduce, include_self=False)


def test_scatter_0dim():
    check(torch.scatter, torch.tensor(1.0), 0, torch.tensor(0), torch.tensor(5.0))
    check(torch.scatter_add, torch.tensor(1.0), 0, torch.tensor(0), torch.tensor(5.0))


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta:UserWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_add_copy_fill_reduce(dtype):
    x = rand(4, 3, dtype=dtype, low=-4, high=4)
    index = idx(0, 3, 0)
    src = rand(3, 3, dtype=dtype, seed=1, low=-4, high=4)
    check(torch.index_add, x, 0, index, src)
    check(torch.index_add, x, 0, index, src, alpha=2)
    check(torch.index_add, x, 1, idx(2, 2), rand(4, 2, dtype=dtype, seed=2))
    check(torch.index_copy, x, 0, idx(2, 0, 1), src)
    check(torch.index_fill, x, 1, idx(0, 2), 7)
    check(torch.index_fill, x, 0, idx(-1), torch.tensor(5))
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(torch.index_reduce, x, 0, index, src, reduce, include_self=include_self)
    check(lambda t, i, s: t.clone().index_add_(0, i, s), x, index, src)


def test_put():
    x = rand(3, 4)
    check(torch.put, x, torch.tensor([0, -1, 5]), torch.tensor([9.0, 8.0, 7.0]))
    check(torch.put, x, torch.tensor([1, 1, 5]), torch.tensor([9.0, 8.0, 7.0]), accumulate=True)


# ---- masks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_select_nonzero(dtype):
    x = rand(3, 4, dtype=dtype)
    m = rand(3, 4, dtype=torch.bool, seed=1)
    check(torch.masked_select, x, m)
    check(torch.masked_select, x, m[0])  # broadcast mask
    check(torch.nonzero, x)
    check(torch.nonzero, x, as_tuple=True)
    check(torch.argwhere, x)
    check(torch.nonzero, torch.zeros(2, 0, dtype=dtype))
    check(torch.nonzero, torch.tensor(1, dtype=dtype))


def test_masked_scatter():
    x = rand(3, 4)
    m = x > 0
    src = rand(12, seed=1)
    check(torch.masked_scatter, x, m, src)
    check(torch.masked_scatter, x, m[0], src.reshape(3, 4))
    check(lambda t, mm, s: t.clone().masked_scatter_(mm, s), x, m, src)


def test_nonzero_static():
    x = torch.tensor([[0, 1], [2, 0]])
    check(torch.nonzero_static, x, size=4)
    check(torch.nonzero_static, x, size=1, fill_value=7)


# ---- embedding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding(dtype):
    w = rand(10, 4, dtype=dtype)
    i = torch.tensor([[1, 2, 9], [1, 0, 0]])
    check(F.embedding, i, w)
    check(F.embedding, i, w, padding_idx=0)


@pytest.mark.parametrize("padding_idx,scale", [(None, False), (1, False), (-1, True)])
def test_embedding_grad(padding_idx, scale):
    w = rand(10, 4).requires_grad_()
    i = torch.tensor([[1, 2, 9], [1, 0, 9]])
    g = rand(2, 3, 4, seed=1)
    wt = _tpu(w)
    F.embedding(i, w, padding_idx=padding_idx, scale_grad_by_freq=scale).backward(g)
    F.embedding(i.to("tpu"), wt, padding_idx=padding_idx, scale_grad_by_freq=scale).backward(g.to("tpu"))
    assert_close(wt.grad.cpu(), w.grad)


def test_one_hot():
    check(F.one_hot, torch.tensor([0, 3, 1]), 5)
    check(F.one_hot, torch.tensor([[0, 3], [1, 1]]))


# ---- searches -------------------------------------------------------------------------------------


def test_searchsorted_bucketize():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0, 9.0])
    vals = torch.tensor([[0.0, 2.0, 9.0], [5.5, 2.0, 10.0]])
    check(torch.searchsorted, seq, vals)
    check(torch.searchsorted, seq, vals, right=True)
    check(torch.searchsorted, seq, vals, side="right", out_int32=True)
    check(torch.searchsorted, seq, 2.0)
    seq2 = torch.sort(rand(2, 6), dim=1).values
    check(torch.searchsorted, seq2, rand(2, 3, seed=1))
    unsorted = torch.tensor([5.0, 1.0, 9.0, 2.0])
    check(torch.searchsorted, unsorted, vals, sorter=torch.argsort(unsorted))
    check(torch.bucketize, vals, seq)
    check(torch.bucketize, vals, seq, right=True, out_int32=True)
    check(torch.bucketize, 3, seq)


def test_isin():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    check(torch.isin, x, torch.tensor([2, 6, 9]))
    check(torch.isin, x, torch.tensor([2, 6, 9]), invert=True)
    check(torch.isin, x, 5)


# ---- value-dependent shapes ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = rand(4, 5, dtype=dtype, low=-3, high=3)
    check(torch.unique, x)
    check(torch.unique, x, return_inverse=True, return_counts=True)
    check(torch.unique, x, sorted=True, return_counts=True)
    check(torch.unique, x, dim=1, return_inverse=True, return_counts=True)
    check(torch.unique_consecutive, x, return_inverse=True, return_counts=True)
    check(torch.unique_consecutive, x, dim=0, return_counts=True)
    check(aten._unique, x, True, True)


def test_unique_nan_not_merged():
    check(torch.unique, torch.tensor([1.0, NAN, NAN, 1.0]))


def test_bincount_histc():
    x = torch.tensor([1, 1, 3, 0, 3, 3])
    check(torch.bincount, x)
    check(torch.bincount, x, minlength=7)
    check(torch.bincount, x, torch.tensor([0.5, 1.0, 2.0, 1.0, 1.0, 1.0]))
    check(torch.histc, rand(20), 5, -3, 3)
    check(torch.histc, torch.tensor([1.0, 2.0, 1.0, 4.0]), 4)


@pytest.mark.parametrize(
    "kw",
    [{"bins": [3, 4]}, {"bins": 5}, {"bins": [3, 4], "range": [-1.0, 1.0, -2.0, 2.0]},
     {"bins": [3, 4], "weight": rand(50, seed=1, low=0, high=1), "density": True},
     {"bins": [torch.tensor([-2.0, 0.0, 1.0, 3.0]), torch.tensor([-1.0, 0.5, 2.0])]}],
    ids=["counts", "int-bins", "range", "weighted-density", "edges"],
)
def test_histogramdd(kw):
    check(lambda x, **k: tuple(torch.histogramdd(x, **k)), rand(50, 2), **kw)


def test_histogramdd_degenerate_and_compiled():
    """A dimension whose points are all equal gets the range [v - 0.5, v + 0.5], an empty
    input [0, 1]; compiled graphs trace it through the lowerings' meta functions (PyTorch
    has no meta kernel for histogramdd's ops)."""
    from tpu_debug.runtime.compiled import compile as tpu_compile

    check(lambda x: tuple(torch.histogramdd(x, bins=2)), torch.ones(4, 3))
    check(lambda x: tuple(torch.histogramdd(x, bins=2)), torch.empty(0, 2))
    x = rand(30, 2)
    got = tpu_compile(lambda x: torch.histogramdd(x, bins=[3, 4]))(x.to("tpu"))
    _compare(tuple(got), tuple(torch.histogramdd(x, bins=[3, 4])))


# ---- autograd ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a[torch.tensor([0, 2, 0], device=a.device)],
        lambda a: a[:, torch.tensor([1, 1], device=a.device)],
        lambda a: a[a > 0],
        lambda a: torch.gather(a, 1, torch.tensor([[0, 0], [3, 1], [2, 2]], device=a.device)),
        lambda a: torch.index_select(a, 0, torch.tensor([2, 2], device=a.device)),
        lambda a: a.scatter(1, torch.tensor([[0], [1], [2]], device=a.device), 0.0),
        lambda a: torch.masked_select(a, a < 0),
        lambda a: torch.take(a, torch.tensor([0, 5, 5], device=a.device)),
    ],
    ids=["index", "index_dim1", "index_mask", "gather", "index_select", "scatter", "masked_select", "take"],
)
def test_grad(fn):
    x = rand(3, 4, seed=5).requires_grad_()
    xt = _tpu(x)
    y = fn(x)
    g = rand(*y.shape, seed=6)
    y.backward(g)
    fn(xt).backward(g.to("tpu"))
    assert_close(xt.grad.cpu(), x.grad)


def test_index_put_grad():
    x = rand(4, 3, seed=7).requires_grad_()
    v = rand(2, 3, seed=8).requires_grad_()
    xt, vt = _tpu(x), _tpu(v)
    i = torch.tensor([3, 1])

    def fn(a, b, ii):
        return aten.index_put(a, [ii], b * 2, True) * 3

    g = rand(4, 3, seed=9)
    fn(x, v, i).backward(g)
    fn(xt, vt, i.to("tpu")).backward(g.to("tpu"))
    assert_close(xt.grad.cpu(), x.grad)
    assert_close(vt.grad.cpu(), v.grad)
