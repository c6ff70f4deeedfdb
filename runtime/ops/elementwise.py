"""Pointwise ops: arithmetic, comparisons, logic and bit operations, math functions,
complex numbers.

Operands are promoted by PyTorch's rules (``_common.promote``); math functions
compute integer inputs in the default float dtype. Activation functions are in
``activations.py``, special functions (Bessel, zeta, ``xlogy``, ...) in
``special.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.runtime.ops._checks import require, scalar_type
from tpu_debug.runtime.ops._common import Kind, compute_dtype, float_opmath, is_array, promote
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten
_INT_TO_FLOAT = Kind.INT_TO_FLOAT


# ---- arithmetic --------------------------------------------------------------


def _times_alpha(y, alpha):
    # a float alpha arrives traced (an executable input, so a new learning rate does not
    # recompile): comparing it with 1 would need its value
    return y if type(alpha) in (int, bool) and alpha == 1 else y * alpha


@lower(aten.add.Tensor, aten.add.Scalar)
def add(x, y, *, alpha=1):
    x, y = promote(x, y)
    return x + _times_alpha(y, alpha)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, *, alpha=1):
    x, y = promote(x, y)
    return x - _times_alpha(y, alpha)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, *, alpha=1):
    x, y = promote(x, y)
    return y - _times_alpha(x, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    x, y = promote(x, y)
    return x * y


@lower(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    x, y = promote(x, y, kind=_INT_TO_FLOAT)
    return x / y


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return div(x, y)
    comp, res = compute_dtype(x, y)
    tensor_divisor = is_array(y) and y.ndim > 0
    x, y = promote(x, y)
    if rounding_mode == "trunc":
        if jnp.issubdtype(comp, jnp.integer):
            x, y = jnp.broadcast_arrays(jnp.asarray(x, comp), jnp.asarray(y, comp))
            return lax.div(x, y)  # C division: rounds toward zero
        q = x / y
        if tensor_divisor:
            # PyTorch CPU rounds a bfloat16 quotient to bfloat16 before truncating it,
            # except with a scalar divisor, where it truncates the float32 quotient
            q = q.astype(res)
        return jnp.trunc(q)
    if jnp.issubdtype(comp, jnp.integer):
        return jnp.floor_divide(x, y)
    return _py_floor_div(x, y)


def _py_floor_div(x, y):
    # PyTorch's floor division for floats: floor((x - fmod(x, y)) / y) with a sign fix
    mod = jnp.fmod(x, y)
    div_ = (x - mod) / y
    div_ = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), div_ - 1, div_)
    floored = jnp.floor(div_)
    floored = jnp.where(div_ - floored > 0.5, floored + 1, floored)
    return jnp.where(y == 0, x / y, floored)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(x, y):
    return div_mode(x, y, rounding_mode="floor")


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(x, y):
    x, y = promote(x, y)
    return jnp.remainder(x, y)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    x, y = promote(x, y)
    return jnp.fmod(x, y)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(x, y):
    comp, _ = compute_dtype(x, y)
    if not is_array(y) and isinstance(y, (int, float)) and float(y) == 2.0:
        x = x.astype(comp) if is_array(x) else x
        return x * x
    x, y = promote(x, y)
    if jnp.issubdtype(comp, jnp.integer):
        return lax.integer_pow(x, int(y)) if not is_array(y) else _int_power(x, y)
    return jnp.power(x, y)


def _int_power(x, y):
    """PyTorch's integer pow: a negative exponent gives 0, except for bases 1 and -1."""
    x, y = jnp.broadcast_arrays(jnp.asarray(x, y.dtype if not is_array(x) else x.dtype), y)
    p = jnp.power(x, jnp.maximum(y, 0))
    one = jnp.ones_like(p)
    neg = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where(y % 2 == 0, one, -one), jnp.zeros_like(p)))
    return jnp.where(y < 0, neg, p)


@lower(aten.neg.default)
def neg(x):
    return -x


@lower(aten.abs.default)
def abs_(x):
    return jnp.abs(x)


@lower(aten.sign.default, aten.sgn.default)
def sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


@lower(aten.reciprocal.default)
def reciprocal(x):
    (x,) = promote(x, kind=_INT_TO_FLOAT)
    return 1 / x


@lower(aten.maximum.default)
def maximum(x, y):
    x, y = promote(x, y)
    return jnp.maximum(x, y)


@lower(aten.minimum.default)
def minimum(x, y):
    x, y = promote(x, y)
    return jnp.minimum(x, y)


@lower(aten.fmax.default)
def fmax(x, y):
    x, y = promote(x, y)
    return jnp.fmax(x, y)


@lower(aten.fmin.default)
def fmin(x, y):
    x, y = promote(x, y)
    return jnp.fmin(x, y)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    args = promote(x, *(v for v in (min, max) if v is not None))
    x = args[0]
    rest = list(args[1:])
    if min is not None:
        x = jnp.maximum(x, rest.pop(0))
    if max is not None:
        x = jnp.minimum(x, rest.pop(0))
    return x


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return clamp(x, min=min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return clamp(x, max=max)


@lower(aten.where.self)
def where(cond, x, y):
    x, y = promote(x, y)
    return jnp.where(cond, x, y)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    x, end, weight = promote(x, end, weight)
    return x + weight * (end - x)


@lower(aten.addcmul.default)
def addcmul(x, t1, t2, *, value=1):
    x, t1, t2 = promote(x, t1, t2)
    return x + value * t1 * t2


@lower(aten.addcdiv.default)
def addcdiv(x, t1, t2, *, value=1):
    x, t1, t2 = promote(x, t1, t2)
    return x + value * (t1 / t2)


# ---- comparisons, logic and bits ----------------------------------------------------------


def _compare(fn):
    def lowering(x, y):
        x, y = promote(x, y)
        return fn(x, y)

    lowering.__name__ = fn.__name__
    return lowering


for _name, _fn in (
    ("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less),
    ("le", jnp.less_equal), ("gt", jnp.greater), ("ge", jnp.greater_equal),
):
    _packet = getattr(aten, _name)
    lower(_packet.Tensor, _packet.Scalar)(_compare(_fn))


@lower(aten.logical_not.default)
def logical_not(x):
    return jnp.logical_not(x)


@lower(aten.logical_and.default)
def logical_and(x, y):
    return jnp.logical_and(x, y)


@lower(aten.logical_or.default)
def logical_or(x, y):
    return jnp.logical_or(x, y)


@lower(aten.logical_xor.default)
def logical_xor(x, y):
    return jnp.logical_xor(x, y)


@lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
def bitwise_and(x, y):
    x, y = promote(x, y)
    return x & y


@lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
def bitwise_or(x, y):
    x, y = promote(x, y)
    return x | y


@lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
def bitwise_xor(x, y):
    x, y = promote(x, y)
    return x ^ y


@lower(aten.bitwise_not.default)
def bitwise_not(x):
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else ~x


def _shift_bits(dtype) -> int:
    return jnp.iinfo(dtype).bits


# Python's `<<` / `>>` on tensors reach the backend as aten::__lshift__ / __rshift__: unlike `&` or `|`
# they are not composite, and CPU runs them on the same kernel as bitwise_*_shift.
@lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
       aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def bitwise_left_shift(a, b):
    # PyTorch: a shift by a negative amount or by the bit width or more gives 0
    a, b = promote(a, b)
    a, b = jnp.asarray(a), jnp.asarray(b, jnp.asarray(a).dtype)
    bits = _shift_bits(a.dtype)
    bad = (b < 0) | (b >= bits)
    return jnp.where(bad, 0, jnp.left_shift(a, jnp.where(bad, 0, b)))


@lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def bitwise_right_shift(a, b):
    # PyTorch: an out-of-range shift of a signed value fills with its sign, of an unsigned one gives 0
    a, b = promote(a, b)
    a, b = jnp.asarray(a), jnp.asarray(b, jnp.asarray(a).dtype)
    bits = _shift_bits(a.dtype)
    bad = (b < 0) | (b >= bits)
    full = jnp.right_shift(a, bits - 1) if jnp.issubdtype(a.dtype, jnp.signedinteger) else jnp.zeros_like(a)
    return jnp.where(bad, full, jnp.right_shift(a, jnp.where(bad, 0, b)))


@lower(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x)


@lower(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x)


@lower(aten.isfinite.default)
def isfinite(x):
    return jnp.isfinite(x)


@lower(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x)


@lower(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x)


# ---- math functions (integer inputs compute in the default float dtype) -------------------


def _float_unary(fn, name):
    def lowering(x):
        (x,) = promote(x, kind=_INT_TO_FLOAT)
        return fn(x)

    lowering.__name__ = name
    return lowering


def _digamma(x):
    # PyTorch: digamma(+-0) = -+inf (a pole whose sign follows the zero's); JAX gives nan
    return jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), jax.scipy.special.digamma(x))


_FLOAT_UNARY = {
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos,
    "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid, "erf": jax.scipy.special.erf, "erfc": jax.scipy.special.erfc,
    "erfinv": jax.scipy.special.erfinv, "lgamma": jax.scipy.special.gammaln,
    "digamma": _digamma, "i0": jax.scipy.special.i0,
}
for _name, _fn in _FLOAT_UNARY.items():
    lower(getattr(aten, _name).default)(_float_unary(_fn, _name))


def _rounding(fn, name):
    def lowering(x):
        return x if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else fn(x)

    lowering.__name__ = name
    return lowering


for _name, _fn in (("floor", jnp.floor), ("ceil", jnp.ceil), ("trunc", jnp.trunc), ("frac", lambda v: v - jnp.trunc(v))):
    lower(getattr(aten, _name).default)(_rounding(_fn, _name))


@lower(aten.round.default)
def round_(x):
    return jnp.round(x) if jnp.issubdtype(x.dtype, jnp.floating) else x


@lower(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    scale = 10.0**decimals
    return jnp.round(x * scale) / scale


@lower(aten.atan2.default)
def atan2(x, y):
    x, y = promote(x, y, kind=_INT_TO_FLOAT)
    return jnp.arctan2(x, y)


@lower(aten.hypot.default)
def hypot(x, y):
    x, y = promote(x, y)
    return jnp.hypot(x, y)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(x, y):
    x, y = promote(x, y, kind=_INT_TO_FLOAT)
    return jnp.copysign(x, y)


@lower(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lower(aten.sinc.default)
def sinc(x):
    (x,) = float_opmath(x)
    product = math.pi * x
    return jnp.where(x == 0, 1.0, jnp.sin(product) / jnp.where(x == 0, 1.0, product))


@lower(aten.signbit.default)
def signbit(x):
    if x.dtype == jnp.bool_:
        return jnp.zeros(x.shape, jnp.bool_)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x < 0
    return jnp.signbit(x)


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
    a, b = float_opmath(a, b)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(a - b)))
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lower(aten.logaddexp2.default)
def logaddexp2(a, b):
    a, b = float_opmath(a, b)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(a - b))) / math.log(2.0)
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lower(aten.gcd.default)
def gcd(a, b):
    a, b = promote(a, b)
    return jnp.gcd(a, b)


@lower(aten.lcm.default)
def lcm(a, b):
    a, b = promote(a, b)
    g = jnp.gcd(a, b)
    return jnp.where(g == 0, 0, jnp.abs(a // jnp.where(g == 0, 1, g) * b))


# ---- complex numbers ----------------------------------------------------------------------


_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _check_complex(real, imag, *, out=None):
    require(real.dtype in _COMPLEX_OF and imag.dtype in _COMPLEX_OF, "Expected both inputs to be Half, "
            f"Float or Double tensors but got {scalar_type(real.dtype)} and {scalar_type(imag.dtype)}")
    require(real.dtype == imag.dtype, f"Expected object of scalar type {scalar_type(real.dtype)} but got scalar "
            f"type {scalar_type(imag.dtype)} for second argument")
    want = _COMPLEX_OF[real.dtype]
    if out is not None:
        require(out.dtype == want, f"Expected object of scalar type {scalar_type(want)} but got scalar "
                f"type {scalar_type(out.dtype)} for argument 'out'")


@lower(aten.complex.default, check=_check_complex)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@lower(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(x):
    return jnp.conj(x)


@lower(aten._conj.default)
def _conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lower(aten.angle.default)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.arctan2(x.imag, x.real)
    (x,) = float_opmath(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, math.pi, 0.0))


@lower(aten.polar.default)
def polar(abs_, angle_):
    abs_, angle_ = jnp.broadcast_arrays(abs_, angle_)
    return lax.complex(abs_ * jnp.cos(angle_), abs_ * jnp.sin(angle_))
