"""Pointwise ops: arithmetic, comparisons, math functions, activations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.runtime.ops._common import Kind, compute_dtype, is_array, promote
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten
_INT_TO_FLOAT = Kind.INT_TO_FLOAT


# ---- arithmetic --------------------------------------------------------------


@lower(aten.add.Tensor, aten.add.Scalar)
def add(x, y, *, alpha=1):
    x, y = promote(x, y)
    return x + (y * alpha if alpha != 1 else y)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, *, alpha=1):
    x, y = promote(x, y)
    return x - (y * alpha if alpha != 1 else y)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, *, alpha=1):
    x, y = promote(x, y)
    return y - (x * alpha if alpha != 1 else x)


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


def fma(a, b, c):
    """``prims.fma``, ``a * b + c``: what PyTorch's decompositions of in-place
    ``addcmul_``/``addcdiv_`` leave in compiled graphs (an optimizer's
    ``exp_avg_sq.addcmul_(grad, grad)``). Registered by the compiled mode
    (``compiled._register_prims``): prims ops exist once ``torch._prims`` is imported,
    which ``torch._dynamo`` does and ``import tpu_debug`` should not (issue 6)."""
    a, b, c = promote(a, b, c)
    return a * b + c


# ---- comparisons and logic -----------------------------------------------------


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


# ---- unary math (integer inputs compute in the default float dtype) ------------


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


# ---- activations ---------------------------------------------------------------


@lower(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@lower(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value, x.dtype), x)


@lower(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lower(aten.logit.default)
def logit(x, eps=None):
    # PyTorch's kernel works in the result dtype: bfloat16 rounds after every step
    # (eps included), which a float32 computation rounding once would not reproduce
    _, dtype = compute_dtype(x, kind=_INT_TO_FLOAT)
    step = _rounding_to(dtype) if dtype in (jnp.bfloat16, jnp.float16) else (lambda v: v)
    x = _wide(x.astype(dtype))
    if eps is not None and eps >= 0:
        lo = step(jnp.asarray(eps, jnp.float32))
        x = jnp.clip(x, lo, step(1 - lo))
    return jnp.log(step(x / step(1 - x))).astype(dtype)


@lower(aten.gelu.default)
def gelu(x, *, approximate="none"):
    # half types compute in float32 and round once, as PyTorch's kernels do
    return jax.nn.gelu(_wide(x), approximate=approximate == "tanh").astype(x.dtype)


@lower(aten.gelu_backward.default)
def gelu_backward(grad, x, *, approximate="none"):
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), _wide(x))
    return vjp(_wide(grad))[0].astype(grad.dtype)


def _rounding_to(dtype):
    """Round float32 values to ``dtype``'s precision (XLA keeps a convert round trip in float32)."""
    info = jnp.finfo(dtype)
    return lambda v: lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _wide(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


@lower(aten.silu.default)
def silu(x):
    return x * jax.nn.sigmoid(x)


@lower(aten.silu_backward.default)
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    return grad * y * (1 - y)


@lower(aten.tanh_backward.default)
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lower(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, min_val, max_val)


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lower(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lower(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(x / 6 + 0.5, 0, 1)


@lower(aten.hardswish.default)
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower(aten.mish.default)
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))
