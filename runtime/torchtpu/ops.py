"""``torch_tpu.ops`` and ``torch_tpu._internal.ops`` (``.jagged``): TorchTPU's jagged-tensor
helpers, which are PyTorch code and run here as they do on a TPU.

``align_jagged_to_multiple(nt, multiple=128)`` pads a ``torch.jagged`` nested tensor's flat
values to a multiple of ``multiple`` rows (the sequences and their offsets unchanged), so
batches of varying total length share a few compiled shapes; ``strip_jagged_padding(nt)``
drops those rows again (``valid_tokens`` given, without reading the offsets back from the
device). Splash attention is in :mod:`.splash_attention` (``torch_tpu.ops.splash_attention``).
"""

from __future__ import annotations

import torch
from torch.nested._internal import nested_tensor as _nested

__all__ = ["align_jagged_to_multiple", "strip_jagged_padding"]


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
