"""Activation functions and their backward ops: relu, gelu, silu, the hard* family,
shrinkage, glu, and rrelu (whose training mode draws random slopes).

Where PyTorch's kernel computes a half-precision input in float32 and rounds once
(``gelu``, ``glu``, ``rrelu``), so does the lowering; where it rounds after every
step (``logit``), the lowering rounds at the same steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_debug.runtime.ops._checks import require, scalar_type
from tpu_debug.runtime.ops._common import HALF, Kind, compute_dtype, opmath, round_to
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


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
    _, dtype = compute_dtype(x, kind=Kind.INT_TO_FLOAT)
    step = round_to(dtype) if dtype in HALF else (lambda v: v)
    x = opmath(x.astype(dtype))
    if eps is not None and eps >= 0:
        lo = step(jnp.asarray(eps, jnp.float32))
        x = jnp.clip(x, lo, step(1 - lo))
    return jnp.log(step(x / step(1 - x))).astype(dtype)


@lower(aten.gelu.default)
def gelu(x, *, approximate="none"):
    # half types compute in float32 and round once, as PyTorch's kernels do
    return jax.nn.gelu(opmath(x), approximate=approximate == "tanh").astype(x.dtype)


@lower(aten.gelu_backward.default)
def gelu_backward(grad, x, *, approximate="none"):
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), opmath(x))
    return vjp(opmath(grad))[0].astype(grad.dtype)


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


@lower(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


def _check_softshrink(x, lambd=0.5, **_out):
    """CPU refuses a negative lambda (the shrink would grow values): XLA would compute it."""
    top = torch.finfo(x.dtype).max if x.is_floating_point() else float("inf")
    require(0 <= lambd <= top, f"lambda must be in range [0, {top:g}] for input dtype {scalar_type(x.dtype)}, "
            f"but found {lambd:g}")


@lower(aten.softshrink.default, check=_check_softshrink)
def softshrink(x, lambd=0.5):
    zero = jnp.zeros((), x.dtype)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, zero))


@lower(aten.hardshrink_backward.default, aten.softshrink_backward.default)
def shrink_backward(grad, x, lambd):
    # both shrinkages have slope 1 outside [-lambd, lambd] and 0 inside, bounds included
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@lower(aten.glu.default)
def glu(x, dim=-1):
    a, b = (opmath(half) for half in jnp.split(x, 2, axis=dim))
    return a * (1.0 / (1.0 + jnp.exp(-b)))


@lower(aten.rrelu_with_noise.default, rng=True, mutates_returns=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key):
    """Training: a slope drawn from U(lower, upper) per non-positive element, recorded in
    ``noise`` (1 elsewhere); eval: leaky_relu with the mean slope, ``noise`` untouched."""
    if not training:
        return jnp.where(x > 0, x, x * ((lower + upper) / 2)).astype(x.dtype), noise
    wide = opmath(x).dtype
    r = jax.random.uniform(key, x.shape, wide, minval=lower, maxval=upper)
    slope = jnp.where(x <= 0, r, 1).astype(x.dtype)
    return (x.astype(wide) * slope.astype(wide)).astype(x.dtype), slope.astype(noise.dtype)


@lower(aten.rrelu_with_noise_functional.default, rng=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key):
    return rrelu_with_noise(x, noise, lower, upper, training, generator, key=key)


@lower(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:
        return grad * noise
    slope = (lower + upper) / 2
    return jnp.where(x > 0, grad, grad * slope)
