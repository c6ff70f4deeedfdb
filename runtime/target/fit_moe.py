"""Mixture-of-experts layers for ``fit``: a static-shape dispatch that traces.

transformers' experts (``MixtralExperts`` and the other ``@use_experts_implementation``
classes) pick the tokens of each expert with ``nonzero``/``torch.where`` and loop over
the experts that were hit: shapes that depend on the router's values, which a trace on
data-free tensors does not have. Its ``batched_mm`` implementation traces, but gathers
one copy of an expert's weights per token (tokens x 2 x hidden x intermediate), and
``grouped_mm`` sizes its groups from the routing.

What a TPU MoE compiles instead is a dispatch of static shape. This module registers,
as an experts implementation, the one MaxText compiles with a capacity factor
(``moe.py``'s ``dense_matmul`` with ``capacity_factor`` > 0, after GShard): each
sequence is a group; each expert takes at most ``capacity = ceil(seq x top_k x factor /
experts)`` of the group's token choices, in token order (later ones are dropped); a
one-hot dispatch mask ``(batch, seq, experts, capacity)`` gathers them into
``(batch, experts, capacity, hidden)`` by an einsum, the experts' matmuls run on that,
and the combine mask (the dispatch mask times the router weights) sums them back.
The experts' matmuls cost ``top_k x factor`` experts per token, not all of them; the
dispatch and combine einsums add ``4 x seq x top_k x factor x hidden`` flops per
token in the forward (2 each; the backward twice that), and their masks are
activations of the step.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["CAPACITY_FACTOR", "IMPLEMENTATION", "idle_parameters", "is_moe", "prepare"]

IMPLEMENTATION = "tpu_debug_capacity"
#: MaxText's capacity factor for a dropping MoE: each expert takes its even share of the choices
CAPACITY_FACTOR = 1.0
_GROUP = "_tpu_debug_moe_group"


def is_moe(config: Any) -> bool:
    """True for a config whose layers route tokens to experts (``num_local_experts`` > 1)."""
    return (getattr(config, "num_local_experts", 0) or 0) > 1


def prepare(config: Any, seq: int) -> bool:
    """Make an MoE config's experts trace with the capacity dispatch, one group per sequence.

    Returns True when the config has experts (and was changed), False otherwise.
    """
    if not is_moe(config):
        return False
    _register()
    setattr(config, _GROUP, int(seq))
    config._experts_implementation = IMPLEMENTATION
    return True


def _register() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    from tpu_debug.runtime.ops.prims import register as register_prims

    register_prims()  # the router's in-place ``/=`` decomposes to ``prims.div``

    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(IMPLEMENTATION, capacity_experts_forward)


def _masks(top_k_index, top_k_weights, groups: int, experts: int, capacity: int):
    """Dispatch and combine masks ``(groups, group_tokens, experts, capacity)``."""
    import torch

    tokens, top_k = top_k_index.shape
    choices = top_k_index.reshape(groups, (tokens // groups) * top_k)
    expert = (choices[..., None] == torch.arange(experts, device=choices.device)).to(torch.int32)
    # a choice's place in its expert's queue: earlier tokens (and their first choice) first
    position = ((expert.cumsum(1) - 1) * expert).sum(-1)
    slot = (position[..., None] == torch.arange(capacity, device=choices.device)).to(torch.int32)
    mask = (expert[..., None] * slot[..., None, :]).view(groups, tokens // groups, top_k, experts, capacity)
    weights = top_k_weights.reshape(groups, tokens // groups, top_k, 1, 1)
    dispatch = mask.sum(2)
    combine = (mask.to(weights.dtype) * weights).sum(2)
    return dispatch, combine


def capacity_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts' output for ``(tokens, hidden)`` states with the capacity dispatch."""
    import torch

    if getattr(self, "has_bias", False) or not getattr(self, "has_gate", True):
        raise NotImplementedError("the capacity dispatch handles gated experts without biases "
                                  "(gate_up_proj, down_proj)")
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    experts = self.num_experts
    group = getattr(self.config, _GROUP, None) or tokens
    groups = tokens // group if tokens % group == 0 else 1
    capacity = max(1, math.ceil((tokens // groups) * top_k * CAPACITY_FACTOR / experts))
    dispatch, combine = _masks(top_k_index, top_k_weights, groups, experts, capacity)
    x = hidden_states.view(groups, tokens // groups, hidden)
    routed = torch.einsum("gsec,gsh->gech", dispatch.to(x.dtype), x)
    gate_up, down = self.gate_up_proj, self.down_proj
    if getattr(self, "is_transposed", False):  # (experts, hidden, 2 x intermediate)
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    projected = torch.einsum("gech,eih->geci", routed, gate_up)
    activated = self._apply_gate(projected)
    out = torch.einsum("geci,ehi->gech", activated, down)
    combined = torch.einsum("gsec,gech->gsh", combine.to(out.dtype), out)
    return combined.reshape(tokens, hidden).to(hidden_states.dtype)


def idle_parameters(model: Any, config: Any) -> int:
    """The experts' parameters a token does not run through (all but ``top_k`` of each layer's)."""
    if not is_moe(config):
        return 0
    experts = config.num_local_experts
    top_k = getattr(config, "num_experts_per_tok", experts)
    total = sum(p.numel() for name, p in model.named_parameters()
                if ".experts." in f".{name}" and p.dim() == 3 and p.shape[0] == experts)
    return total * (experts - top_k) // experts
