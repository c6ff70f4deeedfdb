"""A training step whose decoder layers run as one loop: every layer in the program, one compiled.

A Hugging Face decoder model is a stack of identical layers between an embedding and
a head. Compiled unrolled, a 32-layer step is 32 copies of the layer for the TPU
compiler to schedule (a minute and 4.7 GB of host memory for Llama-3-8B here, more
for 70B). Compiled as ``jax.lax.scan`` over the layers' stacked parameters, as
MaxText and torch_xla's ``scan_layers`` compile big models, the compiler schedules
one layer body, and the whole model is still in the program: its memory analysis
counts every layer's saved activations (stacked), so no figure is extrapolated.

The pieces are traced from the PyTorch model itself (``make_fx``, compiled mode's
decompositions, the runtime's lowerings), each forward only:

- ``pre``: the model's forward up to the first layer (embedding, rotary tables, the
  mask), its outputs the first layer's inputs;
- ``layer``: layer 0 as a function of its parameters, the hidden states and the
  other inputs ``pre`` gave it (every layer gets the same ones);
- ``post``: from the last layer's output to the loss (final norm, head,
  next-token cross-entropy).

The backward is JAX's: ``jax.value_and_grad`` of ``post(scan(layer, pre(...)))``.
Under FSDP each layer's weights are gathered in the loop body and named, and the
body is a ``jax.checkpoint`` that saves every activation except the gathered
weights (gathered again in the backward, as FSDP does); with activation
checkpointing it saves nothing but each layer's input. AdamW (``torch.optim.AdamW``'s
defaults and formula) updates every parameter; parameters and state are donated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tpu_debug.core.hlo_text import parse_module
from tpu_debug.fit import moe as fit_moe
from tpu_debug.fit.sharded import (
    AXES,
    FitCompile,
    _mesh,
    compile_fit,
    param_placements,
    partition_spec,
    unsplit,
)
from tpu_debug.fit.sharded import gathered as read_whole
from tpu_debug.runtime.compiled import GraphProgram, graph_decompositions
from tpu_debug.runtime.dtypes import to_jax_dtype
from tpu_debug.runtime.ops import prims
from tpu_debug.runtime.ops.registry import lower
from tpu_debug.runtime.target.compile import CostStats
from tpu_debug.runtime.target.errors import TargetError

__all__ = ["ScanPieces", "trace_pieces", "layer_stack", "scan_step"]


def layer_stack(model):
    """``(owner, attribute)`` of the model's decoder-layer list, or None when it has none
    whose layers all have the same parameter shapes."""
    import torch.nn as nn

    config = getattr(model, "config", None)
    count = getattr(config, "num_hidden_layers", None)
    for module in model.modules():
        for attr, child in module.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == count and count > 1:
                shapes = [[(n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters()] for layer in child]
                kinds = {type(layer) for layer in child}
                if len(kinds) == 1 and all(s == shapes[0] for s in shapes) and not _per_layer_kinds(config):
                    return module, attr
    return None


def _per_layer_kinds(config) -> bool:
    """True when the config gives layers different attention (Gemma 2's sliding and global
    layers alternate): their inputs differ, so one loop body does not run them all."""
    kinds = getattr(config, "layer_types", None)
    return bool(kinds) and len(set(kinds)) > 1


@dataclasses.dataclass(frozen=True, slots=True)
class ScanPieces:
    """The traced pieces of a decoder model's training step (see the module's docstring).

    Attributes:
        pre, layer, post: the pieces' graph programs (``runtime.compiled.GraphProgram``).
        outer: names of the parameters outside the layers (``named_parameters()`` order).
        inner: names of one layer's parameters (relative to the layer).
        buffers: names of the model's buffers (all inputs of ``pre`` and ``post``).
        specs: name -> ``jax.ShapeDtypeStruct`` of every outer parameter, buffer, and of
            each inner parameter stacked over the layers (leading dimension: layers).
        side: how many of ``pre``'s outputs after the hidden states the layer reads.
        layers: the number of decoder layers.
        prefix: the layers' name prefix in ``named_parameters()`` (``"model.layers"``).
    """

    pre: Any
    layer: Any
    post: Any
    outer: tuple[str, ...]
    inner: tuple[str, ...]
    buffers: tuple[str, ...]
    specs: dict
    side: int
    layers: int
    prefix: str


class _Stand:
    """Stands in for the whole layer stack during a trace: records the first layer's
    inputs, and hands on either them (``pre``) or a given tensor (``post``)."""

    def __init__(self):
        self.seen = None
        self.replace = None

    def __call__(self, hidden, *args, **kwargs):
        self.seen = (hidden, args, kwargs)
        return hidden if self.replace is None else self.replace


def _fresh(t):
    """A plain meta tensor like ``t`` (the pieces' metadata are another trace's fake tensors)."""
    import torch

    return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")


def _decomposed(fn, *args):
    """``fn`` traced to an aten graph with compiled mode's decompositions, dead code dropped."""
    from torch.fx.experimental.proxy_tensor import make_fx


    gm = make_fx(fn, decomposition_table=graph_decompositions(), record_stack_traces=True)(*args)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _trace_layer(layer0, inner: tuple, hidden_meta, side_meta: list, side_spec: list, hf_traceable):
    """Layer 0's forward as a graph of (its parameters, the hidden states, the side inputs
    ``pre`` gave it; ``side_spec``: their pytree, which leaves are tensors, the others' values)."""
    import torch
    from torch.utils._pytree import tree_unflatten

    tree, is_tensor, constants = side_spec
    layer_params = dict(layer0.named_parameters())

    def layer(*flat):
        p = dict(zip(inner, flat[:len(inner)]))
        tensors = iter(flat[len(inner) + 1:])
        leaves = [next(tensors) if t else c for t, c in zip(is_tensor, constants)]
        args, kwargs = tree_unflatten(leaves, tree)
        out = torch.func.functional_call(layer0, p, (flat[len(inner)], *args), kwargs)
        return (out[0] if isinstance(out, tuple) else out,)

    with torch.no_grad(), hf_traceable(), _attention_as_one_op():
        gm = _decomposed(layer, *(_fresh(layer_params[n]) for n in inner), _fresh(hidden_meta),
                         *(_fresh(v) for v in side_meta))
    if _layer_rewrite is not None:  # the attention in use (techniques.attention_as) rewrites its inputs
        _layer_rewrite(gm)
    return gm


def trace_pieces(model, tokens, loss_fn, hf_traceable) -> ScanPieces:
    """Trace ``model``'s pre, layer and post pieces with meta ``tokens`` (see ``ScanPieces``).

    Raises:
        TargetError: the model has no stack of identical decoder layers.
    """
    import torch
    import torch.nn as nn
    from torch.utils._pytree import tree_flatten


    prims.register()  # the prims lowerings the decompositions' graphs may hold
    found = layer_stack(model)
    if found is None:
        raise TargetError(f"{type(model).__name__}: no stack of identical decoder layers to run as a loop")
    owner, attr = found
    stack = getattr(owner, attr)
    prefix = next(n for n, m in model.named_modules() if m is stack)
    layer0 = stack[0]
    params = dict(model.named_parameters())
    outer = tuple(n for n in params if not n.startswith(prefix + "."))
    inner = tuple(n for n, _ in layer0.named_parameters())
    buffers = tuple(n for n, _ in model.named_buffers() if not n.startswith(prefix + "."))
    stand = _Stand()

    class Stack(nn.Module):  # a one-entry ModuleList the model's loop calls instead of its layers
        def forward(self, *args, **kwargs):
            return stand(*args, **kwargs)

    replacement = nn.ModuleList([Stack()])
    meta = {n: torch.empty_like(params[n], device="meta") for n in outer}
    meta_b = {n: torch.empty_like(b, device="meta") for n, b in model.named_buffers() if n in buffers}
    tok = torch.empty_like(tokens, device="meta")

    def run(p, b, x):
        return torch.func.functional_call(model, {**p, **b}, (x,))

    fresh, decomp = _fresh, _decomposed
    saved = getattr(owner, attr)
    side_spec: list = []
    try:
        setattr(owner, attr, replacement)

        def pre(*flat):
            stand.replace = None
            run(dict(zip(outer, flat[:len(outer)])), dict(zip(buffers, flat[len(outer):-1])), flat[-1])
            hidden, args, kwargs = stand.seen
            leaves, tree = tree_flatten((args, kwargs))
            side_spec[:] = [tree, [isinstance(v, torch.Tensor) for v in leaves],
                            [None if isinstance(v, torch.Tensor) else v for v in leaves]]
            return (hidden, *(v for v in leaves if isinstance(v, torch.Tensor)))

        with torch.no_grad(), hf_traceable():
            pre_gm = decomp(pre, *meta.values(), *meta_b.values(), tok)
        hidden_meta = pre_gm.graph.find_nodes(op="output")[0].args[0][0].meta["val"]
        side_meta = [n.meta["val"] for n in pre_gm.graph.find_nodes(op="output")[0].args[0][1:]]

        def post(*flat):
            stand.replace = flat[-2]
            out = run(dict(zip(outer, flat[:len(outer)])), dict(zip(buffers, flat[len(outer):-3])), flat[-3])
            stand.replace = None
            return (loss_fn(out, flat[-1]),)

        with torch.no_grad(), hf_traceable():
            post_gm = decomp(post, *meta.values(), *meta_b.values(), tok,
                             fresh(hidden_meta), tok)
    finally:
        setattr(owner, attr, saved)

    layer_params = dict(layer0.named_parameters())
    layer_gm = _trace_layer(layer0, inner, hidden_meta, side_meta, side_spec, hf_traceable)
    layers = len(saved)
    specs = {n: jax.ShapeDtypeStruct(tuple(params[n].shape), to_jax_dtype(params[n].dtype)) for n in outer}
    specs.update({n: jax.ShapeDtypeStruct(tuple(b.shape), to_jax_dtype(b.dtype)) for n, b in meta_b.items()})
    specs.update({n: jax.ShapeDtypeStruct((layers, *layer_params[n].shape), to_jax_dtype(layer_params[n].dtype))
                  for n in inner})
    return ScanPieces(GraphProgram(pre_gm, "fit_pre", "inference"),
                      GraphProgram(layer_gm, "fit_layer", "inference"),
                      GraphProgram(post_gm, "fit_post", "inference"),
                      outer, inner, buffers, specs, len(side_meta), layers, prefix)


# queries per block of the layer's attention: MaxText's splash attention blocks are 512
ATTENTION_BLOCK = 512
_ATTENTION_OP = None


# a rewrite of the traced layer graph that the attention in use asks for (set by
# ``techniques.attention_as``: its kernels take grouped-query keys and values unrepeated)
_layer_rewrite = None


def _attention_op():
    """``tpu_debug::fit_attention``: scaled dot-product attention kept as one node in the
    layer's trace (the aten decomposition materializes every score at once)."""
    global _ATTENTION_OP
    if _ATTENTION_OP is None:
        import torch


        @torch.library.custom_op("tpu_debug::fit_attention", mutates_args=(), schema=(
            "(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float? scale, bool gqa) -> Tensor"))
        def fit_attention(q, k, v, mask, is_causal, scale, gqa):
            raise NotImplementedError("tpu_debug::fit_attention runs only in a fit's compiled layer")

        @fit_attention.register_fake
        def _(q, k, v, mask, is_causal, scale, gqa):
            return q.new_empty((*q.shape[:-1], v.shape[-1]))

        _ATTENTION_OP = torch.ops.tpu_debug.fit_attention.default
        lower(_ATTENTION_OP)(blocked_attention)
    return _ATTENTION_OP


class _attention_as_one_op:
    """While tracing a layer, ``F.scaled_dot_product_attention`` records one node."""

    def __enter__(self):
        import torch.nn.functional as F

        op = _attention_op()
        self.saved = F.scaled_dot_product_attention

        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            return op(q, k, v, attn_mask, bool(is_causal), scale, bool(enable_gqa))

        F.scaled_dot_product_attention = sdpa
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self.saved


def blocked_attention(q, k, v, mask, is_causal: bool, scale: float | None, gqa: bool, block: int = ATTENTION_BLOCK):
    """Attention a block of queries at a time, each block's scores recomputed in the backward
    (``jax.checkpoint``): only one block's scores [batch, heads, block, keys] are live, as in a
    flash attention kernel, and every flop is the standard attention's. In float32, as
    PyTorch's math attention computes a bfloat16 one."""
    seq, width = q.shape[-2], q.shape[-1]
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each key head serves several
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    scale = 1.0 / math.sqrt(width) if scale is None else scale
    keys = jnp.arange(k.shape[-2])

    @jax.checkpoint
    def one(qb, start, mb):
        scores = jnp.einsum("...qd,...kd->...qk", qb, k, preferred_element_type=jnp.float32) * scale
        if is_causal:
            rows = start + jnp.arange(qb.shape[-2])
            scores = jnp.where(rows[:, None] >= keys[None, :], scores, -jnp.inf)
        if mb is not None:
            scores = jnp.where(mb, scores, -jnp.inf) if mb.dtype == jnp.bool_ else scores + mb
        probs = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("...qk,...kd->...qd", probs, v.astype(jnp.float32)).astype(q.dtype)

    size = block if seq % block == 0 else seq
    outs = []
    for start in range(0, seq, size):  # unrolled: XLA's cost analysis counts a loop body once
        mb = None if mask is None else jax.lax.slice_in_dim(mask, start, start + size, axis=-2) \
            if mask.shape[-2] == seq else mask
        outs.append(one(jax.lax.slice_in_dim(q, start, start + size, axis=-2), start, mb))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-2)


def _adamw(p, g, m, v, count, *, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2):
    """``torch.optim.AdamW``'s update with its defaults (``fit.model_step.AdamW``'s formula)."""
    m = m * b1 + g.astype(m.dtype) * (1 - b1)
    v = v * b2 + (g * g).astype(v.dtype) * (1 - b2)
    p = p * (1 - lr * weight_decay)
    p = p - (lr * (m / (1 - b1**count)) / (jnp.sqrt(v / (1 - b2**count)) + eps)).astype(p.dtype)
    return p, m, v


# what a layer keeps for its backward: the outputs of its weight matmuls (the elementwise
# ops between them are recomputed, as XLA's fusions recompute them in the unrolled step);
# not the attention's batched matmuls (scores, recomputed a block at a time by
# blocked_attention, as a flash kernel does) and not the weights FSDP gathered (gathered
# again)
SAVE = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
# activation checkpointing: only each layer's input (the loop's carry) is kept
REMAT = jax.checkpoint_policies.nothing_saveable


def scan_step(pieces: ScanPieces, *, gathered: dict | None, split: dict, batch, remat: bool = False,
              master: bool = False, unroll: int = 1, policy=None, head_loss=None):
    """The training step as a JAX function of ``(params, buffers, exp_avg, exp_avg_sq, count,
    tokens, labels)`` (dicts by name; inner parameters stacked) returning ``(loss, params,
    exp_avg, exp_avg_sq, count)``.

    Args:
        gathered: inner parameter name -> the sharding a layer reads it in (FSDP: its tp split
            only); None: read as stored.
        split: every parameter name -> its stored sharding (gradients are constrained to it:
            reduced to their shards).
        batch: the sharding of the hidden states between layers (split over the batch
            axes), or None.
        remat: activation checkpointing: each layer keeps only its input for the backward.
        master: the parameters given are float32 master weights (AdamW's state too), cast to
            the model's dtype where the step reads them (mixed precision).
        unroll: layers per loop iteration (``jax.lax.scan``'s ``unroll``).
        policy: the layers' ``jax.checkpoint`` policy, instead of the one ``remat`` picks
            (``tpu_debug.fit.techniques.POLICIES``).
        head_loss: ``(post's output, outer weights by name, labels) -> loss`` when ``post``
            was traced to return the final hidden states (``techniques.chunked_head_loss``).
    """
    from jax.ad_checkpoint import checkpoint_name

    def constrain(x, sharding):
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)

    def compute(n, w):
        return w.astype(pieces.specs[n].dtype) if master else w

    def body(hidden, xs):
        # named for a policy that keeps it by name (techniques.OFFLOADED_NAMES); read only
        # through the name, so such a policy's copy is what the backward gets
        hidden = checkpoint_name(hidden, "decoder_layer_input")
        weights, side = xs
        weights = {n: compute(n, w) for n, w in weights.items()}
        if gathered is not None:
            weights = {n: constrain(w, gathered[n]) for n, w in weights.items()}
        (out,) = pieces.layer(*(weights[n] for n in pieces.inner), hidden, *side)
        return constrain(out, batch), None

    body = jax.checkpoint(body, policy=policy or (REMAT if remat else SAVE))

    def loss_of(outer, inner, buffers, tokens, labels):
        o = [compute(n, outer[n]) for n in pieces.outer]
        b = [buffers[n] for n in pieces.buffers]
        hidden, *side = pieces.pre(*o, *b, tokens)
        hidden = constrain(hidden, batch)

        def looped(h, weights):
            return body(h, (weights, side))

        hidden, _ = jax.lax.scan(looped, hidden, inner, unroll=unroll)
        (out,) = pieces.post(*o, *b, tokens, hidden, labels)
        return out if head_loss is None else head_loss(out, dict(zip(pieces.outer, o)), labels)

    def step(params, buffers, exp_avg, exp_avg_sq, count, tokens, labels):
        outer = {n: params[n] for n in pieces.outer}
        inner = {n: params[n] for n in pieces.inner}
        loss, (g_outer, g_inner) = jax.value_and_grad(loss_of, argnums=(0, 1))(outer, inner, buffers, tokens,
                                                                               labels)
        grads = {**g_outer, **g_inner}
        count = count + 1
        new_p, new_m, new_v = {}, {}, {}
        for n, p in params.items():
            g = constrain(grads[n], split.get(n))
            new_p[n], new_m[n], new_v[n] = _adamw(p, g, exp_avg[n], exp_avg_sq[n], count)
        return loss, new_p, new_m, new_v, count

    return step


def stacked_spec(spec, ndim: int):
    """A layer parameter's PartitionSpec (over its own dims) for the stacked array: the layer
    dimension first, never split."""
    from jax.sharding import PartitionSpec

    parts = tuple(spec) + (None,) * (ndim - len(tuple(spec)))
    return PartitionSpec(None, *parts)


def local_bytes(spec: jax.ShapeDtypeStruct, sharding) -> int:
    return math.prod(sharding.shard_shape(spec.shape)) * np.dtype(spec.dtype).itemsize


def compile_scan_step(pieces: ScanPieces, batch_shape: tuple[int, int], target, plan, *, remat: bool = False,
                      master_dtype: str | None = None, optimization_level: str | None = None,
                      cache: bool = True, policy=None, head_loss=None, compiler_options: dict | None = None):
    """Compile the looped training step (``scan_step``) for ``target`` under ``plan``.

    Placements are ``tpu_debug.fit.sharded``'s (by each parameter's own name and shape; a
    stacked layer parameter keeps its layer's split, its layer dimension whole); the batch
    (tokens, labels: ``batch_shape`` int64) is split over the batch axes. ``master_dtype``
    (``"float32"``): parameters and AdamW state are kept in it and cast to the model's dtype
    where read. ``policy``, ``head_loss``: as ``scan_step``'s. ``compiler_options``: more of the
    TPU compiler's options (``techniques.compiler_options``).

    Returns:
        A ``tpu_debug.fit.sharded.FitCompile``.
    """
    from jax.sharding import NamedSharding, PartitionSpec


    mesh = _mesh(target, plan)
    replicated = NamedSharding(mesh, PartitionSpec())
    names = (*pieces.outer, *pieces.inner)
    placements, stored, gathered = {}, {}, {}
    for n in names:
        stacked = n in pieces.inner
        shape = pieces.specs[n].shape[1:] if stacked else pieces.specs[n].shape
        full = f"{pieces.prefix}.0.{n}" if stacked else n
        placements[full] = param_placements(full, shape, plan)
        spec = partition_spec(placements[full], len(shape))
        stored[n] = NamedSharding(mesh, stacked_spec(spec, len(shape)) if stacked else spec)
        if stacked and plan.fsdp > 1:
            gathered[n] = NamedSharding(mesh, partition_spec(read_whole(placements[full]), len(shape)))
    batch_axes = tuple(a for a, size in zip(AXES, plan.shape) if size > 1 and a != "tp")
    data = NamedSharding(mesh, PartitionSpec(batch_axes if batch_axes else None))
    hidden = NamedSharding(mesh, PartitionSpec(batch_axes)) if batch_axes else None
    def make_step(unroll=1, sharded=True):
        if not sharded:
            return scan_step(pieces, gathered=None, split={}, batch=None, remat=remat,
                             master=master_dtype is not None, unroll=unroll, policy=policy, head_loss=head_loss)
        return scan_step(pieces, gathered=gathered if plan.fsdp > 1 else None, split=stored, batch=hidden,
                         remat=remat, master=master_dtype is not None, unroll=unroll, policy=policy,
                         head_loss=head_loss)

    step = make_step()
    params = {n: stored[n] for n in names}
    buffers = {n: replicated for n in pieces.buffers}
    in_sh = (params, buffers, params, params, replicated, data, data)
    out_sh = (replicated, params, params, params, replicated)

    def spec(n, sharding, dtype=None):
        s = pieces.specs[n]
        return jax.ShapeDtypeStruct(s.shape, dtype or s.dtype, sharding=sharding)

    p_specs = {n: spec(n, stored[n], master_dtype) for n in names}
    tokens = jax.ShapeDtypeStruct(batch_shape, jnp.int64, sharding=data)
    args = (p_specs, {n: spec(n, replicated) for n in pieces.buffers}, p_specs, p_specs,
            jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated), tokens, tokens)
    fn = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=(0, 2, 3, 4))
    with fit_moe.sharded(mesh, batch_axes):  # experts layers multiply each batch shard's tokens on its chip
        result = compile_fit(fn, args, target, optimization_level=optimization_level, cache=cache,
                             compiler_options=compiler_options)
    scale = 1.0
    if result.ok and pieces.layers > 1 and result.cost is not None:
        every = _every_layer(result.cost, pieces, make_step, args, result.hlo)
        scale = every.flops / result.cost.flops if result.cost.flops else 1.0
        result = dataclasses.replace(result, cost=every)
    param_bytes = sum(local_bytes(p_specs[n], stored[n]) for n in names)
    unsharded = tuple(n for n in names
                      if unsplit(placements[f"{pieces.prefix}.0.{n}" if n in pieces.inner else n],
                                 pieces.specs[n].shape, plan))
    return FitCompile(result, plan, placements, param_bytes, 2 * param_bytes + 4,
                      2 * local_bytes(tokens, data), unsharded, scale)


# the two-layer programs' cost analyses by the digest of the optimized step they scale: a fit
# whose compile the cache answered (a search's or a fix's fit of a step compiled before) does
# not lower them again. At most _LAYER_FIGURES_MAX entries, the oldest dropped first.
_LAYER_FIGURES: dict[bytes, list[dict]] = {}
_LAYER_FIGURES_MAX = 256


def _every_layer(cost, pieces: ScanPieces, make_step, args, hlo: str | None = None):
    """``cost`` (XLA's cost analysis of the looped step, whose optimized HLO is ``hlo``) with
    every layer counted.

    XLA's cost analysis counts a loop's body once, whatever its trip count. The body's
    share of the step is read from two programs lowered (not compiled) with two layers,
    unsharded, for the host's backend (a program lowered for a deviceless TPU topology
    has no cost analysis): one loop iteration per layer, and both layers in one
    iteration; their difference is one layer's forward and backward. Sharding divides the
    layers' work and the rest alike, so the share holds per chip. Flops and transcendentals
    become ``cost x (1 + (layers - 1) x share)``: the share comes from the unoptimized
    programs, applied to the compiler's figures of the optimized one; bytes accessed are
    scaled as the flops are.
    """

    layers = pieces.layers

    def plain(spec, count=None):  # unsharded; a stacked layer input with ``count`` layers
        return jax.ShapeDtypeStruct((count, *spec.shape[1:]) if count else spec.shape, spec.dtype)

    def stacked(specs):
        return {n: plain(a, 2 if n in pieces.inner else None) for n, a in specs.items()}

    two = (stacked(args[0]), {n: plain(a) for n, a in args[1].items()}, stacked(args[2]), stacked(args[3]),
           *(plain(a) for a in args[4:]))
    digest = hashlib.sha256(hlo.encode()).digest() if hlo else None
    figures = _LAYER_FIGURES.get(digest) if digest is not None else None
    if figures is None:
        figures = []
        with jax.enable_x64(True), fit_moe.counted():  # experts' grouped matmuls at their own flops
            for unroll in (1, 2):
                lowered = jax.jit(make_step(unroll, sharded=False)).lower(*two)
                analysis = lowered.cost_analysis()
                analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
                figures.append(dict(analysis or {}))
        if digest is not None:
            if _LAYER_FIGURES and len(_LAYER_FIGURES) >= _LAYER_FIGURES_MAX:
                del _LAYER_FIGURES[next(iter(_LAYER_FIGURES))]
            _LAYER_FIGURES[digest] = figures

    def every(value, key):
        once, both = figures[0].get(key), figures[1].get(key)
        if value is None or not once or both is None:
            return value
        return value * (1 + (layers - 1) * max(both - once, 0.0) / once)

    # bytes accessed scale as the flops do: the unoptimized programs' bytes (every elementwise
    # op reading and writing memory, nothing fused) overstate the layers' share of the
    # optimized program's (Llama-3-8B: 18.5x against the flops' 12.1x)
    flops = every(cost.flops, "flops")
    scale = flops / cost.flops if cost.flops else 1.0
    return CostStats(flops, every(cost.transcendentals, "transcendentals"),
                     None if cost.bytes_accessed is None else cost.bytes_accessed * scale, None)


def loop_repeats(hlo: str, trips: int) -> dict[str, int]:
    """Instruction name -> how many times it runs per step, for the instructions of the
    compiled step's loops (their bodies and what those call): ``trips`` each, since the
    step's loops are its layer loops. Instructions outside are not listed (once)."""
    module = parse_module(hlo)
    body = {c.name: [i.name for i in c.instructions] for c in module.computations}
    calls = {c.name: {n for i in c.instructions for n in i.called} for c in module.computations}
    loops = {i.attr("body").lstrip("%") for i in module.instructions() if i.attr("body")}
    repeats: dict[str, int] = {}
    todo, seen = list(loops), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in body:
            continue
        seen.add(name)
        repeats.update(dict.fromkeys(body[name], trips))
        todo.extend(calls.get(name, ()))
    return repeats
