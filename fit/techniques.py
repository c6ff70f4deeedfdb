"""Memory techniques of a strong TPU training step, as the looped fit step compiles them.

Each is what a PyTorch user on TPU writes, modelled in the JAX program ``fit_scan`` builds:

- chunked linear cross-entropy (torchtune's and Liger's fused linear cross-entropy): the
  head's logits are made a chunk of positions at a time, each chunk's loss and gradient
  from its own logits, so the ``[batch, seq, vocab]`` logits are never whole;
- selective activation checkpointing (``torch.utils.checkpoint`` with
  ``create_selective_checkpoint_contexts``): which of a layer's values its backward keeps,
  as a ``jax.checkpoint`` policy (``POLICIES``);
- activation offload to host memory (``torch.autograd.graph.save_on_cpu``): the kept values
  moved to XLA's host memory space (``pinned_host``) in the forward and back in the backward;
- MaxText's named policy for Llama 3.1 on v6e (``remat_policy: custom``): each layer's input
  and the attention's queries, keys and values offloaded to host memory by name
  (``jax.ad_checkpoint.checkpoint_name``), everything else recomputed;
- splash attention (TorchTPU's ``torch.tpu.ops.splash_sdpa``): JAX's Pallas TPU kernel
  (``jax.experimental.pallas.ops.tpu.splash_attention``), blocked over queries and keys,
  the blocks above the causal diagonal skipped.
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
from tpu_debug.fit import moe as fit_moe
from tpu_debug.fit import scan as fit_scan
from tpu_debug.runtime.ops.registry import lower
from tpu_debug.runtime.target.errors import TargetError

__all__ = [
    "ATTENTIONS",
    "CHUNKED_NOTE",
    "FLASH_NOTE",
    "LOSSES",
    "LOSS_CHUNK",
    "NOTES",
    "POLICIES",
    "SPLASH_NOTE",
    "Policy",
    "attention_as",
    "chunked_cross_entropy",
    "chunked_head_loss",
    "flash_attention",
    "head_as_hidden",
    "hidden_of",
    "kv_unrepeated",
    "policy",
    "splash_attention",
    "splash_kernel_flops",
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
        g_hidden.append(
            jnp.einsum("bsv,vh->bsh", g, weight, preferred_element_type=jnp.float32).astype(hidden.dtype)
        )
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
        raise TargetError(
            f"{type(model).__name__}: loss='chunked' needs a bias-free linear head whose logits "
            "the model does not scale or cap; use loss='plain'"
        )
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
CHUNKED_NOTE = (
    f"the loss chunked: the head's logits, cross-entropy and their gradients {LOSS_CHUNK} positions "
    "at a time, one chunk after another, the [batch, seq, vocab] logits never whole (a fused linear "
    "cross-entropy)"
)


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


# the values MaxText's Llama 3.1 runs on v6e offload by name (its ``decoder_layer_input``,
# ``query_proj``, ``key_proj``, ``value_proj``): the loop body tags its input, the attention
# (``flash_attention``, ``splash_attention``) its queries, keys and values as SDPA gets them,
# after the rotary embedding, the keys and values with their own heads (``kv_unrepeated``):
# the projections' outputs have the same shapes and bytes
OFFLOADED_NAMES = ("decoder_layer_input", "query_proj", "key_proj", "value_proj")


def _maxtext():
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(OFFLOADED_NAMES),
        offload_src="device", offload_dst="pinned_host")


def _named(q, k, v):
    """The attention's inputs tagged for a policy that names them (``OFFLOADED_NAMES``)."""
    from jax.ad_checkpoint import checkpoint_name

    return checkpoint_name(q, "query_proj"), checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")


POLICIES = {
    p.name: p
    for p in (
        Policy(
            "matmuls",
            "its weight matmuls' outputs, recomputing the elementwise ops and the attention scores "
            "(jax.checkpoint's dots_with_no_batch_dims_saveable)",
            "no checkpointing: autograd keeps every activation (the elementwise ops are fused and "
            "recomputed by "
            "XLA)",
            lambda: jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        ),
        Policy(
            "full",
            "only its input (activation checkpointing: the backward recomputes the layer)",
            "torch.utils.checkpoint.checkpoint(layer, hidden, use_reentrant=False)",
            lambda: jax.checkpoint_policies.nothing_saveable,
        ),
        Policy(
            "all-matmuls",
            "every matmul's output, the attention's scores and probabilities included "
            "(jax.checkpoint's dots_saveable)",
            "create_selective_checkpoint_contexts([torch.ops.aten.mm.default, torch.ops.aten.bmm.default])",
            lambda: jax.checkpoint_policies.dots_saveable,
        ),
        Policy(
            "offload",
            "its weight matmuls' outputs moved to host memory (XLA's pinned_host memory space) in the "
            "forward and back in the backward, recomputing the rest",
            "with torch.autograd.graph.save_on_cpu(pin_memory=True): loss = model(tokens)...",
            _offloaded,
        ),
        Policy(
            "maxtext",
            "its input and the attention's queries, keys and values, moved to host memory (XLA's "
            "pinned_host memory space) in the forward and back in the backward, recomputing everything "
            "else (MaxText's remat_policy custom with decoder_layer_input, query_proj, key_proj and "
            "value_proj offloaded: jax.checkpoint's save_and_offload_only_these_names)",
            "h = checkpoint(layer, h, use_reentrant=False, context_fn=lambda: "
            "create_selective_checkpoint_contexts(keep_qkv))  # each decoder layer: keep_qkv returns "
            "CheckpointPolicy.MUST_SAVE for the q/k/v projections' aten.mm, PREFER_RECOMPUTE for the rest; "
            "the step under torch.autograd.graph.save_on_cpu(pin_memory=True), so what is kept (each "
            "layer's input, q/k/v) waits in host memory",
            _maxtext,
        ),
    )
}


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
    "attention": "attention: torch.tpu.ops.splash_sdpa(q, k, v, ...) (TorchTPU's splash attention kernel) "
    "in place "
    "of F.scaled_dot_product_attention",
    "dtype": "model.to(torch.bfloat16)",
    "master_dtype": "keep the optimizer on the bfloat16 parameters (no float32 master copy)",
    "batch": "halve the batch (gradient accumulation over 2 micro-batches keeps the global batch)",
}


def torch_code(change: dict) -> str:
    """The PyTorch change a fix's options (``fit`` keywords) mean."""
    if "target" in change:
        return f"the same script on {change['target']} (fully_shard over every chip)"
    parts = [POLICIES[change["remat_policy"]].torch] if "remat_policy" in change else []
    return "; ".join([*parts, *(TORCH_CODE[k] for k in change if k in TORCH_CODE)])


def technique_fixes(options: dict, logits_bytes: int, capacity: int | None) -> list[tuple[str, dict]]:
    """The memory techniques worth compiling as fixes of a step run with ``options``:
    MaxText's way (splash attention with its offload policy, and the chunked loss when the
    logits are large), the chunked loss when the whole float32 logits of a chip
    (``logits_bytes``) are an eighth of its HBM or more, flash attention, activation offload
    to host memory, and the chunked loss with flash attention and activation checkpointing;
    each ``(what, fit keywords)``."""
    found = []
    chunk = options.get("loss", "plain") != "chunked" and capacity and logits_bytes * 8 >= capacity
    maxtext = {"attention": "splash", "remat_policy": "maxtext", **({"loss": "chunked"} if chunk else {})}
    if any(options.get(k) != v for k, v in maxtext.items()):
        # how MaxText trains Llama 3.1 on v6e (splash attention, each layer's input and q/k/v
        # offloaded, the rest recomputed), with the logits chunked when they are large
        found.append(("splash attention, MaxText's offload policy" + (" and the chunked loss" if chunk else "")
                      + " (--attention splash --remat-policy maxtext" + (" --chunked-loss)" if chunk else ")"),
                      maxtext))
    flash = options.get("attention", "blocked") not in ("flash", "splash")
    if flash:
        found.append(("flash attention (--attention flash)", {"attention": "flash"}))
    if chunk:
        found.append(("chunked loss (--chunked-loss)", {"loss": "chunked"}))
    if not options.get("remat") and not options.get("remat_policy"):
        found.append(
            ("activations offloaded to host memory (--remat-policy offload)", {"remat_policy": "offload"})
        )
        if chunk:
            found.append(
                (
                    "chunked loss, flash attention and activation checkpointing",
                    {"loss": "chunked", "remat": True, **({"attention": "flash"} if flash else {})},
                )
            )
    return found


# queries per block of flash attention: every key is in a block's scores (keys are not
# blocked), so a block of 256 holds what splash attention's 512 x 1024 blocks hold at 2048 keys;
# at 4 sequences x 32 heads x 8192 keys a block's float32 scores are 1 GiB per chip
FLASH_BLOCK = 256


def flash_attention(q, k, v, mask, is_causal: bool, scale: float | None, *, block: int = FLASH_BLOCK):
    """Attention a block of queries at a time with flash attention's backward, blocks in order.

    ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=..., scale=...)`` for
    ``[batch, heads, seq, dim]`` inputs (grouped-query keys and values with their own
    heads, named so, then repeated to the query heads here): each query block's float32 scores against every key give its output and its
    log-sum-exp (kept, ``[batch, heads, seq]``); the backward recomputes one block's scores
    from them and accumulates the keys' and values' gradients in float32, each block after
    the previous one (an optimization barrier). Blocked with ``jax.checkpoint`` and left
    unordered, XLA ran the blocks' backwards side by side: one layer's attention over
    4 x 32 heads x 8192 positions on a v6e chip needed 18.8 GiB of temporaries.
    """
    q, k, v = _named(q, k, v)
    if k.shape[-3] != q.shape[-3]:
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    scale = float(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
    seq = q.shape[-2]
    size = block if seq % block == 0 else seq
    mask = jnp.zeros((), jnp.float32) if mask is None else mask
    return _flash(q, k, v, mask, (bool(is_causal), scale, size))


def _scores(qb, k, mask, start: int, static):
    is_causal, scale, size = static
    s = jnp.einsum("...qd,...kd->...qk", qb, k, preferred_element_type=jnp.float32) * scale
    if is_causal:
        rows = start + jnp.arange(qb.shape[-2])
        s = jnp.where(rows[:, None] >= jnp.arange(k.shape[-2])[None, :], s, -jnp.inf)
    if mask.ndim:
        whole = mask.shape[-2] == k.shape[-2]  # a row per query (training: as many queries as keys)
        mb = jax.lax.slice_in_dim(mask, start, start + size, axis=-2) if whole else mask
        s = jnp.where(mb, s, -jnp.inf) if mb.dtype == jnp.bool_ else s + mb
    return s


def _flash_forward(q, k, v, mask, static):
    size = static[2]
    outs, stats, prev = [], [], jnp.zeros((), q.dtype)
    for start in range(0, q.shape[-2], size):
        qb, _ = jax.lax.optimization_barrier((jax.lax.slice_in_dim(q, start, start + size, axis=-2), prev))
        s = _scores(qb, k, mask, start, static)
        lse = jax.nn.logsumexp(s, axis=-1)
        prev = jnp.einsum(
            "...qk,...kd->...qd",
            jnp.exp(s - lse[..., None]).astype(v.dtype),
            v,
            preferred_element_type=jnp.float32,
        ).astype(q.dtype)
        outs.append(prev)
        stats.append(lse)
    out = jnp.concatenate(outs, axis=-2)
    return out, (q, k, v, mask, out, jnp.concatenate(stats, axis=-1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, mask, static):
    return _flash_forward(q, k, v, mask, static)[0]


def _flash_backward(static, saved, d_out):
    q, k, v, mask, out, lse = saved
    scale, size = static[1], static[2]
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    dk, dv, dq = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32), []
    for start in range(0, q.shape[-2], size):

        def part(x, start=start):
            return jax.lax.slice_in_dim(x, start, start + size, axis=x.ndim - 2 if x.ndim == q.ndim else -1)

        (qb, dob), (dk, dv) = jax.lax.optimization_barrier(((part(q), part(d_out)), (dk, dv)))
        p = jnp.exp(_scores(qb, k, mask, start, static) - part(lse)[..., None])
        dv = dv + jnp.einsum("...qk,...qd->...kd", p.astype(v.dtype), dob, preferred_element_type=jnp.float32)
        dp = jnp.einsum("...qd,...kd->...qk", dob, v, preferred_element_type=jnp.float32)
        ds = (p * (dp - part(delta)[..., None]) * scale).astype(q.dtype)
        dq.append(jnp.einsum("...qk,...kd->...qd", ds, k, preferred_element_type=jnp.float32).astype(q.dtype))
        dk = dk + jnp.einsum("...qk,...qd->...kd", ds, qb, preferred_element_type=jnp.float32)
    zero = np.zeros(mask.shape, jax.dtypes.float0) if mask.dtype == jnp.bool_ else jnp.zeros_like(mask)
    return jnp.concatenate(dq, axis=-2), dk.astype(k.dtype), dv.astype(v.dtype), zero


_flash.defvjp(_flash_forward, _flash_backward)


ATTENTIONS = ("blocked", "flash", "splash")
_OPS: dict = {}


def _attention_op_of(kind: str):
    """``tpu_debug::fit_<kind>_attention``: the layer's SDPA as one node lowered to ``kind``'s
    attention (``flash_attention``, ``splash_attention``)."""
    if kind not in _OPS:
        import torch

        name = f"fit_{kind}_attention"
        schema = "(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float? scale, bool gqa) -> Tensor"

        def never(q, k, v, mask, is_causal, scale, gqa):
            raise NotImplementedError(f"tpu_debug::{name} runs only in a fit's compiled layer")

        op = torch.library.custom_op(f"tpu_debug::{name}", never, mutates_args=(), schema=schema)

        @op.register_fake
        def _(q, k, v, mask, is_causal, scale, gqa):
            return q.new_empty((*q.shape[:-1], v.shape[-1]))

        attend = flash_attention if kind == "flash" else splash_attention

        def lowered(q, k, v, mask, is_causal, scale, gqa):
            return attend(q, k, v, mask, is_causal, scale)

        _OPS[kind] = getattr(torch.ops.tpu_debug, name).default
        lower(_OPS[kind])(lowered)
    return _OPS[kind]


def _unrepeated(node):
    """The ``[batch, kv_heads, seq, dim]`` node whose heads ``node`` repeats, each ``n`` times
    in place (head ``i`` of the result is head ``i // n``), and ``n``; else None.

    Hugging Face's ``repeat_kv`` (``x[:, :, None].expand(b, kv, n, s, d).reshape(b, kv * n,
    s, d)``) and ``torch.repeat_interleave(x, n, dim=1)`` both trace, decomposed, to
    ``unsqueeze(x, 2)``, ``expand`` to ``[b, kv, n, s, d]``, a ``clone`` and a ``view`` (or
    ``_unsafe_view``) to ``[b, kv * n, s, d]``; shapes are read from the nodes' metadata.
    """
    import torch

    aten = torch.ops.aten
    view_ops = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)

    def shape(n):
        val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return tuple(val.shape) if val is not None else None

    if not isinstance(node, torch.fx.Node) or node.target not in view_ops:
        return None
    source = node.args[0]
    if isinstance(source, torch.fx.Node) and source.target is aten.clone.default:
        source = source.args[0]
    if not isinstance(source, torch.fx.Node) or source.target is not aten.expand.default:
        return None
    unsqueezed = source.args[0]
    if not isinstance(unsqueezed, torch.fx.Node) or unsqueezed.target is not aten.unsqueeze.default:
        return None
    x = unsqueezed.args[0]
    out, expanded, base = shape(node), shape(source), shape(x)
    if out is None or expanded is None or base is None or len(base) != 4 or unsqueezed.args[1] not in (2, -3):
        return None
    b, kv, s, d = base
    n = expanded[2]
    if expanded != (b, kv, n, s, d) or out != (b, kv * n, s, d) or n <= 1:
        return None
    return x, n


def kv_unrepeated(gm) -> int:
    """Hand the flash and splash attention nodes of a traced layer its keys and values with
    their own heads, where the layer repeats them to the query heads before SDPA (Hugging
    Face's ``repeat_kv``, ``repeat_interleave``): the kernels group query heads over key
    heads themselves (query head ``i`` reads key head ``i // (heads // kv_heads)``, the
    repeat's order), so the values are the same, and what the attention names
    (``key_proj``, ``value_proj``: kept or offloaded by a named policy) is the projections'
    size, as MaxText's, not the repeated heads'. The blocked attention's graph is left as
    traced. Returns the number of nodes rewritten; the repeats left unused are dropped."""
    kernels = set(_OPS.values())
    done = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in kernels:
            continue
        q, k, v, *rest = node.args
        keys, values = _unrepeated(k), _unrepeated(v)
        if keys is None or values is None or keys[1] != values[1]:
            continue
        mask, is_causal, scale, _ = rest
        node.args = (q, keys[0], values[0], mask, is_causal, scale, True)
        done += 1
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


@contextlib.contextmanager
def attention_as(kind: str):
    """While tracing the looped step's layer, its SDPA node is ``kind``'s: ``"blocked"``
    (``fit_scan.blocked_attention``), ``"flash"`` (``flash_attention``) or ``"splash"``
    (``splash_attention``)."""

    if kind not in ATTENTIONS:
        raise TargetError(f"attention {kind!r} is not one of {', '.join(ATTENTIONS)}")
    if kind == "blocked":
        yield
        return
    saved = fit_scan._attention_op, fit_scan._layer_rewrite
    fit_scan._attention_op = functools.partial(_attention_op_of, kind)
    # the kernels' keys and values with their own heads (grouped-query): read at entry, so
    # the rewrite in use is this module's name at that time
    fit_scan._layer_rewrite = kv_unrepeated
    try:
        yield
    finally:
        fit_scan._attention_op, fit_scan._layer_rewrite = saved


# MaxText's splash attention blocks for Llama 3.1 at 8192 positions on v6e (every sa_block_*
# 2048, the fused backward kernel); a shorter sequence is one block
SPLASH_BLOCK = 2048


def splash_attention(q, k, v, mask, is_causal: bool, scale: float | None, *, block: int = SPLASH_BLOCK,
                     interpret: bool | None = None):
    """Causal attention as JAX's Pallas TPU splash attention kernel.

    ``F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=...)`` for
    ``[batch, heads, seq, dim]`` inputs (grouped-query keys and values as the kernel groups
    them: query head ``i`` reads key head ``i // (heads // kv_heads)``, as PyTorch's
    ``enable_gqa`` and Hugging Face's ``repeat_kv`` do): blocks of ``block`` queries against
    blocks of ``block`` keys, the blocks above the diagonal skipped, the fused backward
    kernel (``use_fused_bwd_kernel``). Compiled for a target mesh (``fit.moe.sharded``),
    each chip runs the kernel on its batch shard (a ``shard_map``: the partitioner cannot
    split a kernel's custom call). With no target mesh the kernel runs in Pallas's
    interpreter (on the host), except when the step is lowered for XLA's cost analysis only,
    where ``flash_attention`` stands in (a kernel's custom call has no cost analysis).

    A mask given is taken for the causal mask: the looped step trains on whole sequences
    (no padding), for which a causal LM's mask (Hugging Face's, made in the traced ``pre``
    piece) is causal; its values are a traced input here, so they are not read.

    Raises:
        TargetError: neither causal nor masked, or a mask that is not ``[..., seq, seq]``.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.sharding import PartitionSpec

    if not is_causal and (mask is None or mask.shape[-2:] != (q.shape[-2], k.shape[-2])):
        raise TargetError("attention='splash' models causal attention (is_causal, or a causal LM's "
                          f"[seq, seq] mask); got {'no mask' if mask is None else tuple(mask.shape)}: "
                          "use attention='flash'")
    routing = fit_moe._ROUTING
    if routing.counted:
        return flash_attention(q, k, v, None, True, scale)
    q, k, v = _named(q, k, v)
    heads, seq = q.shape[-3], q.shape[-2]
    size = min(block, seq)
    if seq % size:
        raise TargetError(f"attention='splash' needs the sequence ({seq}) a multiple of its blocks ({size})")
    q = q * jnp.asarray(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale, q.dtype)
    blocks = sk.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size, block_q_dkv=size,
                           block_kv_dkv=size, block_kv_dkv_compute=size, use_fused_bwd_kernel=True)

    def attend(q, k, v):
        # the kernel (its mask's block tables, arrays) is made inside the function traced, so
        # no array of an outer trace is closed over: a checkpointed layer traces it again,
        # and a custom_vjp's backward may not close over an outer trace's values
        kernel = sk.make_splash_mha(sm.MultiHeadMask([sm.CausalMask((seq, seq))] * heads), head_shards=1,
                                    q_seq_shards=1, block_sizes=blocks,
                                    interpret=routing.mesh is None if interpret is None else interpret)
        return jax.vmap(kernel)(q, k, v)

    per_chip = _without_x64(attend)

    if routing.mesh is None or not routing.axes:
        return per_chip(q, k, v)
    split = PartitionSpec(routing.axes)
    return jax.shard_map(per_chip, mesh=routing.mesh, in_specs=(split, split, split), out_specs=split,
                         check_vma=False)(q, k, v)


def splash_kernel_flops(ins: Any, computation: Any) -> float | None:
    """The flops a splash attention kernel's custom call computes (no cost analysis counts a
    Pallas kernel's): its query blocks against the key blocks on and below the causal diagonal
    (blocks of :data:`SPLASH_BLOCK`), two products per block pair forward
    (``splash_mha_fwd*``: q k^T and p v), five for the fused backward (``splash_mha_dkv*``:
    the scores again, then dp, dv, dk and dq); None for another custom call.

    Example::

        op_by_op(hlo, target, repeats, splash_kernel_flops)
    """
    name = str(ins.name)
    products = 2 if name.startswith("splash_mha_fwd") else 5 if name.startswith("splash_mha_dkv") else 0
    if not products:
        return None
    # the queries: the largest [batch, heads, seq, dim] operand ([heads, seq, dim] for one sequence)
    queries = max((o.shape.array for o in map(computation.get, ins.operands)
                   if o is not None and o.shape.array is not None and len(o.shape.array.dims) in (3, 4)),
                  key=lambda a: a.elements or 0, default=None)
    if queries is None:
        return None
    batch, heads, seq, dim = (1, *queries.dims) if len(queries.dims) == 3 else queries.dims
    blocks = max(1, seq // min(SPLASH_BLOCK, seq))
    causal = blocks * (blocks + 1) / 2 / blocks**2  # the block pairs the kernel computes
    return products * 2.0 * batch * heads * seq * seq * dim * causal


def _without_x64(fn):
    """``fn`` (arrays in and out, differentiable) traced with 64-bit types off, its backward
    too: the fit step is traced with them on (int64 tokens), and Pallas's TPU lowering of the
    splash kernel then meets int64 grid indices it cannot multiply with its int32 ones. The
    backward is ``jax.vjp``'s function of the forward, kept as the residuals (a pytree of
    the kernel's own residuals)."""

    @jax.custom_vjp
    def run(*args):
        with jax.enable_x64(False):
            return fn(*args)

    def forward(*args):
        with jax.enable_x64(False):
            return jax.vjp(fn, *args)

    def backward(vjp, cotangent):
        with jax.enable_x64(False):
            return vjp(cotangent)

    run.defvjp(forward, backward)
    return run


# MaxText's scoped VMEM limit for dense models (its xla_flags_library's DENSE_VMEM_LIMIT_FLAG,
# set on these runs): the splash kernel's blocks of 2048 with the fused backward need more
# VMEM per op than the compiler's default scope (CompileTimeScopedVmemOom on v6e without it)
SPLASH_OPTIONS = {"xla_tpu_scoped_vmem_limit_kib": 98304}


def compiler_options(attention: str) -> dict | None:
    """The TPU compiler options a step with ``attention`` is compiled with (None: the defaults)."""
    return dict(SPLASH_OPTIONS) if attention == "splash" else None


# the answer's "compiled as" for splash attention
SPLASH_NOTE = (
    f"attention as splash attention (JAX's Pallas TPU kernel, the kernel TorchTPU's splash_sdpa runs): "
    f"blocks of {SPLASH_BLOCK} queries against blocks of {SPLASH_BLOCK} keys (a shorter sequence is one "
    "block), the blocks above the causal "
    "diagonal skipped, the fused backward kernel, each chip on its own sequences, the compiler's scoped "
    "VMEM limit at MaxText's 96 MiB (xla_tpu_scoped_vmem_limit_kib)"
)


# the answer's "compiled as" for flash attention
FLASH_NOTE = (
    f"attention as flash attention: {FLASH_BLOCK} queries at a time against every key, the output "
    "and its log-sum-exp kept, the backward recomputing one block's scores at a time, blocks in order"
)
# the answer's "compiled as" for each attention but the default
NOTES = {"flash": FLASH_NOTE, "splash": SPLASH_NOTE}
