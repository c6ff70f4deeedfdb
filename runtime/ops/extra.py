"""Ops no op family covers: FFT, special functions, distances, a few activations, the rarer
random fills (issue 7).

Special functions that JAX lacks follow PyTorch's own CPU algorithms
(``ATen/native/Math.h``, Cephes coefficients), evaluated in the input's float
dtype as PyTorch does (float32 stays float32; bfloat16 computes in float32), so
results agree with PyTorch's to rounding. Where ``jax.scipy.special`` has the
function, it is used, wrapped in PyTorch's edge-case conventions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.scipy import special as jsp
from tpu_debug.runtime.ops._common import Kind, compute_dtype, is_array, promote
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _float(*xs):
    """PyTorch's promotion to a float dtype; half types compute in float32 (its opmath)."""
    xs = promote(*xs, kind=Kind.INT_TO_FLOAT)
    return tuple(x.astype(jnp.float32) if is_array(x) and x.dtype in _HALF else x for x in xs)


def _horner(coeffs, z):
    acc = jnp.zeros_like(z)
    for c in coeffs:
        acc = acc * z + c
    return acc


def _chbevl(y, coeffs):
    # Cephes' Chebyshev series, in the loop form Math.h writes it: returns (a, p)
    p = jnp.zeros_like(y)
    q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + c
    return a, p


# ---- FFT (aten's three primitives; torch.fft.* decompose to them) ----------------------


def _fft_scale(y, n, normalization):
    # aten fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n
    if normalization == 1:
        return y / jnp.sqrt(jnp.asarray(n, y.real.dtype))
    if normalization == 2:
        return y / jnp.asarray(n, y.real.dtype)
    return y


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    (x,) = _float(x)
    n = math.prod(x.shape[d] for d in dim)
    y = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(x.astype(jnp.result_type(x, 1j)), axes=dim)
    return _fft_scale(y, n, normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")  # "forward": the inverse unscaled
    return _fft_scale(y, math.prod(sizes), normalization)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    if not dim:
        return x
    y = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _fft_scale(y, math.prod(x.shape[d] for d in dim), normalization)


@lower(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@lower(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(x):
    return jnp.conj(x)


# ---- special functions with a JAX counterpart -------------------------------------------


def _unary(name, fn):
    def lowering(x):
        (x,) = _float(x)
        return fn(x)

    lowering.__name__ = name
    return lowering


for _op, _fn in (
    (aten.special_i0e.default, jsp.i0e),
    (aten.special_i1.default, jsp.i1),
    (aten.special_i1e.default, jsp.i1e),
    (aten.special_ndtri.default, jsp.ndtri),
    (aten.special_log_ndtr.default, jsp.log_ndtr),
    (aten.special_erfcx.default, jsp.erfcx),
):
    lower(_op)(_unary(_op._schema.name.split("::")[1], _fn))


@lower(aten.special_entr.default)
def special_entr(x):
    (x,) = _float(x)
    safe = jnp.where(x > 0, x, 1)
    return jnp.where(jnp.isnan(x), x, jnp.where(x > 0, -x * jnp.log(safe), jnp.where(x == 0, 0.0, -jnp.inf)))


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(x, y):
    x, y = _float(x, y)
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log(y)))


@lower(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar)
def special_xlog1py(x, y):
    x, y = _float(x, y)
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log1p(y)))


_MACHEP = 1.11022302462515654042e-16
_ZETA_A = (
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18,
)


def _zeta(x, q):
    """Math.h's Hurwitz zeta: direct sum until q + i > 9, then Euler-Maclaurin.

    JAX's ``zeta`` is wrong for negative non-integer ``q``; PyTorch accumulates in
    double, so this does too where the runtime has float64.
    """
    out_dtype = x.dtype
    acc = jax.dtypes.canonicalize_dtype(jnp.float64)
    x, q = x.astype(acc), q.astype(acc)
    s0 = jnp.power(q, -x)

    def cond(st):
        return jnp.any(st[-1])

    def body(st):
        i, a, b, s, active = st
        i2, a2 = i + 1, a + 1.0
        b2 = jnp.power(a2, -x)
        s2 = s + b2
        converged = (-_MACHEP * s2 < b2) & (b2 < _MACHEP * s2)
        keep_going = ((i2 < 9) | (a2 <= 9.0)) & ~converged
        pick = lambda new, old: jnp.where(active, new, old)
        return pick(i2, i), pick(a2, a), pick(b2, b), pick(s2, s), active & keep_going

    zero = jnp.zeros_like(s0)
    start = (jnp.zeros(s0.shape, jnp.int32), q, zero, s0, jnp.ones(s0.shape, bool))
    i, a, b, s, _ = lax.while_loop(cond, body, start)
    # elements that converged in the direct sum stop there
    direct_done = (-_MACHEP * s < b) & (b < _MACHEP * s) & (i > 0)
    w = a
    tail = s + b * w / (x - 1.0) - 0.5 * b
    am, k, done, total = jnp.ones_like(s), jnp.zeros_like(s), direct_done, jnp.where(direct_done, s, tail)
    for coeff in _ZETA_A:
        am = am * (x + k)
        b = b / w
        t = am * b / coeff
        total = jnp.where(done, total, total + t)
        done = done | (jnp.abs(t / total) < _MACHEP)
        k = k + 1.0
        am = am * (x + k)
        b = b / w
        k = k + 1.0
    value = jnp.where(
        (q <= 0) & (q == jnp.floor(q)), jnp.inf,
        jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, total))
    value = jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, value))
    return value.astype(out_dtype)


@lower(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def special_zeta(x, q):
    x, q = _float(x, q)
    x, q = jnp.broadcast_arrays(x, q)
    return _zeta(x, q)


_PSI_10 = 2.25175258906672110764
_DIGAMMA_A = (
    8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
    -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)


def _digamma(x):
    """Math.h's calc_digamma: reflection below 0, recurrence up to 10, asymptotic series."""
    r = x - jnp.trunc(x)
    reflect = x < 0
    pi_over_tan = math.pi / jnp.tan(math.pi * r)
    y = jnp.where(reflect, 1.0 - x, x)
    result = jnp.zeros_like(y)
    for _ in range(10):  # y >= 1e-45 reaches 10 within ten steps... or is already >= 10
        low = y < 10
        result = jnp.where(low, result - 1.0 / y, result)
        y = jnp.where(low, y + 1.0, y)
    z = 1.0 / (y * y)
    series = jnp.where(y < 1.0e17, z * _horner(_DIGAMMA_A, z), 0.0)
    out = jnp.where(y == 10, result + _PSI_10, result + jnp.log(y) - 0.5 / y - series)
    out = jnp.where(reflect, out - pi_over_tan, out)
    out = jnp.where(reflect & (x == jnp.trunc(x)), jnp.nan, out)
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), out)


def _trigamma(x):
    """Math.h's trigamma (float)."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    result = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), 0.0)
    y = jnp.where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (y * y)
        y = y + 1.0
    ixx = 1.0 / (y * y)
    result = result + (1.0 + 1.0 / (2.0 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return jnp.where(reflect, -result, result)


@lower(aten.polygamma.default)
def polygamma(n, x):
    (x,) = _float(x)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.exp(math.lgamma(n + 1.0)) * _zeta(jnp.full_like(x, n + 1.0), x)


@lower(aten.polygamma_.default)
def polygamma_inplace(x, n):
    # its own lowering: polygamma_ takes (self, n), the functional polygamma takes (n, self)
    return polygamma(n, x)


def _igamma_edges(a, x, value, *, upper: bool):
    # PyTorch's calc_igamma / calc_igammac conventions around JAX's gammainc
    nan = jnp.nan
    lower_ = jnp.where(
        (a < 0) | (x < 0), nan,
        jnp.where(a == 0, jnp.where(x > 0, 1.0, nan),
                  jnp.where(x == 0, 0.0,
                            jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, 0.0),
                                      jnp.where(jnp.isinf(x), 1.0, value)))))
    if not upper:
        return lower_
    return jnp.where(
        (a < 0) | (x < 0), nan,
        jnp.where(a == 0, jnp.where(x > 0, 0.0, nan),
                  jnp.where(x == 0, 1.0,
                            jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, 1.0),
                                      jnp.where(jnp.isinf(x), 0.0, value)))))


@lower(aten.igamma.default)
def igamma(a, x):
    a, x = _float(a, x)
    return _igamma_edges(a, x, jsp.gammainc(a, x), upper=False)


@lower(aten.igammac.default)
def igammac(a, x):
    a, x = _float(a, x)
    return _igamma_edges(a, x, jsp.gammaincc(a, x), upper=True)


@lower(aten.nextafter.default)
def nextafter(x, y):
    x, y = promote(x, y)
    return jnp.nextafter(x, y)


@lower(aten.frexp.Tensor)
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


@lower(aten.heaviside.default)
def heaviside(x, values):
    x, values = promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lower(aten.logaddexp.default)
def logaddexp(a, b):
    a, b = _float(a, b)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(a - b)))
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lower(aten.logaddexp2.default)
def logaddexp2(a, b):
    a, b = _float(a, b)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(a - b))) / math.log(2.0)
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


# ---- small pointwise ops no family covers -------------------------------------------------


@lower(aten.sinc.default)
def sinc(x):
    (x,) = _float(x)
    product = math.pi * x
    return jnp.where(x == 0, 1.0, jnp.sin(product) / jnp.where(x == 0, 1.0, product))


@lower(aten.signbit.default)
def signbit(x):
    if x.dtype == jnp.bool_:
        return jnp.zeros(x.shape, jnp.bool_)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x < 0
    return jnp.signbit(x)


@lower(aten.angle.default)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.arctan2(x.imag, x.real)
    (x,) = _float(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, math.pi, 0.0))


@lower(aten.polar.default)
def polar(abs_, angle_):
    abs_, angle_ = jnp.broadcast_arrays(abs_, angle_)
    return lax.complex(abs_ * jnp.cos(angle_), abs_ * jnp.sin(angle_))


@lower(aten.gcd.default)
def gcd(a, b):
    a, b = promote(a, b)
    return jnp.gcd(a, b)


@lower(aten.lcm.default)
def lcm(a, b):
    a, b = promote(a, b)
    g = jnp.gcd(a, b)
    return jnp.where(g == 0, 0, jnp.abs(a // jnp.where(g == 0, 1, g) * b))


def _shift_bits(dtype) -> int:
    return jnp.iinfo(dtype).bits


@lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
       aten.bitwise_left_shift.Scalar_Tensor)
def bitwise_left_shift(a, b):
    # PyTorch: a shift by a negative amount or by the bit width or more gives 0
    a, b = promote(a, b)
    a, b = jnp.asarray(a), jnp.asarray(b, jnp.asarray(a).dtype)
    bits = _shift_bits(a.dtype)
    bad = (b < 0) | (b >= bits)
    return jnp.where(bad, 0, jnp.left_shift(a, jnp.where(bad, 0, b)))


@lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor)
def bitwise_right_shift(a, b):
    # PyTorch: an out-of-range shift of a signed value fills with its sign, of an unsigned one gives 0
    a, b = promote(a, b)
    a, b = jnp.asarray(a), jnp.asarray(b, jnp.asarray(a).dtype)
    bits = _shift_bits(a.dtype)
    bad = (b < 0) | (b >= bits)
    full = jnp.right_shift(a, bits - 1) if jnp.issubdtype(a.dtype, jnp.signedinteger) else jnp.zeros_like(a)
    return jnp.where(bad, full, jnp.right_shift(a, jnp.where(bad, 0, b)))


# ---- distances (core ops) -------------------------------------------------------------------


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


# ---- segment reduction and hashing -------------------------------------------------------------


_SEGMENT_OPS = {
    "sum": (jnp.add, 0.0), "mean": (jnp.add, 0.0), "prod": (jnp.multiply, 1.0),
    "max": (jnp.maximum, -jnp.inf), "amax": (jnp.maximum, -jnp.inf),
    "min": (jnp.minimum, jnp.inf), "amin": (jnp.minimum, jnp.inf),
}


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Reduce consecutive segments of ``data`` along ``axis``, element by element in order.

    Like PyTorch's CPU kernel, each segment starts from ``initial`` (or the
    reduction's identity) and folds its elements in sequence in the data's
    dtype; "mean" then divides by the segment length (empty: ``initial``, else NaN).
    """
    if reduce not in _SEGMENT_OPS:
        raise NotImplementedError(f"segment_reduce: reduce={reduce!r} is not one of {sorted(_SEGMENT_OPS)}")
    fold, identity = _SEGMENT_OPS[reduce]
    axis = axis % data.ndim
    if offsets is None:
        zero = jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype)
        offsets = jnp.concatenate([zero, jnp.cumsum(lengths, axis=-1)], axis=-1)
    start, end = offsets[..., :-1], offsets[..., 1:]  # batch.. x S
    trail = (1,) * (data.ndim - axis - 1)
    out_shape = start.shape + data.shape[axis + 1 :]
    out = jnp.full(out_shape, identity if initial is None else initial, data.dtype)

    def step(j, out):
        x = jnp.expand_dims(lax.dynamic_index_in_dim(data, j, axis, keepdims=False), axis)
        inside = ((start <= j) & (j < end)).reshape(start.shape + trail)
        return jnp.where(inside, fold(out, x), out)

    out = lax.fori_loop(0, data.shape[axis], step, out)
    if reduce != "mean":
        return out
    count = (end - start).reshape(start.shape + trail).astype(data.dtype)
    mean = out / count
    return jnp.where(count == 0, jnp.asarray(initial, data.dtype), mean) if initial is not None else mean


@lower(aten.hash_tensor.default)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    # PyTorch: widen to the 64-bit float / integer type, bitcast to uint64, xor-reduce
    if jnp.issubdtype(x.dtype, jnp.floating):
        wide = x.astype(jnp.float64)
    else:
        wide = x.astype(jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    dims = tuple(range(x.ndim)) if not dim else tuple(d % max(x.ndim, 1) for d in dim)
    if x.ndim == 0:
        return bits
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, dims)
    if keepdim:
        out = jnp.expand_dims(out, dims)
    return out


# ---- activations no family covers ------------------------------------------------------------


@lower(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


@lower(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    zero = jnp.zeros((), x.dtype)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, zero))


@lower(aten.glu.default)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=dim)
    wide = x.dtype in _HALF
    if wide:  # PyTorch's opmath
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return a * (1.0 / (1.0 + jnp.exp(-b)))


# ---- histogram ---------------------------------------------------------------------------------


def _linspace(start, end, steps, dtype):
    # PyTorch's CPU linspace: the first half counts up from start, the second half down from end
    step = (end - start) / (steps - 1) if steps > 1 else jnp.zeros((), dtype)
    idx = jnp.arange(steps)
    up = start + step * idx.astype(dtype)
    down = end - step * (steps - 1 - idx).astype(dtype)
    return jnp.where(idx < steps // 2, up, down).astype(dtype)


def _histogram_counts(x, edges, weight, density):
    x = x.reshape(-1)
    nb = edges.shape[0] - 1
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    pos = jnp.searchsorted(edges, x, side="right") - 1
    pos = jnp.where(x == edges[-1], nb - 1, pos)  # the rightmost edge is inclusive
    inside = (x >= edges[0]) & (x <= edges[-1])
    hist = jnp.zeros((nb,), x.dtype).at[jnp.where(inside, pos, 0)].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


@lower(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = jnp.asarray(range[0], x.dtype), jnp.asarray(range[1], x.dtype)
    elif x.size:
        lo, hi = jnp.min(x), jnp.max(x)
    else:  # PyTorch: an empty input gets the range [0, 1]
        lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
    same = lo == hi  # PyTorch widens an empty range by 0.5 on each side
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return _histogram_counts(x, _linspace(lo, hi, bins + 1, x.dtype), weight, density)


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    return _histogram_counts(x, bins.astype(x.dtype), weight, density)


# ---- random fills no family covers ----------------------------------------------------------


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


@lower(aten.cauchy_.default, rng=True, mutates_returns=True)
def cauchy_(x, median=0.0, sigma=1.0, *, generator=None, key):
    v = median + sigma * jax.random.cauchy(key, x.shape, _float_dtype(x))
    return v, v


@lower(aten.log_normal_.default, rng=True, mutates_returns=True)
def log_normal_(x, mean=1.0, std=2.0, *, generator=None, key):
    v = jnp.exp(mean + std * jax.random.normal(key, x.shape, _float_dtype(x)))
    return v, v


@lower(aten.geometric_.default, rng=True, mutates_returns=True)
def geometric_(x, p, *, generator=None, key):
    u = jax.random.uniform(key, x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
    v = jnp.ceil(jnp.log(u) / math.log1p(-p)) if p < 1 else jnp.ones(x.shape, jnp.float32)
    return v, v


# ---- Cephes special functions, as PyTorch's Math.h computes them -----------------------------


_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_SQRT_2_PI = 0.797884560802865355879892119868763737
_2_PI = 0.636619772367581343075535053490057448


def _j0(x):
    c = _BESSEL_J0
    x = jnp.abs(x)
    xx = x * x
    small = jnp.where(
        x < 0.00001, 1.0 - xx / 4.0,
        (xx - 5.78318596294678452118e00) * (xx - 3.04712623436620863991e01)
        * _horner(c["RP"], xx) / _horner(c["RQ"], xx),
    )
    z = 25.0 / xx
    large = (
        _horner(c["PP"], z) / _horner(c["PQ"], z) * jnp.cos(x - _PI_4)
        - 5.0 / x * (_horner(c["QP"], z) / _horner(c["QQ"], z)) * jnp.sin(x - _PI_4)
    ) * _SQRT_2_PI / jnp.sqrt(x)
    return jnp.where(x <= 5.0, small, large)


def _j1(x):
    c = _BESSEL_J1
    sign = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    x = jnp.abs(x)
    xx = x * x
    small = _horner(c["RP"], xx) / _horner(c["RQ"], xx) * x * (xx - 1.46819706421238932572e01) * (
        xx - 4.92184563216946036703e01
    )
    z = 5.0 / x * (5.0 / x)
    large = (
        _horner(c["PP"], z) / _horner(c["PQ"], z) * jnp.cos(x - _3PI_4)
        - 5.0 / x * (_horner(c["QP"], z) / _horner(c["QQ"], z)) * jnp.sin(x - _3PI_4)
    ) * _SQRT_2_PI / jnp.sqrt(x)
    return sign * jnp.where(x <= 5.0, small, large)


def _y0(x):
    c = _BESSEL_Y0
    xx = x * x
    small = _horner(c["YP"], xx) / _horner(c["YQ"], xx) + _2_PI * jnp.log(x) * _j0(x)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    z = 25.0 / xx
    large = (
        _horner(c["PP"], z) / _horner(c["PQ"], z) * jnp.sin(x - _PI_4)
        + 5.0 / x * (_horner(c["QP"], z) / _horner(c["QQ"], z)) * jnp.cos(x - _PI_4)
    ) * _SQRT_2_PI / jnp.sqrt(x)
    return jnp.where(x <= 5.0, small, large)


def _y1(x):
    c = _BESSEL_Y1
    xx = x * x
    small = x * (_horner(c["YP"], xx) / _horner(c["YQ"], xx)) + _2_PI * (_j1(x) * jnp.log(x) - 1.0 / x)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    z = 5.0 / x * (5.0 / x)
    large = (
        _horner(c["PP"], z) / _horner(c["PQ"], z) * jnp.sin(x - _3PI_4)
        + 5.0 / x * (_horner(c["QP"], z) / _horner(c["QQ"], z)) * jnp.cos(x - _3PI_4)
    ) * _SQRT_2_PI / jnp.sqrt(x)
    return jnp.where(x <= 5.0, small, large)


def _i0(x):
    c = _MODIFIED_BESSEL_I0
    ax = jnp.abs(x)
    a, p = _chbevl(ax / 2.0 - 2.0, c["A"])
    b, pb = _chbevl(32.0 / ax - 2.0, c["B"])
    return jnp.where(ax <= 8.0, jnp.exp(ax) * (0.5 * (a - p)), jnp.exp(ax) * (0.5 * (b - pb)) / jnp.sqrt(ax))


def _i1(x):
    c = _MODIFIED_BESSEL_I1
    ax = jnp.abs(x)
    a, p = _chbevl(ax / 2.0 - 2.0, c["A"])
    b, pb = _chbevl(32.0 / ax - 2.0, c["B"])
    out = jnp.where(ax <= 8.0, 0.5 * (a - p) * ax * jnp.exp(ax), jnp.exp(ax) * (0.5 * (b - pb)) / jnp.sqrt(ax))
    return jnp.where(x < 0, -out, out)


def _k_small_large(x, coeffs):
    a, p = _chbevl(x * x - 2.0, coeffs["A"])
    b, pb = _chbevl(8.0 / x - 2.0, coeffs["B"])
    return 0.5 * (a - p), 0.5 * (b - pb)


def _k_edges(x, value):
    return jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, value))


def _k0(x, *, scaled=False):
    small, large = _k_small_large(x, _MODIFIED_BESSEL_K0)
    small = small - jnp.log(0.5 * x) * _i0(x)
    if scaled:
        return _k_edges(x, jnp.where(x <= 2.0, small * jnp.exp(x), large / jnp.sqrt(x)))
    return _k_edges(x, jnp.where(x <= 2.0, small, jnp.exp(-x) * large / jnp.sqrt(x)))


def _k1(x, *, scaled=False):
    small, large = _k_small_large(x, _MODIFIED_BESSEL_K1)
    small = jnp.log(0.5 * x) * _i1(x) + small / x
    if scaled:
        return _k_edges(x, jnp.where(x <= 2.0, small * jnp.exp(x), large / jnp.sqrt(x)))
    return _k_edges(x, jnp.where(x <= 2.0, small, jnp.exp(-x) * large / jnp.sqrt(x)))


def _airy_ai(x):
    c = _AIRY_AI
    # x < -2.09: the asymptotic oscillating form
    neg = jnp.minimum(x, -2.09)
    zeta_n = -2.0 * neg * jnp.sqrt(-neg) / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    t = zeta_n + 0.25 * math.pi
    osc = 5.64189583547756286948e-01 / jnp.sqrt(jnp.sqrt(-neg)) * (
        jnp.sin(t) * (1.0 + zz * _horner(c["AFN"], zz) / _horner(c["AFD"], zz))
        - jnp.cos(t) * (z * _horner(c["AGN"], zz) / _horner(c["AGD"], zz))
    )
    # x >= 2.09: the asymptotic decaying form
    pos = jnp.maximum(x, 2.09)
    zeta = 2.0 * pos * jnp.sqrt(pos) / 3.0
    decay = 5.64189583547756286948e-01 * (_horner(c["AN"], 1.0 / zeta) / _horner(c["AD"], 1.0 / zeta)) / (
        2.0 * jnp.sqrt(jnp.sqrt(pos)) * jnp.exp(zeta)
    )
    # in between: the power series, iterated per element until it converges
    mid = (x >= -2.09) & (x < 2.09)
    xs = jnp.where(mid, x, 0.0)
    eps = jnp.finfo(x.dtype).eps
    one = jnp.ones_like(xs)
    cube = xs * xs * xs

    def cond(s):
        return jnp.any(s[-1])

    def body(s):
        f, g, k, m, n, t, active = s
        m2 = m * cube
        k2 = k + 1.0
        m2 = m2 / k2
        n2 = n * cube
        k2 = k2 + 1.0
        n2 = n2 / k2
        m2 = m2 / k2
        f2 = f + m2
        k2 = k2 + 1.0
        n2 = n2 / k2
        g2 = g + n2
        t2 = jnp.abs(m2 / f2)
        upd = [jnp.where(active, new, old) for new, old in ((f2, f), (g2, g), (k2, k), (m2, m), (n2, n), (t2, t))]
        return (*upd, active & (t2 > eps))

    f, g, *_ = lax.while_loop(cond, body, (one, xs, one, one, xs, one, mid))
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, osc, jnp.where(x >= 2.09, decay, series))
    return jnp.where(jnp.isinf(x), jnp.nan, jnp.where(x > 103.892, 0.0, out))


def _spherical_j0(x):
    xx = x * x
    series = 1.0 + xx * (-1.0 / 6.0 + xx * (1.0 / 120.0 + xx * (-1.0 / 5040.0 + xx * (
        1.0 / 362880.0 + xx * (-1.0 / 39916800.0 + xx * (1.0 / 6227020800.0))))))
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), 0.0, out)


for _op, _fn in (
    (aten.special_airy_ai.default, _airy_ai),
    (aten.special_bessel_j0.default, _j0),
    (aten.special_bessel_j1.default, _j1),
    (aten.special_bessel_y0.default, _y0),
    (aten.special_bessel_y1.default, _y1),
    (aten.special_modified_bessel_i0.default, _i0),
    (aten.special_modified_bessel_i1.default, _i1),
    (aten.special_modified_bessel_k0.default, _k0),
    (aten.special_modified_bessel_k1.default, _k1),
    (aten.special_scaled_modified_bessel_k0.default, lambda x: _k0(x, scaled=True)),
    (aten.special_scaled_modified_bessel_k1.default, lambda x: _k1(x, scaled=True)),
    (aten.special_spherical_bessel_j0.default, _spherical_j0),
):
    lower(_op)(_unary(_op._schema.name.split("::")[1], _fn))


# ---- orthogonal polynomials: Math.h's special cases and three-term recurrences ---------------


def _poly_args(x, n):
    """(x, n as int64 the way Math.h's static_cast<int64_t> truncates it, that n as float)."""
    comp, _ = compute_dtype(x, n, kind=Kind.INT_TO_FLOAT)
    x = jnp.asarray(x, comp)
    n = jnp.asarray(n)
    if jnp.issubdtype(n.dtype, jnp.integer) or n.dtype == jnp.bool_:
        ni = n.astype(jnp.int64)
    else:
        ni = jnp.where(jnp.isfinite(n), jnp.trunc(n), -1).astype(jnp.int64)
    x, ni = jnp.broadcast_arrays(x, ni)
    return x, ni, ni.astype(comp)


def _recur(x, ni, q0, k0, last, step):
    """Run ``r = step(k, p, q)`` for k = k0 .. while k <= last(n), per element; the final q."""
    p = jnp.ones_like(x)
    k_end = jnp.max(last(ni), initial=k0 - 1)

    def body(s):
        k, p, q = s
        r = step(k, p, q)
        active = k <= last(ni)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    _, _, q = lax.while_loop(lambda s: s[0] <= k_end, body, (jnp.asarray(k0, jnp.int64), p, q0))
    return q


def _even(ni):
    return ni % 2 == 0


def _sel(*pairs_and_default):
    *pairs, default = pairs_and_default
    out = default
    for cond, value in reversed(pairs):
        out = jnp.where(cond, value, out)
    return out


def _cheb_family(x, ni, nf, *, kind, shifted):
    """Chebyshev T/U/V/W, plain or shifted (argument 2x-1), as Math.h writes each."""
    y = x + x - 1.0 if shifted else x
    q0 = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    rec = _recur(x, ni, q0, 2, lambda n: n, lambda k, p, q: (y + y) * q - p)
    acos = jnp.arccos(jnp.clip(y, -1.0, 1.0))
    odd_sign = jnp.where(_even(ni), 1.0, -1.0)
    if kind == "t":
        trig = jnp.cos(nf * acos)
    elif kind == "u":
        s = jnp.sin(acos)
        trig = jnp.where(s != 0, jnp.sin((nf + 1) * acos) / s, (nf + 1) * jnp.cos((nf + 1) * acos) / y)
    elif kind == "v":
        trig = jnp.where(jnp.sin(acos / 2.0) != 1.0, jnp.cos((nf + 0.5) * acos) / jnp.cos(acos / 2.0),
                         odd_sign * (nf + nf + 1))
    else:
        fallback = (jnp.where(x > 0, nf + nf + 1, odd_sign) if not shifted else odd_sign)
        trig = jnp.where(jnp.cos(acos / 2.0) != 1.0, jnp.sin((nf + 0.5) * acos) / jnp.sin(acos / 2.0), fallback)
    limit = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else (4 if kind == "w" else 6)
    in_range = (ni > limit) & (jnp.abs(y) < 1.0)
    if shifted:
        at_one = {"t": 1.0, "u": nf + 1, "v": 1.0, "w": nf + nf + 1}[kind]
        at_zero = {"t": odd_sign, "u": odd_sign * (nf + 1), "v": odd_sign * (nf + nf + 1), "w": odd_sign}[kind]
        edges = [(x == 1.0, at_one), (x == 0.0, at_zero)]
    else:
        pos = {"t": 1.0, "u": nf + 1, "v": 1.0, "w": nf + nf + 1}[kind]
        neg = {"t": odd_sign, "u": odd_sign * (nf + 1), "v": odd_sign * (nf + nf + 1), "w": odd_sign}[kind]
        edges = [(jnp.abs(x) == 1.0, jnp.where(x > 0, pos, neg))]
    return _sel((ni < 0, 0.0), *edges, (in_range, trig), (ni == 0, 1.0), (ni == 1, q0), rec)


def _poly(kind, shifted=False):
    def lowering(x, n):
        x, ni, nf = _poly_args(x, n)
        return _cheb_family(x, ni, nf, kind=kind, shifted=shifted)

    return lowering


def _hermite_h(x, n):
    x, ni, _ = _poly_args(x, n)
    q0 = x + x
    rec = _recur(x, ni, q0, 1, lambda n: n - 1, lambda j, p, q: (x + x) * q - (j + j).astype(x.dtype) * p)
    return _sel((ni < 0, 0.0), (ni == 0, 1.0), (ni == 1, q0), (ni > 128, jnp.nan), rec)


def _hermite_he(x, n):
    x, ni, _ = _poly_args(x, n)
    rec = _recur(x, ni, x, 1, lambda n: n - 1, lambda k, p, q: x * q - k.astype(x.dtype) * p)
    return _sel((ni < 0, 0.0), (ni == 0, 1.0), (ni == 1, x), (ni > 128, jnp.nan), rec)


def _laguerre(x, n):
    x, ni, _ = _poly_args(x, n)
    q0 = 1.0 - x

    def step(k, p, q):
        kf = k.astype(x.dtype)
        return (((k + k).astype(x.dtype) + (1.0 - x)) * q - kf * p) / (k + 1).astype(x.dtype)

    rec = _recur(x, ni, q0, 1, lambda n: n - 1, step)
    return _sel((ni < 0, 0.0), (jnp.abs(x) == 0.0, 1.0), (ni == 0, 1.0), (ni == 1, q0), rec)


def _legendre(x, n):
    x, ni, _ = _poly_args(x, n)

    def step(k, p, q):
        return ((k + k + 1).astype(x.dtype) * x * q - k.astype(x.dtype) * p) / (k + 1).astype(x.dtype)

    rec = _recur(x, ni, x, 1, lambda n: n - 1, step)
    odd_sign = jnp.where(_even(ni), 1.0, -1.0)
    return _sel((ni < 0, 0.0), (jnp.abs(x) == 1.0, jnp.where(x > 0, 1.0, odd_sign)), (ni == 0, 1.0), (ni == 1, x), rec)


def _register_poly(name, fn):
    packet = getattr(aten, name)
    lower(packet.default, packet.x_scalar, packet.n_scalar)(fn)


for _name, _fn in (
    ("special_chebyshev_polynomial_t", _poly("t")),
    ("special_chebyshev_polynomial_u", _poly("u")),
    ("special_chebyshev_polynomial_v", _poly("v")),
    ("special_chebyshev_polynomial_w", _poly("w")),
    ("special_shifted_chebyshev_polynomial_t", _poly("t", shifted=True)),
    ("special_shifted_chebyshev_polynomial_u", _poly("u", shifted=True)),
    ("special_shifted_chebyshev_polynomial_v", _poly("v", shifted=True)),
    ("special_shifted_chebyshev_polynomial_w", _poly("w", shifted=True)),
    ("special_hermite_polynomial_h", _hermite_h),
    ("special_hermite_polynomial_he", _hermite_he),
    ("special_laguerre_polynomial_l", _laguerre),
    ("special_legendre_polynomial_p", _legendre),
):
    _fn.__name__ = _name
    _register_poly(_name, _fn)


# ---- Cephes coefficients (copied from PyTorch's ATen/native/Math.h) ----------------------------

_AIRY_AI = {
    "AN": (
        3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
        1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
        1.40264691163389668864e+01, 9.99999999999999995305e-01,
    ),
    "AD": (
        5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
        1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
        1.40959135607834029598e+01, 1.00000000000000000470e+00,
    ),
    "AFN": (
        -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
        -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
        -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08,
    ),
    "AFD": (
        1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
        9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
        4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07,
    ),
    "AGN": (
        1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
        9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
        5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
        8.11789239554389293311e-08, 3.41551784765923618484e-10,
    ),
    "AGD": (
        9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
        5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
        4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
        4.91834570062930015649e-09,
    ),
}
_BESSEL_J0 = {
    "PP": (
        7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
        5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
        9.99999999999999997821e-01,
    ),
    "PQ": (
        9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
        5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
        1.00000000000000000218e+00,
    ),
    "QP": (
        -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
        -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
        -5.14105326766599330220e+01, -6.05014350600728481186e+00,
    ),
    "QQ": (
        6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
        7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
        2.42005740240291393179e+02,
    ),
    "RP": (
        -4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
        9.70862251047306323952e+15,
    ),
    "RQ": (
        4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
        1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
        3.18121955943204943306e+16, 1.71086294081043136091e+18,
    ),
}
_BESSEL_J1 = {
    "PP": (
        7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
        5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
        1.00000000000000000254e+00,
    ),
    "PQ": (
        5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
        5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
        9.99999999999999997461e-01,
    ),
    "QP": (
        5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
        3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
        2.11688757100572135698e+02, 2.52070205858023719784e+01,
    ),
    "QQ": (
        7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
        9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
        3.36093607810698293419e+02,
    ),
    "RP": (
        -8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
        3.68295732863852883286e+15,
    ),
    "RQ": (
        6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
        2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
        8.95222336184627338078e+16, 5.32278620332680085395e+18,
    ),
}
_BESSEL_Y0 = {
    "PP": (
        7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
        5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
        9.99999999999999997821e-01,
    ),
    "PQ": (
        9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
        5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
        1.00000000000000000218e+00,
    ),
    "QP": (
        -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
        -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
        -5.14105326766599330220e+01, -6.05014350600728481186e+00,
    ),
    "QQ": (
        6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
        7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
        2.42005740240291393179e+02,
    ),
    "YP": (
        1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
        -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
        4.42733268572569800351e+16, -1.84950800436986690637e+16,
    ),
    "YQ": (
        1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
        8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
        2.50596256172653059228e+17,
    ),
}
_BESSEL_Y1 = {
    "PP": (
        7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
        5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
        1.00000000000000000254e+00,
    ),
    "PQ": (
        5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
        5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
        9.99999999999999997461e-01,
    ),
    "QP": (
        5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
        3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
        2.11688757100572135698e+02, 2.52070205858023719784e+01,
    ),
    "QQ": (
        7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
        9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
        3.36093607810698293419e+02,
    ),
    "YP": (
        1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
        -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17,
    ),
    "YQ": (
        5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
        1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
        6.87141087355300489866e+16, 3.97270608116560655612e+18,
    ),
}
_MODIFIED_BESSEL_I0 = {
    "A": (
        -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
        1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
        -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
        9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
        -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
        1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
        -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
        1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
        -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
        1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01,
    ),
    "B": (
        -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
        3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
        1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
        -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
        7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
        -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
        3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
        2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
        8.04490411014108831608e-01,
    ),
}
_MODIFIED_BESSEL_I1 = {
    "A": (
        2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
        -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
        3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
        -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
        9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
        -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
        4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
        -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
        2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
        -1.76416518357834055153e-01, 2.52587186443633654823e-01,
    ),
    "B": (
        7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
        -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
        -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
        4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
        -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
        3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
        -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
        -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
        7.78576235018280120474e-01,
    ),
}
_MODIFIED_BESSEL_K0 = {  # scaled_modified_bessel_k0 shares these
    "A": (
        1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
        1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
        1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
        -5.35327393233902768720e-01,
    ),
    "B": (
        5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
        -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
        6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
        -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
        1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
        -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
        2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
        -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
        2.44030308206595545468e+00,
    ),
}
_MODIFIED_BESSEL_K1 = {  # scaled_modified_bessel_k1 shares these
    "A": (
        -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
        -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
        -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
        -3.53155960776544875667e-01, 1.52530022733894777053e+00,
    ),
    "B": (
        -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
        1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
        -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
        3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
        -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
        2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
        -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
        1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
        2.72062619048444266945e+00,
    ),
}
