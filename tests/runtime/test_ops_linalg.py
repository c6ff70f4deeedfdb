"""Matrix products and linear algebra (runtime/ops/linalg.py) against PyTorch on CPU."""

from __future__ import annotations

import copy

import jax
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_debug.runtime.ops import linalg

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return []


def check(fn, *args, grad=True, tol=TOL, outputs=None):
    """``fn`` on CPU and tpu: outputs (those indexed by ``outputs``, default all)
    and the gradients of floating-point inputs under a shared random cotangent."""
    def prepare(device):
        return [
            a.detach().to(device).requires_grad_(grad and a.is_floating_point())
            if isinstance(a, torch.Tensor) else a
            for a in args
        ]

    cpu_args, tpu_args = prepare("cpu"), prepare("tpu")
    ref, got = _leaves(fn(*cpu_args)), _leaves(fn(*tpu_args))
    assert len(ref) == len(got)
    keep = range(len(ref)) if outputs is None else outputs
    ref, got = [ref[i] for i in keep], [got[i] for i in keep]
    for r, g in zip(ref, got):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), r, **tol)
    if not grad:
        return
    gen = torch.Generator().manual_seed(0)
    pairs = [(r, g) for r, g in zip(ref, got) if r.requires_grad]
    cots = [torch.randn(r.shape, generator=gen, dtype=r.dtype) for r, _ in pairs]
    torch.autograd.backward([r for r, _ in pairs], cots)
    torch.autograd.backward([g for _, g in pairs], [c.to("tpu") for c in cots])
    for a, b in zip(cpu_args, tpu_args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _spd(n, batch=()):
    a = torch.randn(*batch, n, n, dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


# ---- products ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (torch.mm, [(3, 4), (4, 5)]),
        (torch.bmm, [(2, 3, 4), (2, 4, 5)]),
        (torch.mv, [(3, 4), (4,)]),
        (torch.dot, [(5,), (5,)]),
        (torch.outer, [(3,), (4,)]),
        (torch.matmul, [(2, 3, 4), (4, 5)]),
        (torch.matmul, [(2, 1, 3, 4), (5, 4, 2)]),
        (torch.matmul, [(4,), (2, 4, 3)]),
        (torch.matmul, [(2, 3, 4), (4,)]),
        (torch.addmm, [(5,), (3, 4), (4, 5)]),
        (torch.addmv, [(3,), (3, 4), (4,)]),
        (torch.baddbmm, [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
        (torch.addbmm, [(3, 5), (2, 3, 4), (2, 4, 5)]),
        (torch.addr, [(3, 4), (3,), (4,)]),
        (lambda a, b: torch.einsum("bij,bkj->bik", a, b), [(2, 3, 4), (2, 5, 4)]),
    ],
)
def test_products(fn, shapes):
    check(fn, *(torch.randn(s) for s in shapes))


def test_addmm_alpha_beta():
    s, a, b = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=-2.0), s, a, b)
    check(lambda s, a, b: torch.baddbmm(s, a, b, beta=2, alpha=0.5), torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    # beta=0 ignores self entirely, NaNs included
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0), torch.full((3, 5), float("nan")), a, b, grad=False)


@pytest.mark.parametrize("fn", [torch.addmm, torch.baddbmm, torch.addmv])
def test_integer_products_truncate_float_alpha_beta(fn):
    # PyTorch converts alpha/beta to the integer dtype: 0.6 -> 0
    shapes = {torch.addmm: [(3, 5), (3, 4), (4, 5)], torch.baddbmm: [(2, 3, 5), (2, 3, 4), (2, 4, 5)],
              torch.addmv: [(3,), (3, 4), (4,)]}[fn]
    args = [torch.randint(-5, 5, s) for s in shapes]
    check(lambda *a: fn(*a, beta=0.2, alpha=0.6), *args, grad=False)
    check(lambda *a: fn(*a, beta=2, alpha=3), *args, grad=False)


def test_addbmm_bfloat16_rounds_per_batch():
    s, b1, b2 = torch.randn(5, 10), torch.randn(5, 5, 5), torch.randn(5, 5, 10)
    check(lambda s, a, b: torch.addbmm(s, a, b), s.bfloat16(), b1.bfloat16(), b2.bfloat16(),
          grad=False, tol={"rtol": 0, "atol": 0})


def test_vdot_and_complex_mm():
    check(torch.vdot, torch.randn(4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex64), grad=False)
    check(torch.mm, torch.randn(2, 3, dtype=torch.complex64), torch.randn(3, 2, dtype=torch.complex64), grad=False)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_matmul_stays_integer(dtype):
    lo, hi = (0, 5) if dtype == torch.uint8 else (-5, 5)
    a = torch.randint(lo, hi, (3, 4), dtype=dtype)
    b = torch.randint(lo, hi, (4, 2), dtype=dtype)
    check(torch.mm, a, b, grad=False)
    check(torch.matmul, a.expand(2, 3, 4), b, grad=False)


def test_integer_matmul_large_values_exact():
    a = torch.full((2, 3), 2**40, dtype=torch.int64)
    b = torch.full((3, 2), 3, dtype=torch.int64)
    check(torch.mm, a, b, grad=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_matmul_dtypes(dtype):
    tol = TOL if dtype == torch.float64 else {"rtol": 1.6e-2, "atol": 1e-2}
    check(torch.mm, torch.randn(4, 8).to(dtype), torch.randn(8, 3).to(dtype), tol=tol)
    check(F.linear, torch.randn(2, 4, 8).to(dtype), torch.randn(3, 8).to(dtype), torch.randn(3).to(dtype), tol=tol)


def test_matmul_precision_follows_torch_setting():
    before = torch.get_float32_matmul_precision()
    try:
        expected = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH, "medium": jax.lax.Precision.DEFAULT}
        for name, precision in expected.items():
            torch.set_float32_matmul_precision(name)
            assert linalg.matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_products_run_at_every_precision(precision):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        # CPU XLA computes float32 at full precision whatever the setting; on a
        # TPU "medium" would be one bf16 pass
        check(torch.mm, torch.randn(3, 7), torch.randn(7, 2), grad=False)
        check(lambda x, w: F.conv1d(x, w), torch.randn(1, 2, 9), torch.randn(3, 2, 3), grad=False)
    finally:
        torch.set_float32_matmul_precision(before)


def test_mm_out_dtype():
    a, b = torch.randn(3, 4).bfloat16(), torch.randn(4, 2).bfloat16()
    got = torch.ops.aten.mm.dtype(a.to("tpu"), b.to("tpu"), torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), a.float() @ b.float(), **TOL)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


# (mat_a, mat_b, offs): rows of a in groups (with an empty group), columns of b in groups,
# the contraction in groups, a batched product. Sizes keep PyTorch's CPU kernel's 16-byte
# stride alignment, which it checks.
_GROUPED = [
    ((8, 8), (3, 8, 16), (2, 2, 8)),
    ((3, 4, 8), (8, 16), (4, 8, 16)),
    ((4, 8), (8, 16), (3, 8)),
    ((3, 4, 8), (3, 8, 16), None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("a_shape, b_shape, offs", _GROUPED, ids=["2d3d", "3d2d", "2d2d", "3d3d"])
def test_grouped_mm(a_shape, b_shape, offs, dtype):
    # bfloat16 products are exact in float32 and both sides accumulate in float32: one
    # bfloat16 rounding of the same sum, give or take its order
    tol = TOL if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    offs = None if offs is None else _i32(*offs)
    check(lambda a, b: torch._grouped_mm(a, b, offs=None if offs is None else offs.to(a.device)),
          torch.randn(a_shape).to(dtype), torch.randn(b_shape).to(dtype), tol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_compiled_forward_and_backward(dtype):
    """PyTorch's meta kernel of ``_grouped_mm`` takes bfloat16 only; dynamo and AOTAutograd
    trace `tpu` inputs with the lowering's own meta function, float32 included."""
    from tpu_debug.runtime.compiled import compile as tpu_compile

    tol = TOL if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    a, b, g = torch.randn(8, 8).to(dtype), torch.randn(3, 8, 16).to(dtype), torch.randn(8, 16).to(dtype)
    offs = _i32(2, 2, 8)

    def step(a, b, offs, g):
        out = torch._grouped_mm(a, b, offs=offs)
        (out * g).sum().backward()
        return out.detach()

    ref_a, ref_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    dev_a, dev_b = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    ref = step(ref_a, ref_b, offs, g)
    got = tpu_compile(step)(dev_a, dev_b, offs.to("tpu"), g.to("tpu"))
    torch.testing.assert_close(got.cpu(), ref, **tol)
    torch.testing.assert_close(dev_a.grad.cpu(), ref_a.grad, **tol)
    torch.testing.assert_close(dev_b.grad.cpu(), ref_b.grad, **tol)


def test_grouped_mm_meta_rule_is_only_for_tpu():
    """Other devices keep PyTorch's meta kernel (bfloat16 only), and tpu calls get
    PyTorch's argument checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tpu_debug.runtime.compiled import register_metas

    register_metas()
    a, b = torch.randn(8, 8), torch.randn(3, 8, 16)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
        torch._grouped_mm(mode.from_tensor(a), mode.from_tensor(b), offs=mode.from_tensor(_i32(2, 4, 8)))
    with pytest.raises(RuntimeError, match="Offsets have to be int32"):
        torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs=torch.tensor([2, 4, 8]).to("tpu"))
    with pytest.raises(RuntimeError, match="contraction dimension of mat_a and mat_b must match"):
        torch._grouped_mm(a.to("tpu"), torch.randn(3, 4, 16).to("tpu"), offs=_i32(2, 4, 8).to("tpu"))


def test_linear_module_and_mlp():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False))
    tpu_model = copy.deepcopy(model).to("tpu")
    x = torch.randn(5, 8)
    ref, got = model(x), tpu_model(x.to("tpu"))
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), **TOL)
    ref.square().sum().backward()
    got.square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), tpu_model.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL, msg=name)


def test_linear_3d_input_grads():
    check(F.linear, torch.randn(2, 3, 8), torch.randn(4, 8), torch.randn(4))


def test_bilinear():
    check(F.bilinear, torch.randn(3, 4), torch.randn(3, 5), torch.randn(2, 4, 5), torch.randn(2))


@pytest.mark.parametrize("is_causal", [False, True])
def test_scaled_dot_product_attention(is_causal):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), q, k, v)


def test_scaled_dot_product_attention_mask_and_module():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)), q, k, v)
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    tpu_attn = copy.deepcopy(attn).to("tpu")
    x = torch.randn(2, 5, 8)
    ref, _ = attn(x, x, x)
    got, _ = tpu_attn(x.to("tpu"), x.to("tpu"), x.to("tpu"))
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), **TOL)


# ---- factorizations and solves -------------------------------------------------------------


def test_inverse_and_det():
    a = torch.randn(3, 4, 4, dtype=torch.float64)
    check(torch.linalg.inv, a)
    check(torch.linalg.inv_ex, a, outputs=[0, 1])
    check(torch.linalg.det, a)
    check(torch.linalg.slogdet, a)
    check(torch.logdet, _spd(4))
    check(torch.linalg.det, torch.randn(5, 5))


def test_det_singular_and_info():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    check(torch.linalg.det, a, grad=False)
    check(torch.linalg.slogdet, a, grad=False)
    check(torch.linalg.inv_ex, torch.zeros(2, 3, 3, dtype=torch.float64), grad=False, outputs=[1])


def test_cholesky_family():
    a = _spd(4, (2,))
    check(torch.linalg.cholesky, a)
    check(lambda a: torch.linalg.cholesky(a, upper=True), a)
    check(torch.linalg.cholesky_ex, a)
    L = torch.linalg.cholesky(a)
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    check(torch.cholesky_solve, b, L)
    check(lambda b, u: torch.cholesky_solve(b, u, upper=True), b, L.mT.contiguous())
    check(torch.cholesky_inverse, L[0])


@pytest.mark.parametrize(
    "a",
    [
        torch.diag(torch.tensor([1.0, -1.0, 2.0])),
        torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
        torch.stack([torch.eye(3), torch.diag(torch.tensor([1.0, 1.0, -1.0]))]),
    ],
)
def test_cholesky_ex_info_names_the_failing_minor(a):
    check(lambda a: torch.linalg.cholesky_ex(a).info, a, grad=False)


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda a: torch.linalg.inv(a), "linalg.inv: The diagonal element 2 is zero"),
        (lambda a: torch.linalg.cholesky(a - 2 * torch.eye(3, device=a.device)), "not positive-definite"),
        (lambda a: torch.linalg.solve(a, torch.ones(3, device=a.device)), "singular"),
    ],
)
def test_linalg_errors_match_cpu(fn, match):
    a = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    with pytest.raises(torch.linalg.LinAlgError, match=match):
        fn(a)
    with pytest.raises(torch.linalg.LinAlgError, match=match):
        fn(a.to("tpu"))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr(mode, shape):
    a = torch.randn(shape, dtype=torch.float64)
    # LAPACK's Householder QR on both sides: the same signs, so compare directly
    # PyTorch has no QR derivative for mode="r", nor for "complete" with more rows than columns
    differentiable = mode == "reduced" or (mode == "complete" and shape[-2] <= shape[-1])
    check(lambda a: torch.linalg.qr(a, mode=mode), a, grad=differentiable)


@pytest.mark.parametrize("left", [True, False])
def test_solve(left):
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    b = torch.randn(2, 4, 3, dtype=torch.float64) if left else torch.randn(2, 3, 4, dtype=torch.float64)
    check(lambda a, b: torch.linalg.solve(a, b, left=left), a, b)
    check(lambda a, b: torch.linalg.solve_ex(a, b, left=left), a, b, outputs=[0, 1])


def test_solve_vector_and_broadcast():
    a = torch.randn(4, 4, dtype=torch.float64)
    check(torch.linalg.solve, a, torch.randn(4, dtype=torch.float64))
    check(torch.linalg.solve, torch.randn(3, 4, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
    check(torch.linalg.solve, a, torch.randn(2, 4, 2, dtype=torch.float64))


def test_lu_family():
    a = torch.randn(4, 4, dtype=torch.float64)
    check(torch.linalg.lu_factor, a, grad=False)
    check(torch.linalg.lu_factor_ex, a, grad=False)
    check(torch.linalg.lu, a)
    check(torch.linalg.lu, torch.randn(3, 5, dtype=torch.float64))
    check(torch.linalg.lu, torch.randn(2, 5, 3, dtype=torch.float64))
    lu, piv = torch.linalg.lu_factor(a)
    b = torch.randn(4, 2, dtype=torch.float64)
    check(lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b), lu, b)
    check(lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, adjoint=True), lu, b)
    check(lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, left=False), lu, b.mT.contiguous())
    check(lambda lu: torch.lu_unpack(lu, piv.to(lu.device)), lu, grad=False)


def test_eigh_and_svd():
    a = _spd(4, (2,))
    check(torch.linalg.eigvalsh, a)
    check(lambda a: torch.linalg.eigvalsh(a, UPLO="U"), a)
    # eigenvectors are unique up to sign: compare |V| and the reconstruction
    w, v = torch.linalg.eigh(a.to("tpu"))
    torch.testing.assert_close(v.abs().cpu(), torch.linalg.eigh(a)[1].abs(), **TOL)
    torch.testing.assert_close((v @ torch.diag_embed(w) @ v.mT).cpu(), a, **TOL)
    m = torch.randn(5, 3, dtype=torch.float64)
    check(torch.linalg.svdvals, m)
    for full in (False, True):
        u, s, vh = torch.linalg.svd(m.to("tpu"), full_matrices=full)
        ru, rs, rvh = torch.linalg.svd(m, full_matrices=full)
        assert u.shape == ru.shape and vh.shape == rvh.shape
        torch.testing.assert_close(s.cpu(), rs, **TOL)
        torch.testing.assert_close((u[:, :3] * s) @ vh[:3], m.to("tpu"), **TOL)


def _eigh_rebuilt(a):
    w, v = torch.linalg.eigh(a)
    return (v * w[..., None, :]) @ v.mT


def _svd_rebuilt(m):
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    return (u * s[..., None, :]) @ vh


def test_eigh_and_svd_grads_of_reconstruction():
    # a sign-invariant function of the singular/eigen vectors has a well-defined gradient
    check(_eigh_rebuilt, _spd(3))
    check(_svd_rebuilt, torch.randn(4, 3, dtype=torch.float64))


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_solve_triangular(upper, left, unit):
    a = torch.randn(2, 4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    a = a.triu() if upper else a.tril()
    b = torch.randn(2, 4, 3, dtype=torch.float64) if left else torch.randn(2, 3, 4, dtype=torch.float64)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), a, b)


def test_triangular_solve_legacy():
    a = torch.randn(4, 4, dtype=torch.float64).tril() + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(4, 2, dtype=torch.float64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(lambda b, a: torch.triangular_solve(b, a, upper=False), b, a)
        check(lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True), b, a)


def test_empty_matrices():
    e = torch.zeros(0, 0)
    check(torch.linalg.det, e, grad=False)
    check(torch.linalg.slogdet, e, grad=False)
    check(torch.linalg.inv, e, grad=False)
    check(lambda a: torch.linalg.cholesky(a, upper=True), e, grad=False)
    check(torch.linalg.cholesky_ex, torch.zeros(3, 0, 0), grad=False)


def test_matrix_exp():
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    check(torch.linalg.matrix_exp, a)
    check(torch.linalg.matrix_exp, torch.randn(3, 3) * 0.5)
    check(torch.linalg.matrix_exp, torch.randn(2, 1, 1))  # a 1x1 matrix is exp


def test_matrix_exp_float32_as_accurate_as_cpu():
    """float32 matrices whose norms need 0 to 5 squarings: over the set, the largest error
    relative to the result (off the exact float64 result) is within twice CPU's. Both run
    Taylor degree 18 with scaling and squaring, whose rounding differs matrix by matrix;
    the worst case over 40 matrices measures the method. A Pade approximant of lower
    degree (scipy's expm in float32) is off by ten times CPU's."""
    gen = torch.Generator().manual_seed(3)
    a = torch.cat([torch.randn(8, 5, 5, generator=gen) * s for s in (0.1, 1.0, 3.0, 6.0, 9.0)])
    exact = torch.linalg.matrix_exp(a.double())
    size = exact.abs().amax(dim=(-2, -1))

    def worst(result):
        return ((result.double() - exact).abs().amax(dim=(-2, -1)) / size).max().item()

    assert worst(torch.linalg.matrix_exp(a.to("tpu")).cpu()) <= 2 * worst(torch.linalg.matrix_exp(a))



def _squarings(a):
    """How many times scaling and squaring squares: the float32 1-norm threshold of degree 18."""
    norm = a.double().abs().sum(-2).amax(-1)
    return torch.ceil(torch.log2(norm / 3.010066362817634)).clamp(min=0)


def _matrix_exp_bound(a):
    """Per matrix, the float32 error of scaling and squaring, relative to its largest entry.

    Each of the s squarings doubles the relative error it receives and adds one product's
    rounding (a dot product of n terms: n u, u = 2^-24); the degree-18 polynomial adds
    about as much as a product. So the error is within 2^s * 2n * u of the largest entry.
    It is normwise, not per entry: the result's entries span five orders of magnitude at
    these norms, and a small one carries the absolute error of the large ones.
    """
    return 2 ** _squarings(a) * 2 * a.shape[-1] * 2.0**-24


def test_matrix_exp_float32_within_scaling_and_squaring_rounding():
    """OpInfo's samples (entries uniform in [-9, 9], 5x5: norms near 27, 3 or 4 squarings).
    CPU and tpu both run degree 18 with scaling and squaring; what they differ by is
    product rounding amplified by the squarings, within the bound above for each."""
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(64, 5, 5, generator=gen) * 18 - 9
    exact = torch.linalg.matrix_exp(a.double())
    size = exact.abs().amax(dim=(-2, -1))
    bound = _matrix_exp_bound(a)
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    off = (got.double() - exact).abs().amax(dim=(-2, -1)) / size
    assert (off <= bound).all(), (off / bound).max()
    # so tpu and CPU (also within its bound) agree to twice the bound, not per entry
    cpu_off = (got.double() - torch.linalg.matrix_exp(a).double()).abs().amax(dim=(-2, -1)) / size
    assert (cpu_off <= 2 * bound).all(), (cpu_off / bound).max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matrix_exp_half_dtypes_round_the_float32_result(dtype):
    """Half dtypes compute in float32 and round once: each entry is within half a unit in
    the last place of its exact value (2^-8 relative for bfloat16, 2^-11 for float16) plus
    the float32 bound. (PyTorch's CPU kernel returns NaN here: it reads its float64
    coefficient table as the half dtype, so the reference is float64.)"""
    gen = torch.Generator().manual_seed(1)
    a = (torch.rand(8, 5, 5, generator=gen) * 6 - 3).to(dtype)
    exact = torch.linalg.matrix_exp(a.double())
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert got.dtype == dtype
    half_ulp = torch.finfo(dtype).eps / 2
    budget = half_ulp * exact.abs() + (_matrix_exp_bound(a) * exact.abs().amax(dim=(-2, -1)))[:, None, None]
    assert ((got.double() - exact).abs() <= budget).all()


def test_householder_product():
    a = torch.randn(2, 6, 4, dtype=torch.float64)
    tau = torch.rand(2, 3, dtype=torch.float64)
    check(torch.linalg.householder_product, a, tau)
    geqrf_a, geqrf_tau = torch.geqrf(torch.randn(5, 5, dtype=torch.float64))
    check(torch.linalg.householder_product, geqrf_a, geqrf_tau, grad=False)


def test_eig():
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    check(torch.linalg.eig, a, grad=False)
    check(torch.linalg.eigvals, a, grad=False)


@pytest.mark.parametrize(
    "driver, shape",
    [(d, (5, 3)) for d in (None, "gels", "gelsy", "gelsd", "gelss")]
    + [(d, s) for d in ("gels", "gelsd") for s in ((3, 5), (4, 4))],
)
def test_lstsq(driver, shape):
    a = torch.randn(2, *shape, dtype=torch.float64)
    b = torch.randn(2, shape[0], 2, dtype=torch.float64)
    if driver == "gels" and shape[0] < shape[1]:
        # the minimum-norm solution of a wide system: compare it, not LAPACK's workspace
        check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver).solution, a, b, grad=False)
        return
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), a, b, grad=False)


def test_lstsq_rank_deficient():
    a = torch.randn(5, 3, dtype=torch.float64)
    a[:, 2] = a[:, 1]
    b = torch.randn(5, 2, dtype=torch.float64)
    check(lambda a, b: torch.linalg.lstsq(a, b), a, b, grad=False)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"), a, b, grad=False)


def test_cross_bfloat16_rounds_like_pytorch():
    a = torch.tensor([[-2.40625, 3.125, 5.78125]]).bfloat16()
    b = torch.tensor([[5.125, -1.0, -4.96875]]).bfloat16()
    check(torch.linalg.cross, a, b, grad=False, tol={"rtol": 0, "atol": 0})


def test_cross_and_trace():
    check(torch.linalg.cross, torch.randn(4, 3), torch.randn(4, 3))
    check(torch.linalg.cross, torch.randn(1, 3), torch.randn(5, 3))
    check(lambda a, b: torch.cross(a, b, dim=0), torch.randn(3, 4), torch.randn(3, 4))
    check(torch.trace, torch.randn(4, 5))
    check(torch.trace, torch.randint(0, 9, (3, 3), dtype=torch.int32), grad=False)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_ldl_factor_and_solve(n):
    """Bunch-Kaufman pivoting chooses the same 1x1 and 2x2 blocks as LAPACK's sytf2 (the
    pivots are integers, compared exactly); a zero (0, 0) entry forces a 2x2 block or an
    interchange. float64 keeps the comparison of the factors at rounding level."""
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(2, n, n, dtype=torch.float64, generator=gen)
    a = a + a.mT
    if n > 1:
        a[0, 0, 0] = 0.0
    b = torch.randn(2, n, 3, dtype=torch.float64, generator=gen)
    ld, piv, info = torch.linalg.ldl_factor_ex(a)
    ld_t, piv_t, info_t = torch.linalg.ldl_factor_ex(a.to("tpu"))
    torch.testing.assert_close(ld_t.cpu(), ld, rtol=1e-10, atol=1e-12)
    assert torch.equal(piv_t.cpu(), piv) and torch.equal(info_t.cpu(), info)
    ld2, piv2 = torch.linalg.ldl_factor(a.to("tpu"))
    x = torch.linalg.ldl_solve(ld2, piv2, b.to("tpu"))
    torch.testing.assert_close(x.cpu(), torch.linalg.ldl_solve(ld, piv, b), rtol=1e-9, atol=1e-10)


def test_ldl_factor_singular_reports_info():
    a = torch.zeros(3, 3)
    a[2, 2] = 1.0
    ld, piv, info = torch.linalg.ldl_factor_ex(a.to("tpu"))
    ld_c, piv_c, info_c = torch.linalg.ldl_factor_ex(a)
    assert info.item() == info_c.item() == 1
    assert torch.equal(piv.cpu(), piv_c)


@pytest.mark.parametrize("call", [
    lambda a, b, bias: a @ b,
    lambda a, b, bias: torch.mm(a, b),
    lambda a, b, bias: torch.matmul(a[None], b),
    lambda a, b, bias: torch.addmm(bias, a, b),
    lambda a, b, bias: torch.mm(a[0], b),
    lambda a, b, bias: torch.addmm(bias, a, b[0]),
])
def test_a_product_refused_as_on_cpu(call):
    """The shapes' refusal is PyTorch's CPU message (not its meta kernel's wording)."""
    a, b, bias = torch.randn(4, 8), torch.randn(5, 3), torch.randn(3)
    with pytest.raises(RuntimeError) as cpu:
        call(a, b, bias)
    with pytest.raises(RuntimeError) as tpu:
        call(a.to("tpu"), b.to("tpu"), bias.to("tpu"))
    assert str(tpu.value) == str(cpu.value)
