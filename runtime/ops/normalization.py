"""Layer, group and batch normalization, forward and backward.

Statistics are computed in float32 for half-precision inputs (PyTorch's
``opmath``). The backward ops use the saved mean and inverse standard deviation
in the closed forms PyTorch's kernels use. Masked-off gradients
(``output_mask`` False) are zeros in the program (an XLA program has no undefined
output); the eager interpreter returns them as None, as PyTorch's kernels do.

Batch norm's variants that update running statistics in place return the new
statistics as extra outputs (``mutates_returns=True``). Their saved statistics are
what PyTorch's CPU kernel saves, which its meta kernels (written after CUDA's)
do not describe: empty when normalizing with the running statistics, and in the
input's half dtype when the parameters share it (``_bn_meta``).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.runtime.ops._common import opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _normalize(x, axes, eps):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return (x - mean) * rstd, mean, rstd, var


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = y * opmath(weight).reshape(shape)
    if bias is not None:
        y = y + opmath(bias).reshape(shape)
    return y


def _layer_norm(x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    axes = tuple(range(x.ndim - n, x.ndim))
    y, mean, rstd, _ = _normalize(opmath(x), axes, eps)
    return _affine(y, weight, bias, tuple(normalized_shape)), mean, rstd


@lower(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


def _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    # the saved mean/rstd are the statistics: x_hat = (x - mean) * rstd and the
    # usual closed form, as PyTorch's kernel computes it
    n = len(normalized_shape)
    axes = tuple(range(x.ndim - n, x.ndim))
    outer = tuple(range(x.ndim - n))
    x, grad = opmath(x), opmath(grad)
    mean, rstd = mean.astype(x.dtype), rstd.astype(x.dtype)
    x_hat = (x - mean) * rstd
    g = grad * opmath(weight) if weight is not None else grad
    gx = rstd * (
        g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True)
    )
    shape = tuple(normalized_shape)
    gw = jnp.sum(grad * x_hat, axis=outer) if weight is not None else jnp.zeros(shape, x.dtype)
    gb = jnp.sum(grad, axis=outer) if bias is not None else jnp.zeros(shape, x.dtype)
    return (
        gx if output_mask[0] else jnp.zeros_like(x),
        gw if output_mask[1] else jnp.zeros_like(gw),
        gb if output_mask[2] else jnp.zeros_like(gb),
    )


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask)


def _masked(output_mask, *grads):
    return tuple(g if m else jnp.zeros_like(g) for m, g in zip(output_mask, grads))


def _channel_shape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    xf = opmath(x).reshape(N, group, (C // group) * HxW)
    y, mean, rstd, _ = _normalize(xf, (2,), eps)
    y = _affine(y.reshape(x.shape), weight, bias, _channel_shape(x.ndim))
    return y, mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    shape = (N, group, C // group, HxW)
    xf, gf = opmath(x).reshape(shape), opmath(grad).reshape(shape)
    mean = mean.astype(xf.dtype).reshape(N, group, 1, 1)
    rstd = rstd.astype(xf.dtype).reshape(N, group, 1, 1)
    x_hat = (xf - mean) * rstd
    g = gf * opmath(weight).reshape(1, group, C // group, 1) if weight is not None else gf
    axes = (2, 3)
    gx = rstd * (g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True))
    gw = jnp.sum(gf * x_hat, axis=(0, 3)).reshape(C)
    gb = jnp.sum(gf, axis=(0, 3)).reshape(C)
    return _masked(output_mask, gx.reshape(x.shape), gw, gb)


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_train(x, weight, bias, eps):
    xf = opmath(x)
    axes = _bn_axes(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_channel_shape(x.ndim))), axis=axes)
    invstd = lax.rsqrt(var + eps)
    y = (xf - mean.reshape(_channel_shape(x.ndim))) * invstd.reshape(_channel_shape(x.ndim))
    return _affine(y, weight, bias, _channel_shape(x.ndim)), mean, invstd, var


def _bn_eval(x, weight, bias, running_mean, running_var, eps):
    xf = opmath(x)
    shape = _channel_shape(x.ndim)
    rm = running_mean.astype(xf.dtype)
    invstd = lax.rsqrt(running_var.astype(xf.dtype) + eps)
    y = (xf - rm.reshape(shape)) * invstd.reshape(shape)
    # nothing is saved: the backward reads the running statistics
    none = jnp.zeros((0,), xf.dtype)
    return _affine(y, weight, bias, shape), none, none


def _stats_meta(x, params, training: bool):
    """Batch norm's output and saved statistics on meta or fake tensors, as PyTorch's CPU
    kernel makes them: (C,) statistics when normalizing with the batch's, empty ones
    with the running statistics; float32 for a half input whose parameters are
    float32, else the input's dtype."""
    mixed = x.dtype in (torch.float16, torch.bfloat16) and any(
        p is not None and p.dtype == torch.float32 for p in params)
    dtype = torch.float32 if mixed else x.dtype
    size = (x.shape[1],) if training else (0,)
    return torch.empty_like(x), x.new_empty(size, dtype=dtype), x.new_empty(size, dtype=dtype)


def _reserve_meta(x):
    return x.new_empty((0,), dtype=torch.uint8)


def _legit_meta(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _stats_meta(x, (weight, bias, running_mean, running_var), training)


def _legit_no_stats_meta(x, weight, bias, training, momentum, eps):
    return _stats_meta(x, (weight, bias), True)


def _no_training_meta(x, weight, bias, running_mean, running_var, momentum, eps):
    return _stats_meta(x, (weight, bias, running_mean, running_var), False)


def _legit_functional_meta(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _legit_meta(x, weight, bias, running_mean, running_var, training, momentum, eps) + (
        torch.empty_like(running_mean), torch.empty_like(running_var))


def _with_update_meta(x, weight, bias, running_mean, running_var, momentum, eps):
    return _stats_meta(x, (weight, bias, running_mean, running_var), True) + (_reserve_meta(x),)


def _with_update_functional_meta(x, weight, bias, running_mean, running_var, momentum, eps):
    return _with_update_meta(x, weight, bias, running_mean, running_var, momentum, eps) + (
        torch.empty_like(running_mean), torch.empty_like(running_var))


def _no_update_meta(x, weight, bias, running_mean, running_var, momentum, eps):
    params = (weight, bias, running_mean, running_var)
    return _stats_meta(x, params, running_mean is None) + (_reserve_meta(x),)


def _updated_stats(x, mean, var, running_mean, running_var, momentum):
    # PyTorch's running statistics use the unbiased batch variance
    n = x.size // x.shape[1]
    unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.nan
    rm = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    rv = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return rm, rv


def _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        y, mean, invstd, var = _bn_train(x, weight, bias, eps)
        if running_mean is None:
            return (y, mean, invstd), None
        return (y, mean, invstd), _updated_stats(x, mean, var, running_mean, running_var, momentum)
    y, mean, invstd = _bn_eval(x, weight, bias, running_mean, running_var, eps)
    return (y, mean, invstd), (running_mean, running_var)


@lower(aten._native_batch_norm_legit.default, mutates_returns=True, meta=_legit_meta)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return outs + stats


@lower(aten._native_batch_norm_legit.no_stats, meta=_legit_no_stats_meta)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _bn_train(x, weight, bias, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training.default, meta=_no_training_meta)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_eval(x, weight, bias, running_mean, running_var, eps)


@lower(aten._native_batch_norm_legit_functional.default, meta=_legit_functional_meta)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return outs + stats


def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update.default, mutates_returns=True, meta=_with_update_meta)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return outs + (_reserve(),) + stats


@lower(aten._batch_norm_with_update_functional.default, meta=_with_update_functional_meta)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    return batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps)


@lower(aten._batch_norm_no_update.default, meta=_no_update_meta)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        return _bn_train(x, weight, bias, eps)[:3] + (_reserve(),)
    return _bn_eval(x, weight, bias, running_mean, running_var, eps) + (_reserve(),)


def _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    xf, gf = opmath(x), opmath(grad)
    shape = _channel_shape(x.ndim)
    axes = _bn_axes(x)
    if train:
        mean, invstd = save_mean.astype(xf.dtype), save_invstd.astype(xf.dtype)
    else:
        mean = running_mean.astype(xf.dtype)
        invstd = lax.rsqrt(running_var.astype(xf.dtype) + eps)
    x_hat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    w = opmath(weight).reshape(shape) if weight is not None else 1
    if train:
        g = gf * w
        gx = invstd.reshape(shape) * (
            g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True)
        )
    else:
        gx = gf * w * invstd.reshape(shape)
    return _masked(output_mask, gx, jnp.sum(gf * x_hat, axis=axes), jnp.sum(gf, axis=axes))


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve):
    # ``save_var`` holds the saved inverse std (PyTorch's naming); ``update`` is
    # the training flag, and without running stats the batch stats were used
    train = update or running_mean is None
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask)
