"""The fused inference fast paths of ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention``.

In eval mode under ``no_grad`` those modules call one fused aten op
(``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``), for which PyTorch has
CPU and CUDA kernels only. Here each is PyTorch's math path written with the aten ops it is
made of (linear, layer norm, softmax, matmul), each of which has a lowering, in the order
PyTorch's own kernels (``aten/src/ATen/native/transformers``) compute it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._checks import scalar_type
from tpu_debug.runtime.ops.registry import composite

aten = torch.ops.aten

# mask_type of the fused ops: how the mask broadcasts over (batch, heads, query, key)
_ATTN_MASK, _KEY_PADDING, _MERGED = 0, 1, 2


_NESTED = (
    "{op}: nn.TransformerEncoder's fast path with a src_key_padding_mask packs the sequences into a "
    "nested tensor, which the tpu device does not have; build the encoder with "
    "nn.TransformerEncoder(..., enable_nested_tensor=False): the padding mask is then applied as an "
    "attention mask, with the same results at every position that is not padding (the nested path "
    "returns zeros at padding positions)"
)


def _nested(*ts: torch.Tensor | None) -> None:
    if any(t is not None and t.is_nested for t in ts):
        raise NoLoweringError(_NESTED.format(op="a nested tensor"))


@composite(aten._nested_tensor_from_mask_left_aligned.default)
def nested_tensor_from_mask_left_aligned(t, mask):
    """Whether each row of ``mask`` (True: a token kept) is a run of True then only False.

    ``nn.TransformerEncoder`` asks this among the conditions of its nested fast path, before
    the one that declines the path when gradients are needed; it makes no nested tensor."""
    torch._check(mask.dtype == torch.bool, lambda: "Expected mask to be of ScalarType Bool, "
                 f"but got {scalar_type(mask.dtype)} instead.")
    torch._check(mask.dim() == 2, lambda: "Padding mask should be 2D")
    torch._check(t.dim() == 3, lambda: "Input should be a 3D tensor, N * L * D")
    torch._check(mask.shape == t.shape[:2], lambda: "Mask size should match input size")
    kept = mask.sum(dim=1, keepdim=True)
    return bool(torch.equal(mask, torch.arange(mask.shape[1], device=mask.device) < kept))


@composite(aten._nested_tensor_from_mask.default)
def nested_tensor_from_mask(t, mask, mask_check=True):
    """Refused with the fix: a nested tensor has no tpu layout. The encoder makes one in
    evaluation mode without gradients, for a padding mask whose rows are left-aligned."""
    raise NoLoweringError(_NESTED.format(op="aten::_nested_tensor_from_mask"))


def _broadcast_mask(
    mask: torch.Tensor, mask_type: int | None, batch: int, queries: int, keys: int
) -> torch.Tensor:
    """The mask as (batch, heads or 1, queries, keys), True or -inf where attention is masked out."""
    if mask_type == _KEY_PADDING or (mask_type is None and mask.dim() == 2 and mask.shape == (batch, keys)
                                     and (batch, keys) != (queries, keys)):
        return mask.reshape(batch, 1, 1, keys)
    if mask.dim() == 2:  # (queries, keys): the same for every sequence and head
        return mask.reshape(1, 1, queries, keys)
    if mask.dim() == 3:  # (batch, queries, keys)
        return mask.reshape(batch, 1, queries, keys)
    return mask


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's ``_masked_softmax``: masked positions get 0, and a row masked entirely is NaN,
    as PyTorch's CPU kernel makes it; a floating-point mask is added to the scores."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    if mask.dtype != torch.bool:
        return torch.softmax(scores + mask, dim=-1)
    return torch.softmax(scores.masked_fill(mask.expand(scores.shape), -math.inf), dim=-1)


def _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
               mask, need_weights, average_attn_weights, mask_type):
    batch, queries, _ = query.shape
    keys = key.shape[1]
    head = embed_dim // num_head
    if query is key and key is value:
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        w_q, w_k, w_v = qkv_weight.chunk(3, dim=0)
        b_q, b_k, b_v = qkv_bias.chunk(3, dim=0)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    def heads(t: torch.Tensor, n: int) -> torch.Tensor:
        return t.reshape(batch, n, num_head, head).transpose(1, 2)

    q, k, v = heads(q, queries), heads(k, keys), heads(v, keys)
    # PyTorch scales the queries before the product (transform_bias_rescale_qkv)
    scores = torch.matmul(q / math.sqrt(head), k.transpose(-2, -1))
    if mask is not None:
        mask = _broadcast_mask(mask, mask_type, batch, queries, keys)
    weights = _masked_softmax(scores, mask)
    out = torch.matmul(weights, v).transpose(1, 2).reshape(batch, queries, embed_dim)
    out = F.linear(out, proj_weight, proj_bias)
    if not need_weights:
        return out, out.new_empty((0,))
    return out, weights.mean(dim=1) if average_attn_weights else weights


@composite(aten._native_multi_head_attention.default)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    """``nn.MultiheadAttention``'s fast path: (batch, length, embed) inputs, one packed
    in-projection, the output projection; attention weights per head or averaged."""
    _nested(query, key, value)
    return _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                      mask, need_weights, average_attn_weights, mask_type)


@composite(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """``nn.TransformerEncoderLayer``'s fast path: self-attention and the feed-forward block,
    each with its residual, layer norms before (``norm_first``) or after."""
    _nested(src, mask)
    shape = (embed_dim,)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                   mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    h = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + x
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x


@composite(aten._masked_softmax.default)
def masked_softmax(x, mask, dim=None, mask_type=None):
    """The softmax the fused kernels use: True in ``mask`` masks a position out (to 0); a row
    masked entirely is NaN, as on CPU. ``mask_type`` 0 is a (queries, keys) mask and 1 a (batch, keys)
    padding mask of a (batch, heads, queries, keys) input; otherwise the mask has the input's
    shape or broadcasts to it."""
    if mask_type == _ATTN_MASK and x.dim() == 4:
        mask = mask.reshape(1, 1, *mask.shape[-2:])
    elif mask_type == _KEY_PADDING and x.dim() == 4:
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[-1])
    dim = x.dim() - 1 if dim is None else dim
    return torch.softmax(x.masked_fill(mask.to(torch.bool).expand(x.shape), -math.inf), dim=dim)
