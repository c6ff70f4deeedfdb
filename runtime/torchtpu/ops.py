"""``torch_tpu.ops`` and ``torch_tpu._internal.ops`` (``.jagged``): TorchTPU's jagged-tensor
helpers, which are PyTorch code and run here as they do on a TPU.

``align_jagged_to_multiple(nt, multiple=128)`` pads a ``torch.jagged`` nested tensor's flat
values to a multiple of ``multiple`` rows (the sequences and their offsets unchanged), so
batches of varying total length share a few compiled shapes; ``strip_jagged_padding(nt)``
drops those rows again (``valid_tokens`` given, without reading the offsets back from the
device). Splash attention is in :mod:`.splash_attention` (``torch_tpu.ops.splash_attention``).

``torch.ops.torch_tpu.ragged_dot(lhs, rhs, group_sizes)`` is TorchTPU's grouped matmul of
mixture-of-experts layers (its examples call it on ``tpu`` tensors, in training too); its
benchmarks' Qwen 3.5 MoE layer looks for it as ``torch.ops.tpu.ragged_dot``, the same op under
the device's own namespace. Both are defined when the device registers (:func:`register_ops`).
"""

from __future__ import annotations

import torch
from torch.nested._internal import nested_tensor as _nested

__all__ = ["align_jagged_to_multiple", "ragged_dot", "register_ops", "strip_jagged_padding"]

_library: list[torch.library.Library] = []


def align_jagged_to_multiple(nt: torch.Tensor, multiple: int = 128,
                             padding_value: float | bool = 0.0) -> torch.Tensor:
    """``nt`` with its values padded by ``padding_value`` rows to a multiple of ``multiple``
    (``nt`` itself when they already are); the offsets are shared."""
    values = nt.values()
    short = -values.size(0) % multiple
    if short == 0:
        return nt
    padding = torch.full((short, *values.shape[1:]), padding_value, dtype=values.dtype, device=values.device)
    return _nested.nested_view_from_values_offsets(torch.cat([values, padding]), nt.offsets())


def strip_jagged_padding(nt: torch.Tensor, valid_tokens: int | None = None) -> torch.Tensor:
    """``nt`` without the values rows past its last offset (``valid_tokens`` rows kept; None:
    the last offset, read from the tensor)."""
    offsets = nt.offsets()
    if valid_tokens is None:
        valid_tokens = int(offsets[-1].item()) if offsets.numel() else 0
    if nt.values().size(0) == valid_tokens:
        return nt
    return _nested.nested_view_from_values_offsets(nt.values()[:valid_tokens], offsets)


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The rows of ``lhs`` (``[m, k]``) in consecutive groups of ``group_sizes`` (``[g]``) rows,
    group ``e`` times ``rhs[e]`` (``rhs``: ``[g, k, n]``): ``[m, n]``, the rows past the groups'
    total zeros, as XLA's ``lax.ragged_dot`` computes it.

    On ``tpu`` tensors it is PyTorch's ``_grouped_mm`` (one ``lax.ragged_dot_general`` here,
    differentiable, and traceable by ``torch.compile``); on others one product per group.

    Example::

        out = torch.ops.torch_tpu.ragged_dot(tokens_by_expert, expert_weights, tokens_per_expert)
    """
    torch._check(lhs.dim() == 2 and rhs.dim() == 3 and group_sizes.dim() == 1,
                 lambda: f"ragged_dot takes lhs [m, k], rhs [g, k, n] and group_sizes [g]; got {tuple(lhs.shape)}, "
                         f"{tuple(rhs.shape)} and {tuple(group_sizes.shape)}")
    torch._check(lhs.size(1) == rhs.size(1) and rhs.size(0) == group_sizes.size(0),
                 lambda: f"ragged_dot: lhs {tuple(lhs.shape)}, rhs {tuple(rhs.shape)} and group_sizes "
                         f"{tuple(group_sizes.shape)} do not match (k, g)")
    if lhs.device.type == "tpu":
        return torch._grouped_mm(lhs, rhs, offs=torch.cumsum(group_sizes, 0, dtype=torch.int32))
    # PyTorch's CPU _grouped_mm takes only 16-byte-aligned strides: a product per group instead
    pieces, start = [], 0
    for group, size in enumerate(group_sizes.tolist()):
        pieces.append(lhs[start:start + size] @ rhs[group])
        start += size
    torch._check(start <= lhs.size(0), lambda: f"ragged_dot: group_sizes add up to {start}, past lhs's "
                                               f"{lhs.size(0)} rows")
    pieces.append(lhs.new_zeros(lhs.size(0) - start, rhs.size(2)))
    return torch.cat(pieces)


def register_ops() -> None:
    """Define ``torch.ops.torch_tpu.ragged_dot`` and ``torch.ops.tpu.ragged_dot`` (once; the
    device registration calls it)."""
    if _library:
        return
    # a fragment for "tpu": the namespace is the device's, and other code may add ops to it
    for namespace, kind in (("torch_tpu", "DEF"), ("tpu", "FRAGMENT")):
        library = torch.library.Library(namespace, kind)
        library.define("ragged_dot(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor")
        # composite: autograd, tracing and the runtime see the ops it is made of
        library.impl("ragged_dot", ragged_dot, "CompositeImplicitAutograd")
        _library.append(library)
