"""``torch_tpu._internal.optim`` (``.adamw``, ``.patch``): TorchTPU's AdamW and its optimizer
patches.

:class:`AdamW` is ``torch.optim.AdamW`` with its state (``step``, ``exp_avg``, ``exp_avg_sq``
and, with ``amsgrad``, ``max_exp_avg_sq``) made when the optimizer is made rather than at
the first step: a compiled training step then finds the state on the device instead of
allocating it inside the graph. The update is PyTorch's own, so each step equals
``torch.optim.AdamW``'s.

``patch_optimizer_graph_breaks()`` is TorchTPU's workaround for dynamo breaking the graph at
an optimizer's state initialization; with the state made up front there is nothing left to
patch here, so it and ``unpatch_optimizer_graph_breaks()`` change nothing.
"""

from __future__ import annotations

import torch
from torch.optim import optimizer as _optimizer

__all__ = ["AdamW", "patch_optimizer_graph_breaks", "unpatch_optimizer_graph_breaks"]


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments, same steps) with its state made at construction.

    Example::

        opt = AdamW(model.parameters(), lr=1e-3)
        loss.backward(); opt.step()
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._make_state()

    def _make_state(self) -> None:
        # the state torch.optim.AdamW's first step would make (torch/optim/adam.py's _init_group):
        # the step count on the host unless the step is capturable or fused
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad or self.state[p]:
                    continue
                state = self.state[p]
                on_device = group["capturable"] or group["fused"]
                scalar = _optimizer._get_scalar_dtype(is_fused=group["fused"])
                state["step"] = (torch.zeros((), dtype=scalar, device=p.device) if on_device
                                 else torch.tensor(0.0, dtype=_optimizer._get_scalar_dtype()))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def patch_optimizer_graph_breaks() -> None:
    """Nothing to patch here (see the module)."""


def unpatch_optimizer_graph_breaks() -> None:
    """Nothing was patched (see the module)."""
