"""Matrix products and linear algebra: mm/bmm/addmm, factorizations, solves, pairwise
distances.

Float32 products follow the float32 matmul precision in effect
(``torch.get_float32_matmul_precision()``, or ``torch.tpu.precision`` when set),
read when an op is traced: "highest" -> ``Precision.HIGHEST``, "high" ->
``HIGH``, "medium" -> ``DEFAULT`` (on a TPU, one bf16 pass). Half-precision
inputs accumulate in float32, as PyTorch does; integer products stay integer.
With ``config.numerics == "tpu"`` float32 products run in bfloat16 passes as a
TPU computes them at that precision, on any backend (``tpu_product``), so CPU
runs reproduce a TPU's drift. A lowering that reads the precision this way is
registered with ``precision=True``: eager mode keys its executables by the
setting, and only those recompile when it changes.

Factorizations return what PyTorch's kernels return, including the auxiliary
outputs its backward formulas read: LU factors with 1-based int32 pivots, and
``info`` codes. ``_linalg_det``/``_linalg_slogdet`` return the LU of ``A^T``,
which is what PyTorch's CPU kernel returns for a contiguous ``A`` (and what
its backward then assumes).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.config import config
from tpu_debug.runtime.ops._checks import cpp_type, require, scalar_type
from tpu_debug.runtime.ops._common import HALF, compute_dtype, is_array, promote, round_to
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten

__all__ = ["dot_general", "matmul_precision", "tpu_passes", "tpu_product"]

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}


def matmul_precision() -> lax.Precision:
    """The JAX precision matching the float32 product precision in effect now
    (``torch.get_float32_matmul_precision()``, or ``torch.tpu.precision`` when set)."""
    return _PRECISION.get(config.effective_precision(), lax.Precision.HIGHEST)


def _to_result_dtype(*arrays):
    """Cast arrays to PyTorch's result dtype (``promote`` would give the float32
    computation dtype for half inputs, which a product must not take)."""
    _, res = compute_dtype(*arrays)
    return tuple(a.astype(res) if is_array(a) and a.dtype != res else a for a in arrays)


def _product_args(*arrays):
    """(arrays in the result dtype, kwargs for a JAX product) by PyTorch's rules."""
    arrays = _to_result_dtype(*arrays)
    dt = arrays[0].dtype
    if jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_:
        return arrays, {}
    kw = {"precision": matmul_precision()}
    if dt in HALF:
        kw["preferred_element_type"] = jnp.float32
    return arrays, kw


def dot_general(fn, *arrays):
    """``fn(*arrays, **kw)`` with PyTorch's promotion, precision and accumulation."""
    arrays, kw = _product_args(*arrays)
    passes = tpu_passes(*arrays)
    if passes:
        return tpu_product(lambda a, b: fn(a, b, precision=lax.Precision.HIGHEST), *arrays, passes=passes)
    return fn(*arrays, **kw)


# ---- TPU numerics -------------------------------------------------------------------------
# With ``config.numerics == "tpu"`` a float32 product runs as a TPU's matrix unit
# runs it: operands rounded to bfloat16 (``reduce_precision`` to 8 exponent and
# 7 mantissa bits: XLA keeps it, where it may fold a convert pair away), exact
# products, float32 sums. One pass at precision "medium" (XLA's DEFAULT), three
# (bf16_3x: high and low bfloat16 parts) at "high", plain float32 at "highest".
# Gradients taken with jax.vjp (convolution_backward) round their operands the
# same way, as the TPU's own backward products would.


def tpu_passes(*arrays) -> int:
    """bfloat16 passes for a product of ``arrays`` now: 0 unless TPU numerics apply to it."""
    if len(arrays) != 2 or any(not is_array(a) or a.dtype != jnp.float32 for a in arrays):
        return 0
    return config.product_passes()


def _bf16(x):
    return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _bf16_passes(fn, a, b, passes):
    a_hi, b_hi = _bf16(a), _bf16(b)
    if passes == 1:
        return fn(a_hi, b_hi)
    a_lo, b_lo = _bf16(a - a_hi), _bf16(b - b_hi)
    return fn(a_hi, b_lo) + fn(a_lo, b_hi) + fn(a_hi, b_hi)


def tpu_product(fn, a, b, *, passes: int):
    """``fn(a, b)`` (bilinear, float32) computed in ``passes`` bfloat16 passes, gradients too."""

    @jax.custom_vjp
    def product(a, b):
        return _bf16_passes(fn, a, b, passes)

    def fwd(a, b):
        return product(a, b), (a, b)

    def bwd(res, ct):
        a0, b0 = res

        def wrt_a(c, b_):
            return jax.linear_transpose(lambda a_: fn(a_, b_), a0)(c)[0]

        def wrt_b(a_, c):
            return jax.linear_transpose(lambda b_: fn(a_, b_), b0)(c)[0]

        return _bf16_passes(wrt_a, ct, b0, passes), _bf16_passes(wrt_b, a0, ct, passes)

    product.defvjp(fwd, bwd)
    return product(a, b)


def _scaled(product, self, *, beta, alpha):
    if jnp.issubdtype(product.dtype, jnp.integer):
        # integer products take alpha/beta converted to the integer type (0.6 -> 0)
        alpha, beta = int(alpha), int(beta)
    elif product.dtype == jnp.bool_:
        alpha, beta = bool(alpha), bool(beta)
    # beta == 0 ignores self entirely (NaN/inf in self do not propagate)
    out = product if alpha == 1 else product * alpha
    if beta == 0:
        return out
    self = self.astype(out.dtype)
    return out + (self if beta == 1 else self * beta)


# ---- products ------------------------------------------------------------------


# PyTorch's CPU kernels refuse products of two dtypes (float32 by int64) where XLA's dot
# would promote; each family words it its own way


def _shapes_multiply(a, b) -> None:
    if a.shape[1] != b.shape[0]:  # the message is made only when it is raised: mm is on every step's path
        require(False, f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                f"{b.shape[0]}x{b.shape[1]})")


def _check_mm(x, y, **_out):
    # CPU's order: each a matrix, their shapes, then their dtypes
    require(x.dim() == 2, "self must be a matrix")
    require(y.dim() == 2, "mat2 must be a matrix")
    _shapes_multiply(x, y)
    require(x.dtype == y.dtype, "expected m1 and m2 to have the same dtype, but got: "
            f"{cpp_type(x.dtype)} != {cpp_type(y.dtype)}")


def _check_batched(first, *others, **_kwargs):
    """bmm, baddbmm: every tensor of the first's dtype."""
    for t in others:
        if isinstance(t, torch.Tensor):
            require(t.dtype == first.dtype, f"expected scalar type {scalar_type(first.dtype)} but found "
                    f"{scalar_type(t.dtype)}")


def _check_addmm(self, a, b, **_kwargs):
    require(a.dtype == b.dtype, f"mat1 and mat2 must have the same dtype, but got {scalar_type(a.dtype)} and "
            f"{scalar_type(b.dtype)}")
    require(self.dtype == b.dtype, f"self and mat2 must have the same dtype, but got {scalar_type(self.dtype)} "
            f"and {scalar_type(b.dtype)}")
    require(a.dim() == 2, f"mat1 must be a matrix, got {a.dim()}-D tensor")
    require(b.dim() == 2, f"mat2 must be a matrix, got {b.dim()}-D tensor")
    _shapes_multiply(a, b)


def _addmv_message(self_dtype, mat, vec) -> None:
    require(self_dtype == mat.dtype == vec.dtype, "addmv input tensors must have the same dtype, but got "
            f"{scalar_type(self_dtype)}, {scalar_type(mat.dtype)}, and {scalar_type(vec.dtype)}")


def _check_addmv(self, mat, vec, **_kwargs):
    _addmv_message(self.dtype, mat, vec)


def _check_mv(mat, vec, **_out):
    _addmv_message(vec.dtype, mat, vec)  # mv is addmv into a buffer of vec's dtype


def _check_dot(x, y, **_out):
    require(x.dtype == y.dtype, f"dot : expected both vectors to have same dtype, but found "
            f"{scalar_type(x.dtype)} and {scalar_type(y.dtype)}")


@lower(aten.bmm.default, precision=True, check=_check_batched)
@lower(aten.mm.default, precision=True, check=_check_mm)
def mm(x, y):
    return dot_general(jnp.matmul, x, y)


@lower(aten.mm.dtype, aten.bmm.dtype, precision=True)
def mm_dtype(x, y, out_dtype):
    return mm(x, y)  # half inputs already accumulate in float32; the result is cast to out_dtype


def _grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``_grouped_mm``'s output, with PyTorch's argument checks but any float dtype: its
    own meta kernel takes bfloat16 only (the CUDA kernel's dtype), and its CPU kernel any.
    No stride alignment is required: XLA has no such rule."""
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and mat_b.dim()={mat_b.dim()}")
    torch._check(mat_a.dtype == mat_b.dtype, lambda: f"expected mat_a and mat_b to have the same dtype, "
                 f"but got: {mat_a.dtype} != {mat_b.dtype}")
    torch._check(mat_a.dtype.is_floating_point, lambda: f"grouped mm needs floating inputs, got {mat_a.dtype}")
    torch._check(mat_a.size(-1) == mat_b.size(-2) or (mat_a.dim() == 2 and mat_b.dim() == 2),
                 lambda: "contraction dimension of mat_a and mat_b must match")
    batched = mat_a.dim() == 3 and mat_b.dim() == 3
    torch._check((offs is None) == batched, lambda: "Have to provide offsets if there is a 2d matrix, "
                 "or no offset if both matrices are 3d")
    torch._check(bias is None, lambda: "Bias not supported yet")
    torch._check(out_dtype is None or out_dtype == mat_a.dtype,
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if offs is not None:
        torch._check(offs.dim() == 1 and offs.dtype == torch.int32, lambda: "Offsets have to be int32")
    if batched:
        torch._check(mat_a.size(0) == mat_b.size(0), lambda: "batched dimension has to match")
        size = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    elif mat_a.dim() == 2 and mat_b.dim() == 2:
        torch._check(mat_a.size(1) == mat_b.size(0), lambda: "contraction dimension of mat_a and mat_b must match")
        size = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif mat_a.dim() == 2:
        torch._check(offs.size(0) == mat_b.size(0), lambda: "matrix batch sizes have to match")
        size = (mat_a.size(0), mat_b.size(-1))
    else:
        torch._check(offs.size(0) == mat_a.size(0), lambda: "matrix batch sizes have to match")
        size = (mat_a.size(1), mat_b.size(1))
    return mat_a.new_empty(size)


def _ragged_dot(ragged: int, group: tuple):
    """A ``lax.ragged_dot_general`` with ``lhs`` dim ``ragged`` in groups; ``group``: the
    group dimension of ``rhs``, if any (a contracting ragged dim gives the output one)."""
    contract_lhs = 1 if ragged == 0 else ragged
    numbers = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((contract_lhs,), (1 if group else 0,)), ((), ())),
        lhs_ragged_dimensions=(ragged,), rhs_group_dimensions=group,
    )

    def product(a, b, sizes, **kw):
        return lax.ragged_dot_general(a, b, sizes, numbers, **kw)

    return product


@lower(aten._grouped_mm.default, precision=True, meta=_grouped_mm_meta)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """One matrix product per group (a mixture-of-experts layer's experts), as
    ``lax.ragged_dot_general``, which XLA's TPU compiler lowers to a grouped kernel.

    ``offs`` holds each group's end along the dim that is grouped: the rows of a 2-D
    ``a`` against the matrices of a 3-D ``b``; the columns of a 2-D ``b`` against the
    matrices of a 3-D ``a``; the contraction of two 2-D operands (one output matrix
    per group). Two 3-D operands are a batched product. Rows past ``offs[-1]`` are
    zeros (PyTorch leaves them unwritten). Half inputs accumulate in float32: their
    products are exact in float32, so they run as float32 products (XLA's CPU backend
    has no bfloat16 x bfloat16 -> float32 ragged dot)."""
    dtype = a.dtype
    if dtype in HALF:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if a.ndim == 3 and b.ndim == 3:
        return dot_general(jnp.matmul, a, b).astype(dtype)
    ends = offs.astype(jnp.int32)
    sizes = jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))
    if a.ndim == 2 and b.ndim == 3:
        out = dot_general(lambda x, y, **kw: _ragged_dot(0, (0,))(x, y, sizes, **kw), a, b)
    elif a.ndim == 3:  # the columns of b in groups: the same product, transposed
        out = dot_general(lambda x, y, **kw: _ragged_dot(0, (0,))(x, y, sizes, **kw),
                          b.T, jnp.swapaxes(a, 1, 2)).T
    else:
        out = dot_general(lambda x, y, **kw: _ragged_dot(1, ())(x, y, sizes, **kw), a, b)
    return out.astype(dtype)


@lower(aten.addmv.default, precision=True, check=_check_addmv)
@lower(aten.baddbmm.default, precision=True, check=_check_batched)
@lower(aten.addmm.default, precision=True, check=_check_addmm)
def addmm(self, a, b, *, beta=1, alpha=1):
    return _scaled(dot_general(jnp.matmul, a, b), self, beta=beta, alpha=alpha)


@lower(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    _, dtype = compute_dtype(self, vec1, vec2)
    self, vec1, vec2 = promote(self, vec1, vec2)
    shape = (vec1.shape[0], vec2.shape[0])
    if vec1.dtype == jnp.bool_:
        out = (vec1[:, None] & vec2[None, :]) & bool(alpha)
        return jnp.broadcast_to(out | (self & bool(beta)), shape)
    if jnp.issubdtype(vec1.dtype, jnp.integer):
        alpha, beta = int(alpha), int(beta)
    # CPU's order of operations, each step rounded to the dtype (XLA would otherwise keep a
    # fused bfloat16 chain in float32): alpha * vec1 * vec2 + beta * self
    ignore_self = beta == 0  # self ignored entirely (NaN/inf in it do not propagate)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        step = round_to(dtype)
        self, vec1, vec2 = (a.astype(jnp.float32) for a in (self, vec1, vec2))
    else:
        def step(v):
            return v

    alpha, beta = step(jnp.asarray(alpha, vec1.dtype)), step(jnp.asarray(beta, vec1.dtype))
    out = step(step(alpha * vec1)[:, None] * vec2[None, :])
    if not ignore_self:
        out = step(out + step(beta * self))
    return jnp.broadcast_to(out, shape).astype(dtype)


@lower(aten.addmm.dtype, aten.baddbmm.dtype, precision=True)
def addmm_dtype(self, a, b, out_dtype, *, beta=1, alpha=1):
    return addmm(self.astype(jnp.float32), a, b, beta=beta, alpha=alpha)


@lower(aten.addbmm.default, precision=True)
def addbmm(self, b1, b2, *, beta=1, alpha=1):
    self, b1, b2 = _to_result_dtype(self, b1, b2)
    if b1.dtype not in HALF or b1.shape[0] == 0:
        product = jnp.sum(dot_general(jnp.matmul, b1, b2), axis=0)
        return _scaled(product, self, beta=beta, alpha=alpha)
    # half dtypes: PyTorch runs one addmm_ per batch, rounding to the half dtype
    # each time; the same roundings give the same result
    first = _scaled(dot_general(jnp.matmul, b1[0], b2[0]), self, beta=beta, alpha=alpha).astype(b1.dtype)

    def step(i, acc):
        return _scaled(dot_general(jnp.matmul, b1[i], b2[i]), acc, beta=1, alpha=alpha).astype(b1.dtype)

    return lax.fori_loop(1, b1.shape[0], step, first)


@lower(aten.dot.default, precision=True, check=_check_dot)
@lower(aten.mv.default, precision=True, check=_check_mv)
def mv(x, y):
    return dot_general(jnp.matmul, x, y)


@lower(aten.vdot.default, precision=True)
def vdot(x, y):
    return dot_general(jnp.matmul, jnp.conj(x), y)


@lower(aten.trace.default)
def trace(x):
    d = jnp.diagonal(x)
    if jnp.issubdtype(d.dtype, jnp.integer) or d.dtype == jnp.bool_:
        d = d.astype(jnp.int64)
    return jnp.sum(d)


@lower(aten.linalg_cross.default)
def linalg_cross(x, y, *, dim=-1):
    x, y = _to_result_dtype(x, y)
    shape = jnp.broadcast_shapes(x.shape, y.shape)
    x, y = jnp.broadcast_to(x, shape), jnp.broadcast_to(y, shape)
    dtype = x.dtype
    # PyTorch rounds every product and difference to a half dtype. XLA's CPU
    # backend computes half arithmetic in float32 without those roundings (and
    # drops a reduce_precision on a half value as a no-op), so compute in
    # float32 and round explicitly
    rnd = _rounder(dtype)
    if dtype in HALF:
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    a = [jnp.take(x, i, axis=dim) for i in range(3)]
    b = [jnp.take(y, i, axis=dim) for i in range(3)]
    out = [
        rnd(rnd(a[(i + 1) % 3] * b[(i + 2) % 3]) - rnd(a[(i + 2) % 3] * b[(i + 1) % 3]))
        for i in range(3)
    ]
    return jnp.stack(out, axis=dim).astype(dtype)


def _rounder(dtype):
    return round_to(dtype) if dtype in HALF else (lambda v: v)


@lower(aten._trilinear.default, graph_only=True)  # eagerly: PyTorch's composite (bmm rounding)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``bilinear``'s kernel: each input gains size-1 dims at its ``expand`` positions, the
    three are multiplied (broadcasting) and summed over ``sumdim``."""

    def expanded(x, dims):
        for d in sorted(dims):
            x = jnp.expand_dims(x, d)
        return x

    prod = expanded(i1, expand1) * expanded(i2, expand2) * expanded(i3, expand3)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod


# ---- LU and what is built on it ------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _lu(a):
    """(LU, 1-based int32 pivots, permutation, info) of ``a``, PyTorch's layout."""
    lu, pivots, perm = lax.linalg.lu(a)
    return lu, pivots.astype(jnp.int32) + 1, perm, _diag_info(lu)


def _diag_info(factor):
    # LAPACK getrf's info: 1-based index of the first exactly-zero pivot, 0 if none
    return _first_true(jnp.diagonal(factor, axis1=-2, axis2=-1) == 0)


def _first_true(bad):
    if bad.shape[-1] == 0:
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    first = jnp.argmax(bad, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(bad, axis=-1), first, jnp.zeros((), jnp.int32))


def _not_pd_order(a):
    """LAPACK potrf's info: the order of the first leading minor that is not
    positive-definite (0 if none). Leading minor k is PD iff the first k pivots
    of Gaussian elimination without pivoting are positive (Sylvester)."""
    n = a.shape[-1]
    if n == 0:
        return jnp.zeros(a.shape[:-2], jnp.int32)
    inner = jnp.arange(n)

    def eliminate(k, m):
        pivot = m[..., k, k]
        col = m[..., :, k] / pivot[..., None]
        row = m[..., k, :]
        below = inner > k
        return m - jnp.where(below[:, None] & below[None, :], col[..., :, None] * row[..., None, :], 0)

    reduced = lax.fori_loop(0, n, eliminate, jnp.tril(a) + _mH(jnp.tril(a, -1)))
    pivots = jnp.real(jnp.diagonal(reduced, axis1=-2, axis2=-1))
    return _first_true(~(pivots > 0))


def _batch_broadcast(a, b):
    """Broadcast the batch dims of two stacks of matrices against each other."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _tri_solve(a, b, *, lower_, left=True, transpose=False, conjugate=False, unit=False):
    a, b = _batch_broadcast(a, b)
    return lax.linalg.triangular_solve(
        a, b, left_side=left, lower=lower_, transpose_a=transpose,
        conjugate_a=conjugate and jnp.iscomplexobj(a), unit_diagonal=unit,
    )


def _permutation(pivots, m):
    return lax.linalg.lu_pivots_to_permutation(pivots - 1, m)


def _lu_solve(lu, perm, b, *, adjoint=False):
    """Solve ``A X = b`` (or ``A^H X = b``) from ``P^T A = L U`` (``A[perm] = L U``)."""
    lu, b = _batch_broadcast(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = _tri_solve(lu, pb, lower_=True, unit=True)
        return _tri_solve(lu, y, lower_=False)
    y = _tri_solve(lu, b, lower_=False, transpose=True, conjugate=True)
    z = _tri_solve(lu, y, lower_=True, transpose=True, conjugate=True, unit=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inv[..., :, None], axis=-2)


def _lu_solve_sided(lu, perm, b, *, left, adjoint):
    if left:
        return _lu_solve(lu, perm, b, adjoint=adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mH(_lu_solve(lu, perm, _mH(b), adjoint=not adjoint))


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    _require_pivot(pivot)
    lu, pivots, _perm, info = _lu(a)
    return lu, pivots, info


def _require_pivot(pivot):
    if not pivot:
        raise NoLoweringError(
            "LU without pivoting (pivot=False) is not supported on tpu, as on CPU; use pivot=True"
        )


@lower(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    _require_pivot(pivot)
    lu, _pivots, perm, _info = _lu(a)
    return _unpack(lu, perm, a.shape[-2], a.shape[-1])


def _unpack(lu, perm, m, n):
    k = min(m, n)
    eye = jnp.eye(m, dtype=lu.dtype)
    # A[perm] = L U  =>  A = P L U with P = I[perm]^T
    p = _mT(eye[perm])
    lower_ = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return p, lower_, upper


@lower(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2], lu.shape[-1]
    perm = _permutation(pivots, m)
    p, lower_, upper = _unpack(lu, perm, m, n)
    empty = jnp.zeros((0,), lu.dtype)
    return (p if unpack_pivots else empty, lower_ if unpack_data else empty, upper if unpack_data else empty)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    lu, b = promote(lu, b)
    perm = _permutation(pivots, lu.shape[-1])
    return _lu_solve_sided(lu, perm, b, left=left, adjoint=adjoint)


def _is_vector_rhs(a, b) -> bool:
    # PyTorch's rule (linalg_solve_is_vector_rhs)
    return b.ndim == 1 or (a.ndim - 1 == b.ndim and b.shape == a.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    a, b = promote(a, b)
    vector = _is_vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    lu, pivots, perm, info = _lu(a)
    x = _lu_solve_sided(lu, perm, rhs, left=left, adjoint=False)
    return (x[..., 0] if vector else x), lu, pivots, info


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    lu, _pivots, perm, info = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, perm, eye), info


def _det_parts(a):
    # the LU of A^T, as PyTorch's CPU kernel returns for a contiguous A
    lu, pivots, _perm, _info = _lu(_mT(a))
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(diag.dtype)
    return lu, pivots, diag, parity


@lower(aten._linalg_det.default)
def linalg_det(a):
    lu, pivots, diag, parity = _det_parts(a)
    return parity * jnp.prod(diag, axis=-1), lu, pivots


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    lu, pivots, diag, parity = _det_parts(a)
    absdiag = jnp.abs(diag)
    logabs = jnp.sum(jnp.log(absdiag), axis=-1)
    if jnp.iscomplexobj(diag):
        phase = jnp.prod(diag / absdiag.astype(diag.dtype), axis=-1)
        sign = parity * jnp.where(jnp.any(absdiag == 0, axis=-1), 0, phase)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    return sign, logabs, lu, pivots


# ---- LDL^T (Bunch-Kaufman) ------------------------------------------------------------
# LAPACK's unblocked sytf2/sytrs with UPLO = 'L', which PyTorch's CPU kernel calls: L
# unit lower triangular below D's 1x1 and 2x2 diagonal blocks, 1-based pivots (a 2x2
# block's two entries both -p), the row interchanges applied to the trailing matrix
# only. Real matrices; "hermitian" is the same factorization for them.

_BK_ALPHA = (1 + math.sqrt(17.0)) / 8  # Bunch-Kaufman's pivot threshold


def _ldl_factor_one(a):
    n = a.shape[-1]
    rows = jnp.arange(n)[:, None]
    cols = jnp.arange(n)[None, :]
    alpha = jnp.asarray(_BK_ALPHA, a.dtype)

    def step(state):
        a, piv, info, k = state
        col = jnp.abs(a[:, k])
        absakk = col[k]
        below = jnp.where(rows[:, 0] > k, col, -1)
        imax = jnp.argmax(below)  # the first largest, as IDAMAX
        colmax = jnp.maximum(below[imax], 0)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        row_part = jnp.where((cols[0] >= k) & (cols[0] < imax), jnp.abs(a[imax, :]), -1)
        col_part = jnp.where(rows[:, 0] > imax, jnp.abs(a[:, imax]), -1)
        rowmax = jnp.maximum(jnp.max(row_part), jnp.max(col_part))
        keep = zero | (absakk >= alpha * colmax) | (absakk * rowmax >= alpha * colmax * colmax)
        one_by_one = keep | (jnp.abs(a[imax, imax]) >= alpha * rowmax)
        kp = jnp.where(keep, k, imax)
        kstep = jnp.where(one_by_one, 1, 2)
        kk = k + kstep - 1
        # interchange rows and columns kk and kp of the trailing matrix (lower triangle)
        trailing = (rows >= k) & (cols >= k)
        full = jnp.where(trailing & (rows >= cols), a, 0)
        full = full + jnp.where(trailing & (rows > cols), a, 0).T
        perm = jnp.where(jnp.arange(n) == kk, kp, jnp.where(jnp.arange(n) == kp, kk, jnp.arange(n)))
        swapped = full[perm][:, perm]
        a = jnp.where(trailing & (rows >= cols), swapped, a)
        # eliminate the pivot block's columns from the trailing matrix
        after1 = (rows > k) & (cols > k) & (rows >= cols)
        x = jnp.where(rows[:, 0] > k, a[:, k], 0)
        d11 = 1 / jnp.where(zero, 1, a[k, k])
        update1 = jnp.where(after1, a + x[:, None] * (-d11 * x)[None, :], a)
        update1 = update1.at[:, k].set(jnp.where(rows[:, 0] > k, x * d11, update1[:, k]))
        k1 = jnp.minimum(k + 1, n - 1)
        d21 = a[k1, k]
        e11 = a[k1, k1] / d21
        e22 = a[k, k] / d21
        t = 1 / (e11 * e22 - 1)
        d21 = t / d21
        tail = rows[:, 0] > k + 1
        wk = jnp.where(tail, d21 * (e11 * a[:, k] - a[:, k1]), 0)
        wkp1 = jnp.where(tail, d21 * (e22 * a[:, k1] - a[:, k]), 0)
        after2 = (rows > k + 1) & (cols > k + 1) & (rows >= cols)
        update2 = jnp.where(after2, a - (a[:, k][:, None] * wk[None, :] + a[:, k1][:, None] * wkp1[None, :]), a)
        update2 = update2.at[:, k].set(jnp.where(tail, wk, update2[:, k]))
        update2 = update2.at[:, k1].set(jnp.where(tail, wkp1, update2[:, k1]))
        a = jnp.where(zero, a, jnp.where(kstep == 1, update1, update2))
        p = (kp + 1).astype(jnp.int32)
        piv = jnp.where(kstep == 1, piv.at[k].set(p), piv.at[k].set(-p).at[k1].set(-p))
        info = jnp.where(zero & (info == 0), k + 1, info).astype(jnp.int32)
        return a, piv, info, k + kstep

    state = (a, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    a, piv, info, _ = lax.while_loop(lambda s: s[3] < n, step, state)
    return jnp.tril(a), piv, info


@lower(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    if jnp.iscomplexobj(a):
        raise NoLoweringError(f"linalg.ldl_factor has no tpu lowering for complex matrices ({a.dtype}); run it on CPU")
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    return _batched(_ldl_factor_one, a)


def _ldl_solve_one(ld, piv, b):
    n = ld.shape[-1]
    rows = jnp.arange(n)

    def swap(b, i, j):
        perm = jnp.where(rows == i, j, jnp.where(rows == j, i, rows))
        return b[perm]

    def forward(state):  # L D X = B, first block to last
        b, k = state
        p = piv[k]
        two = p < 0
        k1 = jnp.minimum(k + 1, n - 1)
        b = swap(b, jnp.where(two, k1, k), jnp.abs(p) - 1)
        one_b = b - jnp.where((rows > k)[:, None], ld[:, k][:, None] * b[k][None, :], 0)
        one_b = one_b.at[k].set(one_b[k] / ld[k, k])
        tail = (rows > k + 1)[:, None]
        two_b = b - jnp.where(tail, ld[:, k][:, None] * b[k][None, :], 0)
        two_b = two_b - jnp.where(tail, ld[:, k1][:, None] * two_b[k1][None, :], 0)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / akm1k
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = two_b[k] / akm1k, two_b[k1] / akm1k
        two_b = two_b.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, two_b, one_b), k + jnp.where(two, 2, 1)

    def backward(state):  # L^T X = B, last block to first
        b, k = state
        p = piv[k]
        two = p < 0
        km1 = jnp.maximum(k - 1, 0)
        below = (rows > k)[:, None]
        b = b.at[k].add(-jnp.sum(jnp.where(below, ld[:, k][:, None] * b, 0), axis=0))
        b = b.at[km1].add(jnp.where(two, -jnp.sum(jnp.where(below, ld[:, km1][:, None] * b, 0), axis=0), 0))
        b = swap(b, k, jnp.abs(p) - 1)
        return b, k - jnp.where(two, 2, 1)

    b, _ = lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.zeros((), jnp.int32)))
    b, _ = lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.asarray(n - 1, jnp.int32)))
    return b


@lower(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False):
    if jnp.iscomplexobj(ld) or jnp.iscomplexobj(b):
        raise NoLoweringError(f"linalg.ldl_solve has no tpu lowering for complex matrices ({ld.dtype}); run it on CPU")
    batch = jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2])
    ld = jnp.broadcast_to(ld, batch + ld.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:]).astype(ld.dtype)
    if ld.shape[-1] == 0 or b.size == 0:
        return b
    solve = _ldl_solve_one
    for _ in batch:
        solve = jax.vmap(solve)
    return solve(ld, pivots.astype(jnp.int32), b)


# ---- Cholesky, QR, eigh, SVD -----------------------------------------------------


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    low = lax.linalg.cholesky(a, symmetrize_input=False)
    # XLA fills a failed factorization with NaN; only then find which minor failed
    info = lax.cond(
        jnp.any(jnp.isnan(low)),
        _not_pd_order,
        lambda m: jnp.zeros(m.shape[:-2], jnp.int32),
        a,
    )
    return (_mH(low) if upper else low), info


@lower(aten.cholesky.default)
def cholesky(a, upper=False):
    return linalg_cholesky_ex(a, upper=upper)[0]


@lower(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    b, factor = promote(b, factor)
    if upper:  # A = U^H U
        y = _tri_solve(factor, b, lower_=False, transpose=True, conjugate=True)
        return _tri_solve(factor, y, lower_=False)
    y = _tri_solve(factor, b, lower_=True)
    return _tri_solve(factor, y, lower_=True, transpose=True, conjugate=True)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return cholesky_solve(eye, factor, upper)


@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@lower(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    v, w = lax.linalg.eigh(a, lower=UPLO == "L", symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@lower(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), a.dtype)
        return empty, jnp.linalg.svd(a, compute_uv=False), empty
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


# ---- triangular solves -------------------------------------------------------------


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = promote(a, b)
    return _tri_solve(a, b, lower_=not upper, left=left, unit=unitriangular)


@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    b, a = promote(b, a)
    x = _tri_solve(a, b, lower_=not upper, transpose=transpose, unit=unitriangular)
    return x, jnp.broadcast_to(a, x.shape[:-2] + a.shape[-2:])


# ---- matrix functions, Householder products, eig, least squares -----------------------


def _batched(fn, a, core_dims=2):
    """Apply a single-matrix ``fn`` over the leading batch dims of ``a``."""
    batch = a.shape[:-core_dims]
    flat = a.reshape((-1,) + a.shape[-core_dims:]) if batch else a[None]
    out = jax.vmap(fn)(flat)
    return jax.tree_util.tree_map(lambda o: o.reshape(batch + o.shape[1:]), out)


# Bader, Blanes and Casas, "Computing the Matrix Exponential with an Optimized Taylor
# Polynomial Approximation" (Mathematics 7, 1174, 2019), the method PyTorch's kernel uses:
# the degree-18 polynomial from five products, whose coefficients (B_i = sum_j b_ij P_j
# over P = I, A, A^2, A^3, A^6) the paper gives, and the largest 1-norm it is accurate
# for in single and double precision.
_T18 = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)
_T18_THETA = {4: 3.010066362817634, 8: 1.090863719290036}  # by real itemsize


def _expm_taylor18(a):
    def mm(x, y):
        return jnp.matmul(x, y, precision=lax.Precision.HIGHEST)

    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    a2 = mm(a, a)
    a3 = mm(a2, a)
    powers = (eye, a, a2, a3, mm(a3, a3))
    b = [sum(c * p for c, p in zip(row, powers) if c) for row in _T18]
    a9 = mm(b[0], b[4]) + b[3]
    return b[1] + mm(b[2] + a9, a9)


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    """Scaling and squaring around a degree-18 Taylor polynomial, as PyTorch computes it
    (products at full float32 precision: PyTorch turns TF32 off here). PyTorch picks a
    lower degree for a single matrix of small norm; degree 18 on the scaled matrix is as
    accurate there. Above that norm the steps are PyTorch's (threshold, polynomial, scaling
    by 2^-s, s squarings), so a result differs from CPU's by product rounding only, which
    each squaring doubles: within 2^s n u of the matrix's largest entry, not of each entry.
    Half dtypes compute in float32 and round once (PyTorch's CPU kernel returns NaN for
    them: it reads its float64 coefficient table as the half dtype)."""
    n = a.shape[-1]
    if n == 0 or a.size == 0:
        return a
    x = a.astype(jnp.float32) if a.dtype in HALF else a
    if n == 1:
        return jnp.exp(x).astype(a.dtype)
    theta = _T18_THETA[jnp.finfo(x.dtype).bits // 8]
    norm = jnp.max(jnp.sum(jnp.abs(x), axis=-2), axis=-1)  # the operator 1-norm
    squarings = jnp.ceil(jnp.log2(norm / theta))
    squarings = jnp.where(jnp.isfinite(squarings), jnp.maximum(squarings, 0), 0).astype(jnp.int32)
    scale = jnp.exp2(squarings.astype(norm.dtype))[..., None, None]
    result = _expm_taylor18(x / scale.astype(x.dtype))

    def square(i, m):
        return jnp.where((i < squarings)[..., None, None], jnp.matmul(m, m, precision=lax.Precision.HIGHEST), m)

    return lax.fori_loop(0, jnp.max(squarings), square, result).astype(a.dtype)


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    """Q = H_1 ... H_k I[:, :n], H_i = I - tau_i v_i v_i^H (LAPACK orgqr)."""
    m, n, k = a.shape[-2], a.shape[-1], tau.shape[-1]
    rows = jnp.arange(m)
    q = jnp.broadcast_to(jnp.eye(m, n, dtype=a.dtype), a.shape)

    def apply(j, q):
        i = k - 1 - j  # H_k first: Q = H_1 (H_2 (... (H_k I)))
        col = jnp.take(a, i, axis=-1)
        v = jnp.where(rows > i, col, jnp.where(rows == i, jnp.ones((), a.dtype), jnp.zeros((), a.dtype)))
        t = jnp.take(tau, i, axis=-1)[..., None, None]
        vh_q = jnp.sum(jnp.conj(v)[..., :, None] * q, axis=-2, keepdims=True)
        return q - t * v[..., :, None] * vh_q

    return lax.fori_loop(0, k, apply, q) if k else q


def _geqrf_one(a):
    """LAPACK geqr2 on one real matrix: R above the diagonal, Householder vectors below, and tau."""
    m, n = a.shape
    k = min(m, n)
    rows, cols = jnp.arange(m), jnp.arange(n)

    def step(j, carry):
        a, tau = carry
        col = jnp.take(a, j, axis=1)
        alpha = col[j]
        xnorm = jnp.linalg.norm(jnp.where(rows > j, col, 0))
        nonzero = xnorm != 0
        beta = -jnp.copysign(jnp.hypot(alpha, xnorm), alpha)  # dlarfg
        t = jnp.where(nonzero, (beta - alpha) / beta, 0)
        scale = jnp.where(nonzero, 1 / jnp.where(nonzero, alpha - beta, 1), 0)
        v = jnp.where(rows > j, col * scale, jnp.where(rows == j, 1, 0)).astype(a.dtype)
        w = jnp.where(cols > j, v @ a, 0)
        a = a - t * v[:, None] * w[None, :]
        new_col = jnp.where(rows > j, v, jnp.where(rows == j, jnp.where(nonzero, beta, alpha), col))
        a = a.at[:, j].set(new_col.astype(a.dtype))
        return a, tau.at[j].set(t.astype(a.dtype))

    tau = jnp.zeros((k,), a.dtype)
    return lax.fori_loop(0, k, step, (a, tau)) if k else (a, tau)


@lower(aten.geqrf.default)
def geqrf(a):
    if jnp.iscomplexobj(a):
        raise NoLoweringError(f"geqrf has no tpu lowering for complex matrices ({a.dtype}); run it on CPU")
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2] + (min(a.shape[-2:]),), a.dtype)
    return _batched(_geqrf_one, a)


def _check_ormqr(a, tau, c, left=True, transpose=False, **_out):
    require(a.dim() >= 2, "torch.ormqr: input must have at least 2 dimensions.")
    require(c.dim() >= 2, "torch.ormqr: other must have at least 2 dimensions.")
    side = -2 if left else -1
    require(tau.shape[-1] == min(c.shape[side], a.shape[-1]),
            "torch.ormqr: tau.shape[-1] must be equal to min(other.shape[-2], input.shape[-1])")
    require(c.shape[side] == a.shape[-2], f"torch.ormqr: other.shape[{side}] must be equal to input.shape[-2]")


@lower(aten.ormqr.default, check=_check_ormqr)
def ormqr(a, tau, c, left=True, transpose=False):
    """C times Q (or Q^T) from the left or right, Q = H_1 ... H_k as geqrf stores it (real)."""
    if jnp.iscomplexobj(a):
        raise NoLoweringError(f"ormqr has no tpu lowering for complex matrices ({a.dtype}); run it on CPU")
    k = tau.shape[-1]
    m = a.shape[-2]
    rows = jnp.arange(m)
    # Q C = H_1 (... (H_k C)); Q^T C = H_k (... (H_1 C)); C Q = ((C H_1) ...) H_k; C Q^T = ((C H_k) ...) H_1
    forward = left == transpose

    def apply(j, c):
        i = j if forward else k - 1 - j
        col = jnp.take(a, i, axis=-1)
        v = jnp.where(rows > i, col, jnp.where(rows == i, 1, 0)).astype(c.dtype)
        t = jnp.take(tau, i, axis=-1)[..., None, None]
        if left:
            return c - t * v[..., :, None] * jnp.sum(v[..., :, None] * c, axis=-2, keepdims=True)
        return c - t * jnp.sum(c * v[..., None, :], axis=-1, keepdims=True) * v[..., None, :]

    return lax.fori_loop(0, k, apply, c) if k else c


def _eig(a):
    if jax.default_backend() != "cpu":
        raise NoLoweringError(
            f"linalg.eig on tpu needs XLA's CPU backend (this runtime is on {jax.default_backend()}); "
            "move the matrix to CPU for eig, or use linalg.eigh for symmetric matrices"
        )
    return jnp.linalg.eig(a)


@lower(aten.linalg_eig.default)
def linalg_eig(a):
    w, v = _eig(a)
    return w, v


@lower(aten._linalg_eigvals.default)
def linalg_eigvals(a):
    return _eig(a)[0]


def _lstsq_eager(args, kwargs):
    # gelsd/gelss return residuals only when every matrix has full rank: a
    # shape that depends on the values
    driver = kwargs.get("driver")
    a = args[0]
    return driver in ("gelsd", "gelss") and a.shape[-2] > a.shape[-1]


def _check_lstsq(a, b, *args, **_kwargs):
    require(a.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.")
    require(b.dim() >= 1, "torch.linalg.lstsq: other must have at least 1 dimension.")


@lower(aten.linalg_lstsq.default, eager_only=_lstsq_eager, check=_check_lstsq)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    driver = driver or "gelsy"  # PyTorch's CPU default
    a, b = _to_result_dtype(a, b)
    m, n = a.shape[-2], a.shape[-1]
    a, b = _batch_broadcast(a, b)
    real = jnp.finfo(a.dtype).dtype
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    cutoff = rcond * jnp.max(s, axis=-1, keepdims=True, initial=0)
    keep = s > cutoff
    rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    if driver == "gels":
        x = _qr_lstsq(a, b)
    else:
        inv_s = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
        x = _mH(vh) @ (inv_s[..., :, None] * (_mH(u) @ b))
    empty_real = jnp.zeros((0,), real)
    residuals = empty_real
    if m > n and (driver == "gels" or (driver in ("gelsd", "gelss") and bool(jnp.all(rank == n)))):
        residuals = jnp.sum(jnp.abs(a @ x - b) ** 2, axis=-2)
    rank_out = rank if driver != "gels" else jnp.zeros((0,), jnp.int64)
    sv = s if driver in ("gelsd", "gelss") else empty_real
    return x, residuals, rank_out, sv


def _qr_lstsq(a, b):
    # gels: QR for tall (m >= n), LQ (QR of A^H) for wide matrices; assumes full rank
    m, n = a.shape[-2], a.shape[-1]
    if m >= n:
        q, r = jnp.linalg.qr(a)
        return _tri_solve(r, _mH(q) @ b, lower_=False)
    q, r = jnp.linalg.qr(_mH(a))
    y = _tri_solve(r, b, lower_=False, transpose=True, conjugate=True)
    return q @ y


@lower(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, atol=None, rtol=None, hermitian=False):
    """PyTorch's pseudo-inverse: singular values (eigenvalues' magnitudes if ``hermitian``)
    at or below max(atol, rtol * largest) count as zero; rtol defaults to eps * max(m, n)
    when atol is absent or zero."""
    m, n = a.shape[-2], a.shape[-1]
    real = jnp.finfo(a.dtype).dtype if jnp.iscomplexobj(a) else a.dtype
    atol_v = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    if rtol is None:
        eps_rtol = jnp.finfo(real).eps * max(m, n)
        rtol_v = jnp.where(atol_v > 0, jnp.zeros((), real), eps_rtol) if atol is not None else jnp.asarray(eps_rtol, real)
    else:
        rtol_v = jnp.asarray(rtol, real)
    if hermitian:
        w, v = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)  # PyTorch reads the lower triangle only
        big = jnp.max(jnp.abs(w), axis=-1, keepdims=True, initial=0.0)
        tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * big)
        inv = jnp.where(jnp.abs(w) > tol, 1.0 / jnp.where(w == 0, 1, w), 0).astype(a.dtype)
        return (v * inv[..., None, :]) @ jnp.conj(jnp.swapaxes(v, -1, -2))
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    big = jnp.max(s, axis=-1, keepdims=True, initial=0.0)
    tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * big)
    inv = jnp.where(s > tol, 1.0 / jnp.where(s == 0, 1, s), 0).astype(a.dtype)
    return jnp.conj(jnp.swapaxes(vh, -1, -2)) @ (inv[..., :, None] * jnp.conj(jnp.swapaxes(u, -1, -2)))


# ---- distances ----------------------------------------------------------------------------


def _p_norm_of_diff(diff, p):
    """PyTorch's direct cdist/pdist reduction of |x_i - y_j| over the last axis."""
    ad = jnp.abs(diff)
    if p == 0:
        return jnp.sum((ad != 0).astype(diff.dtype), axis=-1)
    if p == 1:
        return jnp.sum(ad, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(ad * ad, axis=-1))
    if math.isinf(p):
        return jnp.max(ad, axis=-1, initial=0.0)
    return jnp.power(jnp.sum(jnp.power(ad, p), axis=-1), 1.0 / p)


def _euclidean_mm(x1, x2):
    # PyTorch's _euclidean_dist: one matmul on padded operands, clamped, square-rooted
    x1_norm = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    x2_norm = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    x1_ = jnp.concatenate([x1 * -2.0, x1_norm, jnp.ones_like(x1_norm)], axis=-1)
    x2_ = jnp.concatenate([x2, jnp.ones_like(x2_norm), x2_norm], axis=-1)
    result = jnp.matmul(x1_, jnp.swapaxes(x2_, -1, -2), precision=lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.maximum(result, 1e-30))


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    x1, x2 = promote(x1, x2)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))) and x1.shape[-1] > 0:
        batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
        x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
        x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
        return _euclidean_mm(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return _p_norm_of_diff(diff, p)


@lower(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    n = x.shape[0]
    i, j = jnp.triu_indices(n, k=1)
    return _p_norm_of_diff(x[i] - x[j], p)
