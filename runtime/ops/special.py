"""Special functions: Bessel, Airy, gamma-family (zeta, polygamma, igamma), error-function
relatives, ``xlogy``/``entr`` and the orthogonal polynomials of ``torch.special``.

Where ``jax.scipy.special`` has the function, it is used, wrapped in PyTorch's
edge-case conventions. Functions JAX lacks (or gets wrong, as ``zeta`` for a
negative non-integer ``q``) follow PyTorch's own CPU algorithms in
``ATen/native/Math.h`` with its Cephes coefficients (``_cephes.py``), evaluated
in the input's float dtype as PyTorch does (float32 stays float32; bfloat16
computes in float32), so results agree with PyTorch's to rounding.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.scipy import special as jsp

from tpu_debug.runtime.ops import _cephes
from tpu_debug.runtime.ops._common import Kind, compute_dtype, float_opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


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


# ---- functions JAX has, in PyTorch's conventions ------------------------------------------


def _unary(name, fn):
    def lowering(x):
        (x,) = float_opmath(x)
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


def _igamma_edges(a, x, value, *, upper: bool):
    """PyTorch's calc_igamma / calc_igammac edge cases around JAX's gammainc(c): NaN for
    negative arguments; a = 0 behaves as x = inf, a = inf as x = 0."""
    at_zero, at_inf = (1.0, 0.0) if upper else (0.0, 1.0)  # the value at x = 0 and at x = inf
    nan = jnp.nan
    return jnp.where(
        (a < 0) | (x < 0), nan,
        jnp.where(a == 0, jnp.where(x > 0, at_inf, nan),
                  jnp.where(x == 0, at_zero,
                            jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, at_zero),
                                      jnp.where(jnp.isinf(x), at_inf, value)))))


@lower(aten.igamma.default)
def igamma(a, x):
    a, x = float_opmath(a, x)
    return _igamma_edges(a, x, jsp.gammainc(a, x), upper=False)


@lower(aten.igammac.default)
def igammac(a, x):
    a, x = float_opmath(a, x)
    return _igamma_edges(a, x, jsp.gammaincc(a, x), upper=True)


# ---- xlogy, xlog1py and entropy -----------------------------------------------------------


@lower(aten.special_entr.default)
def special_entr(x):
    (x,) = float_opmath(x)
    safe = jnp.where(x > 0, x, 1)
    return jnp.where(jnp.isnan(x), x, jnp.where(x > 0, -x * jnp.log(safe), jnp.where(x == 0, 0.0, -jnp.inf)))


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(x, y):
    x, y = float_opmath(x, y)
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log(y)))


@lower(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar)
def special_xlog1py(x, y):
    x, y = float_opmath(x, y)
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log1p(y)))


# ---- zeta and polygamma, as Math.h computes them ------------------------------------------


_MACHEP = 1.11022302462515654042e-16


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
    for coeff in _cephes.ZETA_A:
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
    x, q = float_opmath(x, q)
    x, q = jnp.broadcast_arrays(x, q)
    return _zeta(x, q)


_PSI_10 = 2.25175258906672110764


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
    series = jnp.where(y < 1.0e17, z * _horner(_cephes.DIGAMMA_A, z), 0.0)
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
    (x,) = float_opmath(x)
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


# ---- Cephes special functions, as PyTorch's Math.h computes them --------------------------


_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_SQRT_2_PI = 0.797884560802865355879892119868763737
_2_PI = 0.636619772367581343075535053490057448


def _j0(x):
    c = _cephes.BESSEL_J0
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
    c = _cephes.BESSEL_J1
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
    c = _cephes.BESSEL_Y0
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
    c = _cephes.BESSEL_Y1
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
    c = _cephes.MODIFIED_BESSEL_I0
    ax = jnp.abs(x)
    a, p = _chbevl(ax / 2.0 - 2.0, c["A"])
    b, pb = _chbevl(32.0 / ax - 2.0, c["B"])
    return jnp.where(ax <= 8.0, jnp.exp(ax) * (0.5 * (a - p)), jnp.exp(ax) * (0.5 * (b - pb)) / jnp.sqrt(ax))


def _i1(x):
    c = _cephes.MODIFIED_BESSEL_I1
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
    small, large = _k_small_large(x, _cephes.MODIFIED_BESSEL_K0)
    small = small - jnp.log(0.5 * x) * _i0(x)
    if scaled:
        return _k_edges(x, jnp.where(x <= 2.0, small * jnp.exp(x), large / jnp.sqrt(x)))
    return _k_edges(x, jnp.where(x <= 2.0, small, jnp.exp(-x) * large / jnp.sqrt(x)))


def _k1(x, *, scaled=False):
    small, large = _k_small_large(x, _cephes.MODIFIED_BESSEL_K1)
    small = jnp.log(0.5 * x) * _i1(x) + small / x
    if scaled:
        return _k_edges(x, jnp.where(x <= 2.0, small * jnp.exp(x), large / jnp.sqrt(x)))
    return _k_edges(x, jnp.where(x <= 2.0, small, jnp.exp(-x) * large / jnp.sqrt(x)))


def _airy_ai(x):
    c = _cephes.AIRY_AI
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


# ---- orthogonal polynomials: Math.h's special cases and three-term recurrences ------------


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
