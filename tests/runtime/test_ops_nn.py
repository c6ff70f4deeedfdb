"""nn lowerings (runtime/ops/: convolution, pooling, normalization, losses, resampling, embedding,
activations) against PyTorch on CPU, forward and backward."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.core.errors import OpArgumentError
from tpu_debug.runtime.config import config

TOL = {"rtol": 1e-4, "atol": 1e-5}
EXACT = {"rtol": 0, "atol": 0}


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return []


def _on(t, like):
    """``t`` (a constant CPU tensor or None) on ``like``'s device."""
    return None if t is None else t.to(like.device)


def check(fn, *args, grad=True, tol=TOL, seed=0):
    """Run ``fn`` on CPU and on tpu; compare outputs and input gradients.

    Floating-point tensor arguments require grad when ``grad``; the same random
    cotangent is fed to both backward passes. Constants that must not require
    grad (class weights) are closed over and moved with ``_on``.
    """
    def prepare(device):
        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                t = a.detach().to(device)
                if grad and t.is_floating_point():
                    t.requires_grad_(True)
                out.append(t)
            else:
                out.append(a)
        return out

    cpu_args, tpu_args = prepare("cpu"), prepare("tpu")
    ref, got = _leaves(fn(*cpu_args)), _leaves(fn(*tpu_args))
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), r, equal_nan=True, **tol)
    if not grad:
        return
    gen = torch.Generator().manual_seed(seed)
    pairs = [(r, g) for r, g in zip(ref, got) if r.requires_grad]
    cots = [torch.randn(r.shape, generator=gen, dtype=r.dtype) for r, _ in pairs]
    torch.autograd.backward([r for r, _ in pairs], cots)
    torch.autograd.backward([g for _, g in pairs], [c.to("tpu") for c in cots])
    for a, b in zip(cpu_args, tpu_args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)


def check_module(module, *inputs, train=True, tol=TOL, steps=1):
    """A module and its deep copy on tpu: outputs, input/param grads, buffers."""
    ref_m = module
    tpu_m = copy.deepcopy(module).to("tpu")
    ref_m.train(train)
    tpu_m.train(train)
    for _ in range(steps):
        ref_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        tpu_in = [x.detach().to("tpu").requires_grad_(x.is_floating_point()) for x in inputs]
        ref, got = ref_m(*ref_in), tpu_m(*tpu_in)
        torch.testing.assert_close(got.cpu(), ref, **tol)
        cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
        ref.backward(cot)
        got.backward(cot.to("tpu"))
        for a, b in zip(ref_in, tpu_in):
            if a.requires_grad:
                torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)
    for (name, p), (_, q) in zip(ref_m.named_parameters(), tpu_m.named_parameters()):
        assert q.device.type == "tpu", name
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol, msg=f"grad of {name}")
    for (name, b), (_, c) in zip(ref_m.named_buffers(), tpu_m.named_buffers()):
        torch.testing.assert_close(c.cpu(), b, **tol, msg=f"buffer {name}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---- convolution ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "x_shape, w_shape, kw, bias",
    [
        ((2, 3, 9), (4, 3, 3), {}, True),
        ((2, 4, 10), (6, 2, 3), {"stride": 2, "padding": 1, "groups": 2}, False),
        ((2, 3, 8, 7), (5, 3, 3, 3), {}, True),
        ((2, 3, 8, 7), (5, 3, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}, False),
        ((1, 4, 9, 9), (4, 1, 3, 3), {"padding": 1, "groups": 4}, True),  # depthwise
        ((2, 3, 7, 7), (4, 3, 3, 3), {"padding": "same"}, False),
        ((2, 3, 7, 6), (4, 3, 2, 2), {"padding": "same", "dilation": 2}, True),
        ((3, 7, 7), (4, 3, 3, 3), {}, True),  # unbatched
        ((1, 2, 5, 6, 5), (3, 2, 2, 3, 2), {"stride": 2, "padding": 1}, True),
    ],
)
def test_conv(x_shape, w_shape, kw, bias):
    nd = len(w_shape) - 2
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    b = torch.randn(w_shape[0]) if bias else None
    check(lambda x, w, b: conv(x, w, b, **kw), torch.randn(x_shape), torch.randn(w_shape), b)


@pytest.mark.parametrize(
    "x_shape, w_shape, kw",
    [
        ((2, 4, 6), (4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
        ((2, 4, 5, 6), (4, 3, 3, 3), {}),
        ((2, 4, 5, 6), (4, 2, 3, 2), {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2), "groups": 2}),
        ((1, 2, 5, 5), (2, 3, 3, 3), {"stride": 2, "dilation": 2, "output_padding": 1}),
        ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), {"stride": 2}),
    ],
)
def test_conv_transpose(x_shape, w_shape, kw):
    nd = len(w_shape) - 2
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    check(lambda x, w, b: conv(x, w, b, **kw), torch.randn(x_shape), torch.randn(w_shape), torch.randn(w_shape[1] * kw.get("groups", 1)))


def test_conv_float64_and_only_weight_grad():
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    check(lambda x, w: F.conv2d(x, w, stride=2), x, w)
    # input needs no grad: convolution_backward gets output_mask [False, True, False]
    w_c = w.clone().requires_grad_()
    w_t = w.to("tpu").requires_grad_()
    F.conv2d(x, w_c).sum().backward()
    F.conv2d(x.to("tpu"), w_t).sum().backward()
    torch.testing.assert_close(w_t.grad.cpu(), w_c.grad)


def test_conv_bfloat16():
    x, w, b = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    ref = F.conv2d(x.bfloat16(), w.bfloat16(), b.bfloat16(), padding=1)
    got = F.conv2d(x.bfloat16().to("tpu"), w.bfloat16().to("tpu"), b.bfloat16().to("tpu"), padding=1)
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-2, atol=5e-2)


def test_conv2d_module():
    check_module(nn.Conv2d(3, 8, 3, padding=1, stride=2), torch.randn(2, 3, 8, 8))


# ---- pooling ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": (3, 2), "stride": (2, 1), "dilation": (2, 1)},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True},
    ],
)
def test_max_pool2d(kw):
    x = torch.randn(2, 3, 9, 8)
    check(lambda x: F.max_pool2d(x, **kw, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, **kw), x)


def test_max_pool_ties_and_nan():
    x = torch.tensor([[[[1.0, 1.0, 2.0, 2.0], [0.0, float("nan"), 2.0, -1.0]]]])
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=False)
    check(lambda x: F.max_pool2d(x, 2), torch.ones(1, 1, 4, 4))


def test_max_pool_1d_3d_unbatched():
    check(lambda x: F.max_pool1d(x, 3, stride=2, padding=1, return_indices=True), torch.randn(2, 3, 10))
    check(lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), return_indices=True), torch.randn(1, 2, 4, 5, 6))
    check(lambda x: F.max_pool2d(x, 2), torch.randn(3, 6, 6))


def test_max_pool2d_integer():
    x = torch.randint(-50, 50, (1, 2, 6, 6))
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=False)


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": True},
        {"kernel_size": (2, 3), "divisor_override": 5},
    ],
)
def test_avg_pool2d(kw):
    check(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 9, 8))


def test_avg_pool_1d_3d():
    check(lambda x: F.avg_pool1d(x, 3, stride=2, padding=1, count_include_pad=False), torch.randn(2, 3, 10))
    check(lambda x: F.avg_pool3d(x, 2, stride=2, ceil_mode=True), torch.randn(1, 2, 5, 5, 6))


@pytest.mark.parametrize("size, out", [((8, 8), (2, 2)), ((7, 9), (3, 4)), ((5, 5), (7, 6)), ((6, 6), 1), ((6, 7), (None, 3))])
def test_adaptive_avg_pool2d(size, out):
    check(lambda x: F.adaptive_avg_pool2d(x, out), torch.randn(2, 3, *size))


def test_adaptive_pool_1d_3d_max():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), torch.randn(2, 3, 10))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), torch.randn(1, 2, 5, 7, 4))
    check(lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True), torch.randn(2, 3, 7, 5))
    check(lambda x: F.adaptive_max_pool1d(x, 3), torch.randn(2, 3, 10))
    check(lambda x: F.adaptive_max_pool3d(x, 2, return_indices=True), torch.randn(1, 2, 5, 4, 3))


@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool(nd):
    x = torch.randn(2, 3, *((9, 11) if nd == 2 else (7, 8, 9)))
    samples = torch.rand(2, 3, nd)
    pool = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    out = (4, 5) if nd == 2 else (3, 4, 5)
    check(lambda x: pool(x, 2, output_size=out, return_indices=True, _random_samples=_on(samples, x)), x)
    check(lambda x: pool(x, 3, output_size=(1,) * nd, _random_samples=_on(samples, x)), x)


def test_fractional_max_pool3d_reads_the_samples_of_its_batch():
    """PyTorch's kernels read the samples of (batch, plane) at that row, so extra rows go unread
    (nn.FractionalMaxPool3d keeps (N, C, 3) samples for an unbatched input); samples of
    another dtype than the input's are refused, as on CPU."""
    samples = torch.rand(2, 4, 3)
    check(lambda x: F.fractional_max_pool3d(x, 2, output_size=3, _random_samples=_on(samples, x),
                                            return_indices=True), torch.randn(4, 7, 7, 7))
    x = torch.randn(2, 4, 5, 5, 5)
    with pytest.raises(RuntimeError, match="Expect _random_samples to have the same dtype as input"):
        F.fractional_max_pool3d(x.to("tpu"), 2, output_ratio=0.5, _random_samples=samples.double().to("tpu"))


def test_fractional_max_pool_module_runs():
    got = nn.FractionalMaxPool2d(2, output_ratio=0.5).to("tpu")(torch.randn(1, 2, 8, 8, device="tpu"))
    assert got.shape == (1, 2, 4, 4)


def test_empty_batches():
    check(lambda x: F.adaptive_avg_pool2d(x, 3), torch.randn(0, 2, 6, 6), grad=False)
    check(lambda x: F.unfold(x, 2), torch.randn(0, 1, 5, 5), grad=False)
    check(lambda x: F.max_pool2d(x, 2), torch.randn(0, 2, 4, 4), grad=False)
    check(lambda x: F.group_norm(x, 2), torch.randn(0, 4, 3), grad=False)


def test_adaptive_avg_pool3d_bfloat16_sums_like_pytorch():
    check(lambda x: F.adaptive_avg_pool3d(x, (5, 7, 4)), torch.randn(2, 8, 8, 8).bfloat16(), grad=False, tol=EXACT)


def test_unfold_fold():
    x = torch.randn(2, 3, 7, 6)
    check(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), x)
    cols = F.unfold(x, 3, padding=1)
    check(lambda c: F.fold(c, (7, 6), 3, padding=1), cols)


# ---- normalization ------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    x = torch.randn(4, 5, 6) * 3 + 1
    shape = (5, 6)
    w, b = (torch.randn(shape), torch.randn(shape)) if affine else (None, None)
    check(lambda x, w, b: F.layer_norm(x, shape, w, b, eps=1e-3), x, w, b)
    check(lambda x: F.layer_norm(x, (6,)), x)


def test_layer_norm_weight_only():
    x = torch.randn(3, 8)
    check(lambda x, w: F.layer_norm(x, (8,), w, None), x, torch.randn(8))


@pytest.mark.parametrize("shape, groups", [((2, 6, 4, 4), 3), ((3, 4, 5), 2), ((4, 6), 3), ((2, 4, 2, 3, 2), 1)])
def test_group_norm(shape, groups):
    c = shape[1]
    check(lambda x, w, b: F.group_norm(x, groups, w, b), torch.randn(shape), torch.randn(c), torch.randn(c))
    check(lambda x: F.group_norm(x, groups), torch.randn(shape))


def test_layer_and_group_norm_modules():
    check_module(nn.LayerNorm(8), torch.randn(4, 3, 8))
    check_module(nn.GroupNorm(2, 4), torch.randn(3, 4, 5, 5))


@pytest.mark.parametrize(
    "module, shape",
    [
        (lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
        (lambda: nn.BatchNorm1d(5), (8, 5)),
        (lambda: nn.BatchNorm1d(3, momentum=0.3), (4, 3, 7)),
        (lambda: nn.BatchNorm2d(3, affine=False), (4, 3, 2, 2)),
        (lambda: nn.BatchNorm2d(3, track_running_stats=False), (4, 3, 5, 5)),
        (lambda: nn.BatchNorm3d(2, momentum=None), (2, 2, 3, 3, 3)),
    ],
)
def test_batch_norm_train_updates_running_stats(module, shape):
    m = module()
    check_module(m, torch.randn(shape) * 2 + 0.5, train=True, steps=2)


def test_batch_norm_eval():
    m = nn.BatchNorm2d(3)
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(3))
        m.running_var.copy_(torch.rand(3) + 0.5)
        m.weight.copy_(torch.randn(3))
    check_module(m, torch.randn(4, 3, 5, 5), train=False)


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_legit_ops(training):
    x = torch.randn(4, 3, 5)
    w, b = torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
    ref = torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, training, 0.1, 1e-5)
    got = torch.ops.aten._native_batch_norm_legit(x.to("tpu"), w.to("tpu"), b.to("tpu"), rm_t, rv_t, training, 0.1, 1e-5)
    for r, g in zip(ref, got):  # saved statistics too: empty when not training, as on CPU
        torch.testing.assert_close(g.cpu(), r, **TOL)
    torch.testing.assert_close(rm_t.cpu(), rm, **TOL)
    torch.testing.assert_close(rv_t.cpu(), rv, **TOL)
    ref = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, training, 0.1, 1e-5)
    got = torch.ops.aten._native_batch_norm_legit_functional(*(t.to("tpu") for t in (x, w, b, rm, rv)), training, 0.1, 1e-5)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g.cpu(), r, **TOL)
    ref = torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    got = torch.ops.aten._native_batch_norm_legit.no_stats(x.to("tpu"), w.to("tpu"), b.to("tpu"), True, 0.1, 1e-5)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g.cpu(), r, **TOL)


_BN_OPS = {
    "native_batch_norm train": lambda x, w, b, rm, rv: torch.ops.aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5),
    "native_batch_norm eval": lambda x, w, b, rm, rv: torch.ops.aten.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5),
    "legit eval": lambda x, w, b, rm, rv: torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, False, 0.1, 1e-5),
    "legit no_training": lambda x, w, b, rm, rv: torch.ops.aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
    "legit no_stats": lambda x, w, b, rm, rv: torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
    "with_update": lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5),
    "no_update": lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype, params", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                           (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16-f32-params"])
def test_batch_norm_saved_statistics_are_cpus(dtype, params, compiled):
    """PyTorch's CPU kernel saves no statistics when it normalizes with the running ones,
    and saves them in a half input's dtype unless the parameters are float32; its meta
    kernels say (C,) float32 in every case. The tpu follows CPU.

    Compiled graphs carry the dtypes AOTAutograd traced: for the functional batch-norm op
    it runs PyTorch's decomposition, ahead of any per-op fake rule, which saves float32
    statistics for a bfloat16 input; there only the shapes are CPU's."""
    from tpu_debug.runtime.compiled import compile as tpu_compile

    x = torch.randn(4, 3, 5).to(dtype)
    w, b, rm, rv = (t.to(params) for t in (torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5))
    dtypes = not (compiled and dtype == params == torch.bfloat16)
    for name, op in _BN_OPS.items():
        ref = op(x, w, b, rm.clone(), rv.clone())
        run = tpu_compile(op) if compiled else op
        got = run(*(t.to("tpu") for t in (x, w, b, rm, rv)))
        assert [tuple(g.shape) for g in got] == [tuple(r.shape) for r in ref], name
        if dtypes:
            assert [g.dtype for g in got] == [r.dtype for r in ref], name


def test_batch_norm_with_update():
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
    ref = torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)
    got = torch.ops.aten._batch_norm_with_update(x.to("tpu"), w.to("tpu"), b.to("tpu"), rm_t, rv_t, 0.1, 1e-5)
    for r, g in zip(ref[:3], got[:3]):
        torch.testing.assert_close(g.cpu(), r, **TOL)
    torch.testing.assert_close(rm_t.cpu(), rm, **TOL)
    torch.testing.assert_close(rv_t.cpu(), rv, **TOL)


def test_batch_norm_bfloat16_input():
    x = torch.randn(4, 3, 5, 5).bfloat16()
    m = nn.BatchNorm2d(3)
    ref = m(x.float()).bfloat16()
    got = copy.deepcopy(nn.BatchNorm2d(3)).to("tpu")(x.to("tpu"))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-2, atol=2e-2)


# ---- losses -------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    x = torch.randn(6, 5).log_softmax(1)
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    t_ign = torch.tensor([0, -100, 2, 2, -100, 3])
    w = torch.rand(5) + 0.1 if weighted else None
    check(lambda x: F.nll_loss(x, _on(t, x), _on(w, x), reduction=reduction), x)
    check(lambda x: F.nll_loss(x, _on(t_ign, x), _on(w, x), reduction=reduction), x)
    check(lambda x: F.nll_loss(x, _on(t, x), _on(w, x), ignore_index=2, reduction=reduction), x)


def test_nll_loss_unbatched_and_all_ignored():
    x = torch.randn(5)
    check(lambda x: F.nll_loss(x, torch.tensor(3, device=x.device)), x)
    check(lambda x: F.nll_loss(x, torch.tensor(3, device=x.device), reduction="none"), x)
    x = torch.randn(2, 5)
    check(lambda x: F.nll_loss(x, torch.tensor([-100, -100], device=x.device)), x, grad=False)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss2d_and_cross_entropy(reduction):
    x = torch.randn(2, 4, 3, 5)
    t = torch.randint(0, 4, (2, 3, 5))
    t[0, 0, 0] = -100
    w = torch.rand(4) + 0.5
    check(lambda x: F.nll_loss(x, _on(t, x), _on(w, x), reduction=reduction), x)
    check(lambda x: F.cross_entropy(x, _on(t, x), _on(w, x), reduction=reduction), x)
    check(lambda x: F.cross_entropy(x[:, :, 0, 0], t[:, 0, 1].to(x.device), reduction=reduction), x)


def test_cross_entropy_probabilities_and_label_smoothing():
    x = torch.randn(4, 5)
    p = torch.randn(4, 5).softmax(1)
    t = torch.tensor([1, 0, 4, 2])
    check(lambda x, p: F.cross_entropy(x, p), x, p)
    check(lambda x: F.cross_entropy(x, t.to(x.device), label_smoothing=0.1), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    x, y = torch.randn(4, 5) * 2, torch.randn(4, 5) * 2
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.l1_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), x, y)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0), x, y)
    check(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7), x, y)


def test_mse_loss_broadcast_target():
    check(lambda x, y: F.mse_loss(x, y.expand_as(x)), torch.randn(3, 4), torch.randn(1, 4))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    x = torch.rand(4, 5) * 0.98 + 0.01
    y = torch.rand(4, 5)
    w = torch.rand(4, 5)
    check(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.binary_cross_entropy(x, y, _on(w, x), reduction=reduction), x, y)
    # exact 0 and 1 probabilities: PyTorch clamps the logs at -100
    x01 = torch.tensor([0.0, 1.0, 0.5, 1.0])
    check(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x01, torch.tensor([1.0, 0.0, 1.0, 1.0]), grad=False)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    x = torch.randn(4, 5) * 5
    y = torch.rand(4, 5)
    check(lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), x, y)
    w, pw = torch.rand(5), torch.rand(5) + 0.5
    check(
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, _on(w, x), pos_weight=_on(pw, x), reduction=reduction),
        x, y,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss(reduction):
    x = torch.randn(5, 4)
    x[0] = torch.tensor([2.0, 1.0, -3.0, 0.5])  # class 1's margin met exactly (z = 0): no loss, no gradient
    t = torch.tensor([0, 3, 1, 1, 2])
    w = torch.rand(4) + 0.5
    for p in (1, 2):
        check(lambda x, p=p: F.multi_margin_loss(x, _on(t, x), p=p, reduction=reduction), x)
    check(lambda x: F.multi_margin_loss(x, _on(t, x), margin=0.7, weight=_on(w, x), reduction=reduction), x)
    # unbatched: reduction "none" gives the target's shape, 0-d here
    check(lambda x: F.multi_margin_loss(x, torch.tensor(2, device=x.device), reduction=reduction), torch.randn(4))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss(reduction):
    x = torch.randn(4, 5)
    x[3] = torch.tensor([0.0, 1.0, 2.0, 0.0, -1.0])  # label 2 against class 1: z = 0 exactly
    # labels run up to the first -1; a repeated label counts twice, as in PyTorch's loop
    t = torch.tensor([[3, 0, -1, 1, 2], [0, 1, 2, 3, 4], [1, 1, -1, 0, 0], [2, -1, 0, 0, 0]])
    check(lambda x: F.multilabel_margin_loss(x, _on(t, x), reduction=reduction), x)
    unbatched = torch.tensor([3, 0, -1, 1, 2])
    check(lambda x: F.multilabel_margin_loss(x, _on(unbatched, x), reduction=reduction), torch.randn(5))


def _weighted_multi_margin(x, target, weight):
    return F.multi_margin_loss(x, target, weight=weight)


@pytest.mark.parametrize(("fn", "args", "message"), [
    (F.multi_margin_loss, (torch.randn(5, 0), torch.zeros(5, dtype=torch.long)), "Expected non-empty vector"),
    (F.multi_margin_loss, (torch.randn(5, 4), torch.zeros(5, 4, dtype=torch.long)), "Expected target size \\[5\\]"),
    (F.multi_margin_loss, (torch.randn(5, 4), torch.zeros(5, dtype=torch.int32)), "expected scalar type Long but found Int"),
    (F.multilabel_margin_loss, (torch.randn(5, 4), torch.zeros(4, dtype=torch.long)), "inconsistent target size"),
    (F.multilabel_margin_loss, (torch.randn(3, 4, 5), torch.zeros(3, 4, 5, dtype=torch.long)), "Expected non-empty"),
    # the weight's size is checked before the target's dtype, as CPU does
    (_weighted_multi_margin, (torch.randn(5, 4), torch.zeros(5), torch.ones(5)), "inconsistent weight size"),
    # class indices out of range: XLA would read another class's score
    (F.multi_margin_loss, (torch.randn(3, 4), torch.tensor([0, 4, 1])), "target out of range"),
    (F.multi_margin_loss, (torch.randn(3, 4), torch.tensor([0, -1, 1])), "target out of range"),
    (F.multilabel_margin_loss, (torch.randn(2, 4), torch.tensor([[0, -2, 1, 0]] * 2)), "'target' is out of range"),
    # entries after the first -1 are not labels, and CPU checks them all the same
    (F.multilabel_margin_loss, (torch.randn(2, 4), torch.tensor([[0, -1, 7, 0]] * 2)), "'target' is out of range"),
], ids=["empty_classes", "2d_target", "int32_target", "multilabel_target_shape", "multilabel_3d", "weight_size",
        "target_above", "target_negative", "multilabel_below", "multilabel_after_end"])
def test_margin_losses_refuse_what_cpu_refuses(fn, args, message):
    with pytest.raises(RuntimeError, match=message):
        fn(*args)
    with pytest.raises(OpArgumentError, match=message):
        fn(*(a.to("tpu") for a in args))


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_margin_loss_targets_checked_in_programs(mode, monkeypatch):
    """With the data-checks switch, a lazy or compiled margin loss refuses a class index out of
    range: lazily as CPU does; compiled, the graph holds PyTorch's decomposition of the loss
    (dynamo traces it), whose gather refuses the index in gather's words."""
    monkeypatch.setattr(config, "data_checks", True)
    x, t = torch.randn(3, 4).to("tpu"), torch.tensor([0, 4, 1]).to("tpu")
    fn = F.multi_margin_loss
    if mode == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(F.multi_margin_loss, backend="tpu_debug", dynamic=False)
    eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE if mode == "lazy" else torch.tpu.EagerMode.DEFER_NEVER
    message = "target out of range" if mode == "lazy" else "index 4 is out of bounds for dimension 1 with size 4"
    with torch.tpu.set_eager_mode(eager_mode), pytest.raises(OpArgumentError, match=message):
        fn(x, t).cpu()
    if mode == "compiled":
        torch._dynamo.reset()


@pytest.mark.parametrize("fn", [F.hardshrink, F.softshrink])
def test_shrink_backward(fn):
    # both bounds exactly: the gradient is 0 on [-lambd, lambd], bounds included
    check(lambda x: fn(x, 0.5), torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.3, 0.5, 0.7, 2.0]))
    check(lambda x: fn(x), torch.randn(3, 4))


# ---- resampling ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"scale_factor": 2, "mode": "nearest"},
        {"size": (7, 5), "mode": "nearest"},
        {"scale_factor": 1.7, "mode": "nearest"},
        {"size": (3, 2), "mode": "nearest"},
        {"size": (7, 9), "mode": "nearest-exact"},
        {"scale_factor": 2, "mode": "bilinear"},
        {"size": (7, 5), "mode": "bilinear", "align_corners": True},
        {"size": (7, 5), "mode": "bilinear", "align_corners": False},
        {"scale_factor": 1.5, "mode": "bilinear", "align_corners": False},
        {"size": (3, 2), "mode": "bilinear"},
        {"scale_factor": 0.6, "mode": "bilinear", "recompute_scale_factor": False},
    ],
)
def test_interpolate_2d(kw):
    check(lambda x: F.interpolate(x, **kw), torch.randn(2, 3, 4, 6))


def test_interpolate_1d_3d():
    check(lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), torch.randn(2, 3, 5))
    check(lambda x: F.interpolate(x, size=8, mode="linear", align_corners=False), torch.randn(2, 3, 5))
    check(lambda x: F.interpolate(x, size=8, mode="linear", align_corners=True), torch.randn(2, 3, 5))
    check(lambda x: F.interpolate(x, size=(4, 5, 3), mode="trilinear"), torch.randn(1, 2, 3, 3, 2))
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), torch.randn(1, 2, 2, 3, 2))


@pytest.mark.parametrize(
    "kw",
    [
        {"size": (5, 6), "align_corners": True},
        {"size": (3, 4), "align_corners": False},
        {"scale_factor": 1.7, "align_corners": False},
        {"scale_factor": 2, "align_corners": False, "recompute_scale_factor": True},
    ],
)
def test_interpolate_bicubic(kw):
    check(lambda x: F.interpolate(x, mode="bicubic", **kw), torch.randn(2, 3, 4, 5))


def test_interpolate_half_precision_weights():
    # PyTorch keeps 1d/3d linear and bicubic weights in bfloat16: same roundings here
    x = torch.randn(2, 3, 4, 5).bfloat16()
    check(lambda x: F.interpolate(x, size=(5, 6), mode="bicubic", align_corners=True), x, grad=False, tol=EXACT)
    check(lambda x: F.interpolate(x[0], scale_factor=1.7, mode="linear", align_corners=True), x, grad=False, tol=EXACT)
    check(lambda x: F.interpolate(x[None], size=(3, 5, 7), mode="trilinear"), x, grad=False, tol=EXACT)
    # bilinear: float32 weights and one rounding, but PyTorch's float32 kernel sums
    # in an order (vectorized) this does not reproduce bit for bit
    check(lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), x, grad=False, tol={"rtol": 1.6e-2, "atol": 1e-5})


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    "kw",
    [{"size": (3, 5)}, {"size": (9, 13)}, {"size": (2, 2), "align_corners": True},
     {"size": (7, 3), "align_corners": True}, {"scale_factor": 0.35}],
    ids=["down", "up", "corners", "mixed-corners", "scale"],
)
def test_interpolate_antialias(mode, kw):
    check(lambda x: F.interpolate(x, mode=mode, antialias=True, **kw), torch.randn(2, 3, 8, 6))


def test_upsample_module():
    check_module(nn.Upsample(scale_factor=2, mode="bilinear"), torch.randn(1, 2, 3, 3))


# ---- embedding bags ---------------------------------------------------------------------------

_BAG_IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
_BAG_OFF = torch.tensor([0, 4, 4, 6])  # bag 1 is empty


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag(mode, padding_idx):
    w = torch.randn(10, 3)
    check(lambda w: F.embedding_bag(_on(_BAG_IDX, w), w, _on(_BAG_OFF, w), mode=mode, padding_idx=padding_idx), w)
    with torch.no_grad():  # the forward-only kernel
        check(lambda w: F.embedding_bag(_on(_BAG_IDX, w), w, _on(_BAG_OFF, w), mode=mode, padding_idx=padding_idx), w, grad=False)


def test_embedding_bag_variants():
    w = torch.randn(10, 3)
    last = torch.tensor([0, 4, 4, 6, 8])
    check(lambda w: F.embedding_bag(_on(_BAG_IDX, w), w, _on(last, w), include_last_offset=True), w)
    check(lambda w: F.embedding_bag(_on(_BAG_IDX.view(2, 4), w), w, mode="mean"), w)
    check(lambda w, p: F.embedding_bag(_on(_BAG_IDX, w), w, _on(_BAG_OFF, w), mode="sum", per_sample_weights=p), w, torch.rand(8))
    check_module(nn.EmbeddingBag(10, 4, mode="max"), _BAG_IDX.view(2, 4))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq(mode):
    # PyTorch 2.13's CPU kernel divides by the wrong count when counts differ
    # (pytorch/pytorch#190063); compare with the documented semantics instead
    w = torch.randn(10, 3).to("tpu").requires_grad_()
    out = F.embedding_bag(_BAG_IDX.to("tpu"), w, _BAG_OFF.to("tpu"), mode=mode, scale_grad_by_freq=True)
    out.backward(torch.ones(4, 3, device="tpu"))
    bag_len = torch.tensor([4, 0, 2, 2]).float()
    per_elem = torch.ones(8) if mode == "sum" else 1 / bag_len[torch.tensor([0, 0, 0, 0, 2, 2, 3, 3])]
    expected = torch.zeros(10).index_add_(0, _BAG_IDX, per_elem) / torch.bincount(_BAG_IDX, minlength=10).clamp(min=1)
    torch.testing.assert_close(w.grad.cpu(), expected[:, None].expand(10, 3))


# ---- structured backward ops with no lowering ----------------------------------------------------

_aten = torch.ops.aten


@pytest.mark.parametrize(
    "op, extra",
    [
        (_aten.hardsigmoid_backward, ()),
        (_aten.elu_backward, (1.0, 1.0, 1.0, False)),
        (_aten.softplus_backward, (1.0, 20.0)),
        (_aten.logit_backward, (1e-3,)),
    ],
    ids=["hardsigmoid", "elu", "softplus", "logit"],
)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_structured_backward_ops_decompose(op, extra, lazy):
    """A structured op's functional kernel on a backend without one allocates and calls
    its out= overload, which the tpu fallback receives; running the functional op from
    there would loop back to it. These ops have no lowering: their decompositions run,
    called directly, through out= and under autograd, eagerly and recorded lazily."""
    g, x = torch.randn(4, 6), torch.rand(4, 6) * 0.8 + 0.1

    def call(g, x):
        if op is _aten.elu_backward:
            return op(g, *extra, x)
        return op(g, x, *extra)

    mode = torch.tpu.EagerMode.DEFER_AND_FUSE if lazy else torch.tpu.EagerMode.DEFER_NEVER
    with torch.tpu.set_eager_mode(mode):
        check(call, g, x, grad=False)
        out = torch.empty(4, 6).to("tpu")
        overload = op.grad_input
        ref = call(g, x)
        if op is _aten.elu_backward:
            overload(g.to("tpu"), *extra, x.to("tpu"), grad_input=out)
        else:
            overload(g.to("tpu"), x.to("tpu"), *extra, grad_input=out)
    torch.testing.assert_close(out.cpu(), ref, **TOL)


class _InvertedResidual(nn.Module):
    """MobileNetV3's block: expand, depthwise, squeeze-and-excitation gated by
    hardsigmoid, hardswish, project."""

    def __init__(self, c=8, hidden=16):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.Hardswish())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, 4, 1), nn.ReLU(),
                                nn.Conv2d(4, hidden, 1), nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        h = self.depthwise(self.expand(x))
        return x + self.project(h * self.se(h))


def test_mobilenet_v3_block_trains():
    # gradients through three batch norms are sums over the batch and the image, taken in
    # another order by XLA: float32 rounding of values of order 1 stays within 1e-4
    check_module(_InvertedResidual(), torch.randn(2, 8, 6, 6), tol={"rtol": 1e-4, "atol": 1e-4})


# ---- whole models --------------------------------------------------------------------------------


class _SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, groups=2), nn.GroupNorm(2, 8), nn.GELU(), nn.AvgPool2d(2, ceil_mode=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 5))

    def forward(self, x):
        return self.head(self.pool(self.features(x)))


def test_small_cnn_train_step():
    model = _SmallCNN()
    x = torch.randn(4, 3, 12, 12)
    t = torch.tensor([0, 3, 1, 4])
    ref_m, tpu_m = model, copy.deepcopy(model).to("tpu")
    ref_loss = F.cross_entropy(ref_m(x), t)
    tpu_loss = F.cross_entropy(tpu_m(x.to("tpu")), t.to("tpu"))
    torch.testing.assert_close(tpu_loss.cpu(), ref_loss, **TOL)
    ref_loss.backward()
    tpu_loss.backward()
    for (name, p), (_, q) in zip(ref_m.named_parameters(), tpu_m.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=f"grad of {name}")
    for (name, b), (_, c) in zip(ref_m.named_buffers(), tpu_m.named_buffers()):
        torch.testing.assert_close(c.cpu(), b, **TOL, msg=f"buffer {name}")
    ref_m.eval()
    tpu_m.eval()
    torch.testing.assert_close(tpu_m(x.to("tpu")).detach().cpu(), ref_m(x).detach(), **TOL)


@pytest.mark.parametrize("concat", [False, True], ids=["padded", "concatenated"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_forward_and_backward_match_cpu(concat, zero_infinity):
    torch.manual_seed(0)
    T, N, C, S = 12, 3, 6, 4
    lp = torch.randn(T, N, C).log_softmax(-1).requires_grad_()
    tl, il = torch.tensor([4, 2, 3]), torch.tensor([12, 9, 7])
    tg = torch.randint(1, C, (N, S))  # repeated labels need a blank between them
    if concat:
        tg = torch.cat([tg[i, : tl[i]] for i in range(N)])
    for reduction in ("mean", "sum", "none"):
        ref = F.ctc_loss(lp, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity)
        dev = lp.detach().to("tpu").requires_grad_()
        got = F.ctc_loss(dev, tg.to("tpu"), il, tl, reduction=reduction, zero_infinity=zero_infinity)
        torch.testing.assert_close(got.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        g = torch.randn_like(ref)
        (g_ref,) = torch.autograd.grad(ref, lp, g)
        (g_dev,) = torch.autograd.grad(got, dev, g.to("tpu"))
        torch.testing.assert_close(g_dev.cpu(), g_ref, rtol=1e-4, atol=1e-5)


def test_ctc_loss_impossible_alignment():
    """Three repeated labels cannot fit in two frames: the loss is inf, or 0 with a zero
    gradient under zero_infinity, as on CPU."""
    lp = torch.randn(2, 1, 4).log_softmax(-1).requires_grad_()
    tg, il, tl = torch.tensor([[1, 1, 1]]), torch.tensor([2]), torch.tensor([3])
    assert F.ctc_loss(lp.detach().to("tpu"), tg.to("tpu"), il, tl, reduction="sum").item() == float("inf")
    dev = lp.detach().to("tpu").requires_grad_()
    got = F.ctc_loss(dev, tg.to("tpu"), il, tl, reduction="sum", zero_infinity=True)
    ref = F.ctc_loss(lp, tg, il, tl, reduction="sum", zero_infinity=True)
    assert got.item() == ref.item() == 0.0
    torch.testing.assert_close(torch.autograd.grad(got, dev)[0].cpu(), torch.autograd.grad(ref, lp)[0])


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
@pytest.mark.parametrize("op", ["layer_norm", "batch_norm", "group_norm", "convolution"])
def test_a_backward_returns_the_gradients_its_mask_leaves_off_as_none_as_cpu_does(op, mode):
    # DTensor's sharding rules (sequence parallel's layer norm) read None where a masked
    # gradient is; a zero tensor there fails them, so the shape of the answer is CPU's exactly
    torch.manual_seed(0)
    if op == "layer_norm":
        x, w, b, g = torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(4, 8)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
        args = (g, x, [8], mean, rstd, w, b)
        fn = torch.ops.aten.native_layer_norm_backward
    elif op == "batch_norm":
        x, w, g = torch.randn(4, 3, 5), torch.randn(3), torch.randn(4, 3, 5)
        _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)
        args = (g, x, w, None, None, save_mean, save_invstd, True, 1e-5)
        fn = torch.ops.aten.native_batch_norm_backward
    elif op == "group_norm":
        x, w, g = torch.randn(2, 4, 5), torch.randn(4), torch.randn(2, 4, 5)
        _, mean, rstd = torch.ops.aten.native_group_norm(x, w, None, 2, 4, 5, 2, 1e-5)
        args = (g, x, mean, rstd, w, 2, 4, 5, 2)
        fn = torch.ops.aten.native_group_norm_backward
    else:
        x, w, g = torch.randn(1, 2, 6), torch.randn(3, 2, 3), torch.randn(1, 3, 4)
        args = (g, x, w, [3], [1], [0], [1], False, [0], 1)
        fn = torch.ops.aten.convolution_backward
    with torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode)):
        for mask in ([True, False, False], [False, True, False], [False, True, True], [True, True, True]):
            want = fn(*args, mask)
            got = fn(*(a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args), mask)
            assert [t is None for t in got] == [t is None for t in want], (mask, want, got)
            for w_, g_ in zip(want, got):
                if w_ is not None:
                    torch.testing.assert_close(g_.cpu(), w_, **TOL)
