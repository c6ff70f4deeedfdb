"""The fused cells of ``nn.LSTM``/``nn.LSTMCell`` and ``nn.GRU``/``nn.GRUCell``, and their backward.

PyTorch's recurrent modules (``aten::lstm``, ``gru``, ``lstm_cell``, ``gru_cell``) are
composite: for a CUDA, XPU or PrivateUse1 input each time step runs the two gate products
(``input @ w_ih.T``, ``hidden @ w_hh.T``) as matmuls and hands them, with the biases, to one
fused elementwise op, ``_thnn_fused_lstm_cell`` or ``_thnn_fused_gru_cell``. That op keeps
the activated gates in a ``workspace`` output, which its backward
(``_thnn_fused_lstm_cell_backward_impl``, ``_thnn_fused_gru_cell_backward``) reads instead
of recomputing them. The layouts follow PyTorch's CUDA kernels (aten/src/ATen/native/cuda/RNN.cu):

* LSTM gates are the chunks (input, forget, cell, output) of the last dimension, ``4 * H``
  wide; the workspace holds the activated gates in the same layout.
* GRU gates are the chunks (reset, update, new), ``3 * H`` wide; the workspace is ``5 * H``
  wide: reset, update and new gates, the previous hidden state, and the hidden part of the
  new gate (``hidden_gates`` chunk 2 plus its bias) that the reset gate scales.

A gradient autograd did not compute (the output was not used) arrives as None and counts
as zeros. Half-precision inputs compute in float32 and round once, as the CUDA kernels do
(their ``accscalar_t``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_debug.runtime.ops._common import opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _with_biases(gates, input_bias, hidden_bias):
    if input_bias is not None:
        gates = gates + opmath(input_bias)
    if hidden_bias is not None:
        gates = gates + opmath(hidden_bias)
    return gates


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    # PyTorch's meta kernel compares the devices of the biases without checking them for
    # None, and an LSTM built with bias=False passes None (its CUDA kernel accepts that)
    hy = torch.empty_like(cx, memory_format=torch.contiguous_format)
    cy = torch.empty_like(cx, memory_format=torch.contiguous_format)
    return hy, cy, torch.empty_like(input_gates, memory_format=torch.contiguous_format)


@lower(aten._thnn_fused_lstm_cell.default, meta=_lstm_cell_meta)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _with_biases(opmath(input_gates) + opmath(hidden_gates), input_bias, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * opmath(cx) + i * g
    hy = o * jnp.tanh(cy)
    dtype = input_gates.dtype
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    return hy.astype(dtype), cy.astype(dtype), workspace.astype(dtype)


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    dtype = workspace.dtype
    i, f, g, o = jnp.split(opmath(workspace), 4, axis=-1)
    cx, cy = opmath(cx), opmath(cy)
    ghy = jnp.zeros_like(cy) if grad_hy is None else opmath(grad_hy)
    gcy = jnp.zeros_like(cy) if grad_cy is None else opmath(grad_cy)
    tanh_cy = jnp.tanh(cy)
    # the cell state's gradient: its own, plus the hidden output's through o * tanh(cy)
    gc = ghy * o * (1 - tanh_cy * tanh_cy) + gcy
    gi = gc * g * i * (1 - i)
    gf = gc * cx * f * (1 - f)
    gg = gc * i * (1 - g * g)
    go = ghy * tanh_cy * o * (1 - o)
    grad_gates = jnp.concatenate([gi, gf, gg, go], axis=-1)
    grad_bias = jnp.sum(grad_gates, axis=0) if grad_gates.ndim > 1 else grad_gates
    if not has_bias:
        grad_bias = jnp.zeros_like(grad_bias)
    return grad_gates.astype(dtype), (gc * f).astype(dtype), grad_bias.astype(dtype)


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    # PyTorch has no meta kernel for the GRU cell (dynamo's fake tensors need one)
    hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
    return hy, hx.new_empty((hx.shape[0], hx.shape[1] * 5))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    batch, hidden = grad_hy.shape
    gates = grad_hy.new_empty((batch, 3 * hidden))
    biases = grad_hy.new_empty((3 * hidden,))
    return gates, torch.empty_like(gates), torch.empty_like(grad_hy), biases, torch.empty_like(biases)


@lower(aten._thnn_fused_gru_cell.default, meta=_gru_cell_meta)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, ii, in_ = jnp.split(opmath(input_gates), 3, axis=-1)
    hr, hi, hn = jnp.split(opmath(hidden_gates), 3, axis=-1)
    if input_bias is not None:
        br, bi, bn = jnp.split(opmath(input_bias), 3, axis=-1)
        ir, ii, in_ = ir + br, ii + bi, in_ + bn
    if hidden_bias is not None:
        br, bi, bn = jnp.split(opmath(hidden_bias), 3, axis=-1)
        hr, hi, hn = hr + br, hi + bi, hn + bn
    h = opmath(hx)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (h - n)
    dtype = input_gates.dtype
    workspace = jnp.concatenate([r, z, n, h, hn], axis=-1)
    return hy.astype(dtype), workspace.astype(dtype)


@lower(aten._thnn_fused_gru_cell_backward.default, meta=_gru_cell_backward_meta)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dtype = workspace.dtype
    r, z, n, h, hn = jnp.split(opmath(workspace), 5, axis=-1)
    g = opmath(grad_hy)
    gz = g * (h - n) * z * (1 - z)
    gn = g * (1 - z) * (1 - n * n)  # the new gate's pre-activation
    gr = gn * hn * r * (1 - r)
    grad_input = jnp.concatenate([gr, gz, gn], axis=-1)
    grad_hidden = jnp.concatenate([gr, gz, gn * r], axis=-1)
    sums = [jnp.sum(t, axis=0) if t.ndim > 1 else t for t in (grad_input, grad_hidden)]
    if not has_bias:
        sums = [jnp.zeros_like(s) for s in sums]
    outs = (grad_input, grad_hidden, g * z, *sums)
    return tuple(t.astype(dtype) for t in outs)
