"""Concatenation, flips, padding, triangles, scatters into views and masked
fills on `tpu`, checked against PyTorch on CPU."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close, make_tensor

import tpu_debug  # noqa: F401 - registers the tpu device

aten = torch.ops.aten


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


DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


# ---- cat / stack ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    a, b = rand(2, 3, dtype=dtype), rand(4, 3, dtype=dtype, seed=1)
    check(torch.cat, [a, b])
    check(torch.cat, [a, a.clone()], 1)
    check(torch.cat, [a, a.clone()], -1)
    check(torch.cat, [a])


def test_cat_promotion_and_empty():
    a = rand(2, 3)
    check(torch.cat, [a, rand(1, 3, dtype=torch.int64)])
    check(torch.cat, [rand(2, 3, dtype=torch.bool), rand(2, 3, dtype=torch.int8)])
    check(torch.cat, [a, rand(2, 3, dtype=torch.bfloat16)], 1)
    # 1-D empty tensors are skipped whatever the others' shape, but still promote
    check(torch.cat, [torch.ones(0, dtype=torch.float64), a])
    check(torch.cat, [a, torch.ones(0)], 1)
    check(torch.cat, [torch.ones(0), torch.ones(0, dtype=torch.int64)])
    check(torch.cat, [rand(2, 0), a], 1)
    check(torch.cat, [rand(0, 3), a], 0)


def test_cat_of_views_and_out():
    x = rand(4, 6)
    check(lambda t: torch.cat([t[:, :2], t[:, 4:], t.t()[:2].t()], 1), x)
    xt = x.to("tpu")
    out = torch.empty(0, device="tpu")
    r = torch.cat([xt, xt], 0, out=out)
    assert r is out
    assert_close(out.cpu(), torch.cat([x, x]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_stack(dtype):
    a, b = rand(2, 3, dtype=dtype), rand(2, 3, dtype=dtype, seed=1)
    check(torch.stack, [a, b])
    check(torch.stack, [a, b], 1)
    check(torch.stack, [a, b], -1)
    check(torch.stack, [torch.tensor(1.0), torch.tensor(2.0)])
    check(torch.stack, [a.float(), b.to(torch.int64)])
    check(torch.hstack, [a, b])
    check(torch.vstack, [a, b])


# ---- reordering ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_flip_roll_repeat(dtype):
    x = rand(2, 3, 4, dtype=dtype)
    check(torch.flip, x, (0,))
    check(torch.flip, x, (0, -1))
    check(torch.fliplr, x)
    check(torch.roll, x, 1)
    check(torch.roll, x, (1, -2), (0, 2))
    check(torch.roll, x, -5, -1)
    check(lambda t: t.repeat(2, 1, 3), x)
    check(lambda t: t.repeat(2, 1, 1, 2), x)
    check(lambda t: t.tile((2,)), x)
    check(torch.rot90, x[0], 2, (0, 1))
    check(torch.flip, torch.tensor(3.0), ())


def test_repeat_interleave():
    x = rand(3, 2)
    check(torch.repeat_interleave, x, 2, 0)
    check(torch.repeat_interleave, x, torch.tensor([1, 0, 2]), 0)
    check(torch.repeat_interleave, torch.tensor([2, 1, 3]))



# ---- tensor_split with the split points in a tensor ---------------------------------------------

# split points as a 1-D tensor (negative and past-the-end ones included) or a 0-d section count
SPLITS = [([1, 4], 0), ([-2, 1, 9], 1), ([], 0), (3, 0), (2, 1)]


def _split_on_tpu(x, points, dim, mode):
    def split(a, p):
        return [t * 1 for t in torch.tensor_split(a, p, dim)]

    if mode == "compiled":
        torch._dynamo.reset()
        return torch.compile(split, backend="tpu_debug")(x, points)
    if mode == "lazy":
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            return split(x, points)
    return split(x, points)


@pytest.mark.parametrize("mode", ["eager", "lazy", "compiled"])
@pytest.mark.parametrize("points_device", ["tpu", "cpu"])
@pytest.mark.parametrize(("points", "dim"), SPLITS)
def test_tensor_split_by_tensor(points, dim, points_device, mode):
    # PyTorch reads the split points on the host; a user whose tensors all live on tpu
    # passes them as a tpu tensor, and the pieces are CPU's (copies of slices: exact)
    x = rand(6, 5, seed=4)
    expected = torch.tensor_split(x, torch.tensor(points, dtype=torch.long), dim)
    actual = _split_on_tpu(x.to("tpu"), torch.tensor(points, dtype=torch.long).to(points_device), dim, mode)
    _compare(actual, list(expected))


def test_tensor_split_by_tpu_tensor_gives_views_and_gradients():
    x = rand(6, 5, seed=5).requires_grad_()
    xt = _tpu(x)
    pieces = torch.tensor_split(xt, torch.tensor([2, 3]).to("tpu"), 0)
    assert all(p._base is xt for p in pieces)  # views of the input, as on CPU
    weights = (1.0, 2.0, 3.0)
    sum(w * p.sum() for w, p in zip(weights, torch.tensor_split(x, torch.tensor([2, 3]), 0))).backward()
    sum(w * p.sum() for w, p in zip(weights, pieces)).backward()
    assert_close(xt.grad.cpu(), x.grad)


def test_tensor_split_by_tpu_tensor_refuses_what_cpu_refuses():
    x = rand(6, seed=6).to("tpu")
    expected = "^tensor_split expected tensor_indices_or_sections to have dtype of long, but got Float$"
    with pytest.raises(RuntimeError, match=expected):
        torch.tensor_split(x, torch.tensor([1.0]).to("tpu"))
    expected = ("^tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                "one-dimensional tensor, but got a tensor with 2 dims$")
    with pytest.raises(RuntimeError, match=expected):
        torch.tensor_split(x, torch.tensor([[1]]).to("tpu"))



def test_tensor_split_by_tpu_tensor_is_an_implicit_read(tmp_path):
    # the split points' values decide the pieces' shapes: reading them is a sync the user
    # did not write, recorded at the user's line with the points' bytes
    x, points = rand(6, seed=7).to("tpu"), torch.tensor([2, 3]).to("tpu")
    with tpu_debug.trace(logdir=str(tmp_path)) as session:
        line = inspect.currentframe().f_lineno + 1
        torch.tensor_split(x, points)
    (read,) = session.transfers()
    assert (read.direction, read.nbytes, read.implicit) == ("d2h", 2 * 8, True)
    assert (read.location.file, read.location.line) == (__file__, line)


# ---- copies ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_clone_and_copies(dtype):
    x = rand(3, 4, dtype=dtype)
    check(torch.clone, x)
    check(lambda t: t.t().clone(), x)
    check(lambda t: t.clone(memory_format=torch.contiguous_format), x)
    check(lambda t: t.t().contiguous(), x)
    check(aten.lift_fresh_copy, x)
    check(aten.alias_copy, x)
    check(aten.expand_copy, x[:1], [2, 3, 4])
    check(aten.expand_copy, x[:, :1], [-1, 5])
    check(aten.permute_copy, x, [1, 0])
    check(torch.narrow_copy, x, 1, 1, 2)
    check(torch.narrow_copy, x, -1, -2, 2)
    check(aten.split_with_sizes_copy, x, [1, 2])
    check(aten.unbind_copy, x, 1)
    check(aten.view_copy, x, [4, 3])


def test_clone_is_a_copy():
    xt = torch.ones(3, device="tpu")
    y = xt.clone()
    xt.add_(1)
    assert_close(y.cpu(), torch.ones(3))


# ---- padding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_pad(dtype):
    x = rand(2, 3, 4, dtype=dtype)
    check(F.pad, x, (1, 2))
    check(F.pad, x, (1, 2, 0, 1), value=1)
    check(F.pad, x, (0, 0, 0, 0, 2, 1))
    check(F.pad, x, (-1, 2, 1, -1))  # negative pads crop
    check(torch.constant_pad_nd, x, [1, 1])


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_mode_pad(mode, dims):
    shape = (2, 3, 5, 6, 4)[: 2 + dims]
    pad = (2, 1, 1, 3, 1, 2)[: 2 * dims]
    x = rand(*shape).requires_grad_()
    check(F.pad, x, pad, mode=mode)
    # backward
    g = rand(*F.pad(x, pad, mode=mode).shape, seed=1)
    xt = _tpu(x)
    F.pad(x, pad, mode=mode).backward(g)
    F.pad(xt, pad, mode=mode).backward(g.to("tpu"))
    assert_close(xt.grad.cpu(), x.grad)


# ---- triangles and diagonals ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_tril_triu(dtype):
    x = rand(2, 4, 5, dtype=dtype)
    for k in (0, 1, -2, 7):
        check(torch.tril, x, k)
        check(torch.triu, x, k)


@pytest.mark.parametrize("offset,dim1,dim2", [(0, -2, -1), (1, 0, 2), (-2, 2, 0), (0, 1, 0)])
def test_diag_embed(offset, dim1, dim2):
    x = rand(2, 3)
    check(torch.diag_embed, x, offset, dim1, dim2)
    check(torch.diag, rand(4), offset)
    check(torch.diag, rand(3, 4), offset)


def test_scatters_into_views():
    x = rand(4, 5, 3)
    check(torch.slice_scatter, x, rand(4, 2, 3, seed=1), 1, 1, 5, 2)
    check(torch.slice_scatter, x, rand(2, 5, 3, seed=1), 0, -2)
    check(torch.select_scatter, x, rand(4, 3, seed=1), 1, -1)
    check(torch.diagonal_scatter, x, rand(3, 4, seed=1), 0, 0, 1)
    check(torch.diagonal_scatter, x, rand(4, 3, seed=1), -1, 1, 2)
    check(torch.diagonal_scatter, x, rand(4, 2, seed=1), 1, 1, 2)
    check(torch.as_strided_scatter, rand(3, 4), rand(2, 2, seed=1), (2, 2), (1, 4), 1)


# ---- masked_fill ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_fill(dtype):
    x = rand(3, 4, dtype=dtype)
    m = rand(3, 4, dtype=torch.bool, seed=1)
    check(torch.masked_fill, x, m, 1)
    check(torch.masked_fill, x, m[0], 0)  # broadcast mask
    check(torch.masked_fill, x, m, torch.tensor(1))
    check(torch.masked_fill, x[0], m, 1)  # broadcast self
    check(lambda t, mm: t.clone().masked_fill_(mm, 1), x, m[:, :1])


def test_masked_fill_float_values():
    x = rand(3, 4)
    m = x > 0
    check(torch.masked_fill, x, m, float("-inf"))
    check(torch.masked_fill, x, m, torch.tensor(2.5))
    check(lambda t, mm: t.masked_fill(mm, 7), x, m)
    # a CPU 0-dim value with a tpu tensor, as PyTorch allows
    xt = x.to("tpu")
    assert_close(xt.masked_fill(m.to("tpu"), torch.tensor(3.0)).cpu(), x.masked_fill(m, 3.0))


def test_where_variants():
    x, y = rand(3, 4), rand(3, 4, seed=1)
    check(torch.where, x > 0, x, y)
    check(torch.where, x > 0, x, 0.0)
    check(torch.where, x > 0, 1.0, y)


# ---- autograd ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.cat([a, a * 2], 1),
        lambda a: torch.stack([a, a], 0),
        lambda a: a.flip(0).roll(1, 1),
        lambda a: a.repeat(2, 3),
        lambda a: F.pad(a, (1, 2, 0, 1), value=3.0),
        lambda a: a.tril(),
        lambda a: torch.diag_embed(a),
        lambda a: a.masked_fill(a > 0, 0.0),
    ],
    ids=["cat", "stack", "flip_roll", "repeat", "pad", "tril", "diag_embed", "masked_fill"],
)
def test_grad(fn):
    x = rand(3, 4, seed=2).requires_grad_()
    xt = _tpu(x)
    y = fn(x)
    g = rand(*y.shape, seed=3)
    y.backward(g)
    fn(xt).backward(g.to("tpu"))
    assert_close(xt.grad.cpu(), x.grad)
