"""``torch_tpu.ops.splash_attention`` (and ``torch_tpu._internal.ops.splash_attention``,
``torch.tpu.ops.splash_sdpa``): splash attention, TorchTPU's ``scaled_dot_product_attention``
for long sequences.

``splash_sdpa(q, k, v, ...)`` runs JAX's splash attention Pallas kernel
(``jax.experimental.pallas.ops.tpu.splash_attention``), the kernel TorchTPU calls, as a
``jax_op`` (runtime/pallas.py): on this host's CPU the kernel is interpreted, in a program
lowered for a TPU (``tpu-debug run --target``) it is the Mosaic kernel. Its backward is the
kernel's own (JAX's ``vjp`` of it), so gradients flow to ``q``, ``k`` and ``v``.

The mask is TorchTPU's: causal by default, a sliding window with ``local_window_size`` (each
query sees itself and the ``local_window_size`` keys before it), full with
``is_causal=False``. ``q`` is ``(batch, heads, seq, head_dim)``; ``k`` and ``v`` may have fewer
heads (grouped-query attention, ``enable_gqa=True``), repeated to ``q``'s as TorchTPU does. A
block size larger than the sequence is cut to it (a TPU needs blocks of at least 128, which
``--target`` checks).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import torch
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime.pallas import jax_op

__all__ = ["splash_sdpa"]


def _block(size: int, seq_len: int) -> int:
    return math.gcd(min(size, seq_len), seq_len)


def _kernel(seq_len: int, heads: int, is_causal: bool, window: int, blocks: tuple[int, ...]):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    shape = (seq_len, seq_len)
    if window >= 0:
        one = masks.LocalMask(shape=shape, window_size=(window, 0), offset=0)
    elif is_causal:
        one = masks.CausalMask(shape=shape)
    else:
        one = masks.FullMask(shape)
    q, kv, kv_compute, q_dkv, kv_dkv, kv_dkv_compute = (_block(b, seq_len) for b in blocks)
    sizes = kernel.BlockSizes(block_q=q, block_kv=kv, block_kv_compute=kv_compute, block_q_dkv=q_dkv,
                              block_kv_dkv=kv_dkv, block_kv_dkv_compute=kv_dkv_compute, block_q_dq=q, block_kv_dq=kv)
    mha = kernel.make_splash_mha(mask=masks.MultiHeadMask(masks=(one,) * heads), head_shards=1, q_seq_shards=1,
                                 block_sizes=sizes)
    return jax.vmap(mha)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, is_causal: bool, window: int,
               block_q: int, block_kv: int, block_kv_compute: int, block_q_dkv: int, block_kv_dkv: int,
               block_kv_dkv_compute: int) -> jax.Array:
    blocks = (block_q, block_kv, block_kv_compute, block_q_dkv, block_kv_dkv, block_kv_dkv_compute)
    run = _kernel(q.shape[2], q.shape[1], is_causal, window, blocks)
    return run((q * jnp.asarray(scale, q.dtype)), k, v).astype(q.dtype)


def _attention_grad(g: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, is_causal: bool,
                    window: int, block_q: int, block_kv: int, block_kv_compute: int, block_q_dkv: int,
                    block_kv_dkv: int, block_kv_dkv_compute: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    statics = (scale, is_causal, window, block_q, block_kv, block_kv_compute, block_q_dkv, block_kv_dkv,
               block_kv_dkv_compute)
    _, pull = jax.vjp(lambda a, b, c: _attention(a, b, c, *statics), q, k, v)
    return pull(g.astype(q.dtype))


@functools.cache
def _ops() -> tuple[Any, Any]:
    forward = jax_op("tpu_debug::splash_attention", _attention)
    backward = jax_op("tpu_debug::splash_attention_backward", _attention_grad)

    def setup_context(ctx, inputs, output):
        q, k, v, *statics = inputs
        ctx.save_for_backward(q, k, v)
        ctx.statics = statics

    def grad(ctx, g):
        q, k, v = ctx.saved_tensors
        return (*backward(g.contiguous(), q, k, v, *ctx.statics), *(None for _ in ctx.statics))

    forward.register_autograd(grad, setup_context=setup_context)
    return forward, backward


def splash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                is_causal: bool = True, local_window_size: int | None = None, enable_gqa: bool = False,
                block_q: int = 512, block_kv: int = 512, block_dkv: int = 512, block_kv_compute: int = 512,
                block_q_dkv: int = 512, block_kv_dkv: int = 512, block_kv_dkv_compute: int = 512,
                block_q_dq: int | None = None, block_kv_dq: int | None = None, use_fused_bwd_kernel: bool = True,
                use_vmap_bwd: bool = True, q_layout: str = "HEAD_DIM_MINOR", k_layout: str = "HEAD_DIM_MINOR",
                v_layout: str = "HEAD_DIM_MINOR") -> torch.Tensor:
    """Attention of ``q`` over ``k``, ``v`` by the splash kernel (see the module): what
    ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` computes.

    Args:
        q: ``(batch, heads, seq, head_dim)``.
        k, v: ``(batch, kv_heads, seq, head_dim)``; ``kv_heads`` divides ``heads``.
        scale: the logits' scale; None: ``1 / sqrt(head_dim)``.
        is_causal: each query sees the keys up to its own position.
        local_window_size: each query sees itself and this many keys before it (causal).
        enable_gqa: must say whether ``k`` has fewer heads than ``q``, as TorchTPU checks.
        block_*: the kernel's block sizes (``block_dkv`` sets both of the dK/dV pass's);
            ``block_q_dq``, ``block_kv_dq``, the layouts and the backward variants are
            accepted as TorchTPU takes them.

    Returns:
        ``(batch, heads, seq, head_dim)`` in ``q``'s dtype.

    Raises:
        TpuArgumentError: ``enable_gqa`` disagrees with the head counts, or the shapes do not fit.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise TpuArgumentError(f"splash_sdpa takes (batch, heads, seq, head_dim) tensors; got q {tuple(q.shape)}, "
                               f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if enable_gqa != (heads != kv_heads):
        raise TpuArgumentError(f"enable_gqa ({enable_gqa}) does not match inputs: n_heads={heads}, "
                               f"n_kv_heads={kv_heads}")
    if heads % kv_heads or q.shape[2] != k.shape[2]:
        raise TpuArgumentError(f"splash_sdpa: q has {heads} heads over {q.shape[2]} positions, k {kv_heads} over "
                               f"{k.shape[2]}: the kv heads must divide the heads and the lengths agree")
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    if block_dkv != 512:
        block_q_dkv = block_kv_dkv = block_dkv
    forward, _ = _ops()
    attention_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    window = -1 if local_window_size is None else int(local_window_size)
    return forward(q.contiguous(), k.contiguous(), v.contiguous(), attention_scale, bool(is_causal), window,
                   block_q, block_kv, block_kv_compute, block_q_dkv, block_kv_dkv, block_kv_dkv_compute)
