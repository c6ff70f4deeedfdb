"""Memory techniques of a strong TPU training step, as the looped fit step compiles them.

Each is what a PyTorch user on TPU writes, modelled in the JAX program ``fit_scan`` builds:

- chunked linear cross-entropy (torchtune's and Liger's fused linear cross-entropy): the
  head's logits are made a chunk of positions at a time, each chunk's loss and gradient
  from its own logits, so the ``[batch, seq, vocab]`` logits are never whole;
- selective activation checkpointing (``torch.utils.checkpoint`` with
  ``create_selective_checkpoint_contexts``): which of a layer's values its backward keeps,
  as a ``jax.checkpoint`` policy (``POLICIES``);
- activation offload to host memory (``torch.autograd.graph.save_on_cpu``): the kept values
  moved to XLA's host memory space (``pinned_host``) in the forward and back in the backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tpu_debug.runtime.target.errors import TargetError

__all__ = [
    "CHUNKED_NOTE",
    "LOSSES",
    "LOSS_CHUNK",
    "POLICIES",
    "Policy",
    "chunked_cross_entropy",
    "chunked_head_loss",
    "head_as_hidden",
    "hidden_of",
    "policy",
    "traced_loss",
]

# positions of the sequence per chunk of the chunked loss: 4 sequences x 512 x a 128K
# vocabulary are 1 GiB of float32 logits per chip, against 16 GiB whole at 4 x 8192
LOSS_CHUNK = 512
LOSSES = ("plain", "chunked")


def chunked_cross_entropy(hidden, weight, labels, *, chunk: int = LOSS_CHUNK):
    """Next-token cross-entropy of ``hidden @ weight.T`` without the whole logits.

    ``F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())`` with
    ``logits = hidden @ weight.T``: the mean over every position but the last of
    ``logsumexp(logits) - logits[label]``, as a fused linear cross-entropy computes it
    (Liger's): the sequence is cut into chunks of ``chunk`` positions, and each chunk's
    float32 logits give its loss and, at once, its share of the gradients (``softmax -
    one_hot``, times the hidden states and the weight), so no logits outlive their chunk and
    none are recomputed. The backward only scales the gradients made in the forward.

    Each chunk waits for the previous one's weight gradient (an optimization barrier), so
    XLA runs the chunks one after another: left free, it scheduled chunks side by side and
    kept several chunks' logits live (a [1, 4096] sequence over 4096 entries: 20 MiB of
    temporaries at chunks of 512, 80 MiB at chunks of 1024). The chunks are unrolled: XLA's
    cost analysis counts a loop's body once.

    Args:
        hidden: ``[batch, seq, hidden]``, the final norm's output.
        weight: the head's ``[vocab, hidden]`` weight.
        labels: ``[batch, seq]`` token ids; position ``i`` predicts ``labels[:, i + 1]``.
        chunk: positions per chunk.

    Returns:
        The mean loss, a float32 scalar.
    """
    return _fused_loss(hidden, weight, labels, chunk)


def _fused(hidden, weight, labels, chunk: int):
    """(loss, its gradient for ``hidden``, for ``weight``), a chunk of positions at a time."""
    batch, seq = labels.shape
    count = batch * (seq - 1)
    targets = jnp.concatenate([labels[:, 1:], jnp.zeros_like(labels[:, :1])], axis=1).astype(jnp.int32)
    total = jnp.float32(0.0)
    g_weight = jnp.zeros(weight.shape, jnp.float32)  # summed over the chunks in float32
    g_hidden = []
    for start in range(0, seq, chunk):
        stop = min(start + chunk, seq)
        h, g_weight = jax.lax.optimization_barrier((hidden[:, start:stop], g_weight))
        logits = jnp.einsum("bsh,vh->bsv", h, weight, preferred_element_type=jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        t = targets[:, start:stop]
        keep = (jnp.arange(start, stop) < seq - 1)[None, :]
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        total = total + jnp.sum(jnp.where(keep, lse - picked, 0.0))
        probs = jnp.exp(logits - lse[..., None])
        g = (probs - jax.nn.one_hot(t, weight.shape[0], dtype=jnp.float32)) * (keep[..., None] / count)
        g = g.astype(hidden.dtype)  # the logits' gradient in the matmuls' dtype, as autograd's
        g_hidden.append(jnp.einsum("bsv,vh->bsh", g, weight, preferred_element_type=jnp.float32)
                        .astype(hidden.dtype))
        g_weight = g_weight + jnp.einsum("bsv,bsh->vh", g, h, preferred_element_type=jnp.float32)
    return total / count, jnp.concatenate(g_hidden, axis=1), g_weight.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused_loss(hidden, weight, labels, chunk):
    return _fused(hidden, weight, labels, chunk)[0]


def _fused_forward(hidden, weight, labels, chunk):
    loss, g_hidden, g_weight = _fused(hidden, weight, labels, chunk)
    return loss, (g_hidden, g_weight, labels)


def _fused_backward(chunk, saved, cotangent):
    g_hidden, g_weight, labels = saved
    zero = np.zeros(labels.shape, dtype=jax.dtypes.float0)  # token ids have no gradient
    return (g_hidden * cotangent.astype(g_hidden.dtype), g_weight * cotangent.astype(g_weight.dtype), zero)


_fused_loss.defvjp(_fused_forward, _fused_backward)


@contextlib.contextmanager
def head_as_hidden(model):
    """While tracing, the model's output head hands on its input: the traced ``post`` piece
    returns the final norm's output, and the loss is ``chunked_head_loss``'s. Yields the
    head weight's name in ``model.named_parameters()`` (the embedding's when tied).

    Raises:
        TargetError: the head is not a linear map without bias (a chunked loss needs
            ``hidden @ weight.T``), or the model scales or caps its logits.
    """
    from torch import nn

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    capped = getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
    if not isinstance(head, nn.Linear) or head.bias is not None or capped:
        raise TargetError(f"{type(model).__name__}: loss='chunked' needs a bias-free linear head whose logits "
                          "the model does not scale or cap; use loss='plain'")
    name = next(n for n, p in model.named_parameters() if p is head.weight)
    head.forward = lambda x: x  # an instance attribute: nn.Module.__call__ finds it first
    try:
        yield name
    finally:
        del head.forward


def hidden_of(outputs, labels):
    """The traced ``post`` piece's output when the head hands on its input (``head_as_hidden``)."""
    return outputs.logits if hasattr(outputs, "logits") else outputs


@contextlib.contextmanager
def traced_loss(model, chunked: bool):
    """While tracing the looped step's pieces: with ``chunked``, the head hands on its input
    (``head_as_hidden``) and this yields the loss of ``post``'s output
    (``chunked_head_loss``); else it yields None (``post`` computes the loss)."""
    if not chunked:
        yield None
        return
    with head_as_hidden(model) as name:
        yield chunked_head_loss(name)


# the answer's "compiled as" for the chunked loss
CHUNKED_NOTE = (f"the loss chunked: the head's logits, cross-entropy and their gradients {LOSS_CHUNK} positions "
                "at a time, one chunk after another, the [batch, seq, vocab] logits never whole (a fused linear "
                "cross-entropy)")


def chunked_head_loss(weight_name: str, *, chunk: int = LOSS_CHUNK) -> Callable:
    """``(hidden, outer weights by name, labels) -> loss`` for ``fit_scan.scan_step``: the
    chunked loss over the head weight ``weight_name``."""

    def loss(hidden, outer: dict, labels):
        return chunked_cross_entropy(hidden, outer[weight_name], labels, chunk=chunk)

    return loss


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """A named activation-checkpointing policy of the looped step.

    Attributes:
        name: the option's value (``remat=...``, ``--remat-policy``).
        keeps: what each layer keeps for its backward, for the answer's "compiled as".
        torch: the PyTorch code that keeps the same values.
        make: builds the ``jax.checkpoint`` policy.
    """

    name: str
    keeps: str
    torch: str
    make: Callable[[], Any]


def _offloaded():
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


POLICIES = {p.name: p for p in (
    Policy("matmuls", "its weight matmuls' outputs, recomputing the elementwise ops and the attention scores "
           "(jax.checkpoint's dots_with_no_batch_dims_saveable)",
           "no checkpointing: autograd keeps every activation (the elementwise ops are fused and recomputed by "
           "XLA)", lambda: jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    Policy("full", "only its input (activation checkpointing: the backward recomputes the layer)",
           "torch.utils.checkpoint.checkpoint(layer, hidden, use_reentrant=False)",
           lambda: jax.checkpoint_policies.nothing_saveable),
    Policy("all-matmuls", "every matmul's output, the attention's scores and probabilities included "
           "(jax.checkpoint's dots_saveable)",
           "create_selective_checkpoint_contexts([torch.ops.aten.mm.default, torch.ops.aten.bmm.default])",
           lambda: jax.checkpoint_policies.dots_saveable),
    Policy("offload", "its weight matmuls' outputs moved to host memory (XLA's pinned_host memory space) in the "
           "forward and back in the backward, recomputing the rest",
           "with torch.autograd.graph.save_on_cpu(pin_memory=True): loss = model(tokens)...",
           _offloaded),
)}


def policy(name: str) -> Policy:
    """The named policy (``POLICIES``).

    Raises:
        TargetError: an unknown name, with the known ones.
    """
    if name not in POLICIES:
        raise TargetError(f"remat policy {name!r} is not one of {', '.join(POLICIES)}")
    return POLICIES[name]


# the PyTorch change each of ``fit``'s options means, for the fixes' answer (one line or a
# short snippet a user on TorchTPU writes)
TORCH_CODE = {
    "remat": "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})  "
             "# torch.utils.checkpoint around each decoder layer",
    "loss": "loss = sum(F.cross_entropy((h[:, i:i + 512] @ model.lm_head.weight.T).float().flatten(0, 1), "
            "y[:, i:i + 512].flatten(), reduction='sum') for i in range(0, seq, 512)) / n  "
            "# or liger_kernel's LigerFusedLinearCrossEntropyLoss",
    "dtype": "model.to(torch.bfloat16)",
    "master_dtype": "keep the optimizer on the bfloat16 parameters (no float32 master copy)",
    "batch": "halve the batch (gradient accumulation over 2 micro-batches keeps the global batch)",
}


def torch_code(change: dict) -> str:
    """The PyTorch change a fix's options (``fit`` keywords) mean."""
    if "remat_policy" in change:
        return POLICIES[change["remat_policy"]].torch
    if "target" in change:
        return f"the same script on {change['target']} (fully_shard over every chip)"
    return "; ".join(TORCH_CODE[k] for k in change if k in TORCH_CODE)


def technique_fixes(options: dict, logits_bytes: int, capacity: int | None) -> list[tuple[str, dict]]:
    """The memory techniques worth compiling as fixes of a step run with ``options``:
    the chunked loss when the whole float32 logits of a chip (``logits_bytes``) are an
    eighth of its HBM or more, activation offload to host memory, and the chunked loss with
    activation checkpointing; each ``(what, fit keywords)``."""
    found = []
    chunk = options.get("loss", "plain") != "chunked" and capacity and logits_bytes * 8 >= capacity
    if chunk:
        found.append(("chunked loss (--chunked-loss)", {"loss": "chunked"}))
    if not options.get("remat") and not options.get("remat_policy"):
        found.append(("activations offloaded to host memory (--remat-policy offload)", {"remat_policy": "offload"}))
        if chunk:
            found.append(("chunked loss and activation checkpointing (--chunked-loss --remat)",
                          {"loss": "chunked", "remat": True}))
    return found
