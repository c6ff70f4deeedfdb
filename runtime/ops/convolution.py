"""Convolutions, forward and backward, 1-d to 3-d, grouped, dilated and transposed.

Float32 convolutions follow the matmul precision in effect (``linalg.matmul_precision``)
and, under TPU numerics, run in bfloat16 passes (``linalg.tpu_product``); both
lowerings are registered with ``precision=True`` so eager mode keys their
executables by that setting. Half-precision inputs accumulate in float32.

The backward is ``jax.vjp`` of the forward, so the two cannot disagree.
Masked-off gradients (``output_mask`` False) are zeros: the eager interpreter
has no undefined-tensor output, and autograd ignores gradients it did not ask for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.core.errors import NoLoweringError, OpArgumentError
from tpu_debug.runtime.ops._common import HALF, ntuple, opmath
from tpu_debug.runtime.ops.linalg import matmul_precision, tpu_passes, tpu_product
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _conv_dims(nd):
    sp = "DHW"[3 - nd :] if nd <= 3 else None
    if sp is None:
        raise NoLoweringError(
            f"{nd}-d convolution has no tpu lowering; 1-d, 2-d and 3-d convolutions have one"
        )
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    passes = tpu_passes(x, w)  # TPU numerics: bfloat16 passes
    if passes:
        def exact(a, b):
            return _conv_exact(a, b, stride, padding, dilation, transposed, output_padding, groups)

        return tpu_product(exact, x, w, passes=passes)
    return _conv_exact(x, w, stride, padding, dilation, transposed, output_padding, groups)


def _conv_exact(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    stride, padding, dilation = ntuple(stride, nd), ntuple(padding, nd), ntuple(dilation, nd)
    kw = {"precision": matmul_precision()} if jnp.issubdtype(x.dtype, jnp.floating) else {}
    if x.dtype in HALF:
        kw["preferred_element_type"] = jnp.float32
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=_conv_dims(nd),
            feature_group_count=groups, **kw,
        )
    # a transposed convolution is the input-gradient of a convolution: dilate the
    # input by the stride, pad by d*(k-1)-p, and convolve with the flipped kernel
    # whose in/out channels are swapped within each group
    output_padding = ntuple(output_padding, nd)
    cin, cout_g = w.shape[0], w.shape[1]
    ks = w.shape[2:]
    wt = w.reshape((groups, cin // groups, cout_g) + ks)
    wt = jnp.swapaxes(wt, 1, 2).reshape((groups * cout_g, cin // groups) + ks)
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + nd)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(ks, padding, dilation, output_padding)
    ]
    return lax.conv_general_dilated(
        x, wt, window_strides=(1,) * nd, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=_conv_dims(nd),
        feature_group_count=groups, **kw,
    )


def _sizes(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _expanded(values, name: str, dim: int) -> list[int]:
    values = list(values)
    if len(values) == 1:
        return values * dim
    if len(values) != dim:
        raise OpArgumentError(
            f"expected {name} to be a single integer value or a list of {dim} values to match the "
            f"convolution dimensions, but got {name}={_sizes(values)}"
        )
    return values


def _check_convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups, **_out):
    """The checks of PyTorch's ``_convolution`` (aten/src/ATen/native/Convolution.cpp), with its
    messages: its meta kernel checks less, in other words, and XLA would pad with a negative
    padding (cropping) where CPU refuses."""
    dim = w.dim() - 2
    if dim <= 0:
        raise OpArgumentError("weight should have at least three dimensions")
    if groups <= 0:
        raise OpArgumentError("non-positive groups is not supported")
    stride, padding = _expanded(stride, "stride", dim), _expanded(padding, "padding", dim)
    dilation = _expanded(dilation, "dilation", dim)
    output_padding = _expanded(output_padding, "output_padding", dim)
    if any(p < 0 for p in padding):
        raise OpArgumentError("negative padding is not supported")
    if any(p < 0 for p in output_padding):
        raise OpArgumentError("negative output_padding is not supported")
    if any(s <= 0 for s in stride):
        raise OpArgumentError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise OpArgumentError(f"dilation should be greater than zero, but got {_sizes(dilation)}")
    ws, k = tuple(w.shape), x.dim()
    if w.dim() != k:
        raise OpArgumentError(
            f"Expected {w.dim()}-dimensional input for {w.dim()}-dimensional weight {_sizes(ws)}, but got "
            f"{k}-dimensional input of size {_sizes(x.shape)} instead"
        )
    if ws[0] < groups:
        raise OpArgumentError(
            f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got weight "
            f"of size {_sizes(ws)} instead"
        )
    if ws[0] % groups:
        raise OpArgumentError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
            f"weight of size [{_sizes(ws)}] instead"
        )
    _check_channels(x, ws, bias, padding, dilation, transposed, groups)
    if x.shape[0] and x.shape[1] and not x.numel():
        raise OpArgumentError(
            f"Only zero batch or zero channel inputs are supported, but got input shape: {_sizes(x.shape)}"
        )


def _check_channels(x, ws, bias, padding, dilation, transposed, groups) -> None:
    bias_size = None if bias is None else _sizes(bias.shape)
    if transposed:
        if x.shape[1] != ws[0]:
            raise OpArgumentError(
                f"Given transposed=1, weight of size {_sizes(ws)}, expected input{_sizes(x.shape)} to have "
                f"{ws[0]} channels, but got {x.shape[1]} channels instead"
            )
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != ws[1] * groups):
            raise OpArgumentError(
                f"Given transposed=1, weight of size {_sizes(ws)}, expected bias to be 1-dimensional with "
                f"{ws[1] * groups} elements, but got bias of size {bias_size} instead"
            )
        return
    if x.shape[1] != ws[1] * groups:
        raise OpArgumentError(
            f"Given groups={groups}, weight of size {_sizes(ws)}, expected input{_sizes(x.shape)} to have "
            f"{ws[1] * groups} channels, but got {x.shape[1]} channels instead"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != ws[0]):
        raise OpArgumentError(
            f"Given weight of size {_sizes(ws)}, expected bias to be 1-dimensional with {ws[0]} elements, "
            f"but got bias of size {bias_size} instead"
        )
    padded = [x.shape[i + 2] + 2 * p for i, p in enumerate(padding)]
    kernel = [d * (ws[i + 2] - 1) + 1 for i, d in enumerate(dilation)]
    if any(n < kk for n, kk in zip(padded, kernel)):
        raise OpArgumentError(
            f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
            f"({' x '.join(map(str, kernel))}). Kernel size can't be greater than actual input size"
        )


@lower(aten.convolution.default, precision=True, check=_check_convolution)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x = x[None]
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out[0] if unbatched else out


@lower(aten.convolution_backward.default, precision=True)
def convolution_backward(
    grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def fwd(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(fwd, x, w)
    gx, gw = vjp(opmath(grad))
    gb = jnp.sum(opmath(grad), axis=(0,) + tuple(range(2, grad.ndim)))
    # masked-off gradients are zeros, not None (see the module docstring)
    return (
        gx if output_mask[0] else jnp.zeros_like(x),
        gw if output_mask[1] else jnp.zeros_like(w),
        gb if output_mask[2] else jnp.zeros(tuple(bias_sizes or (w.shape[1 if transposed else 0],)), grad.dtype),
    )
