"""Inference programs for ``fit``: prefill and decode with a static KV cache, one sharded SPMD program each.

The cache is made here, not by transformers' ``StaticCache``: its layers count the
filled length in a tensor they mutate in place (a constant of the trace, not an
input). ``_CacheLayer`` is a ``StaticLayer`` whose keys and values are the step's
inputs, written out of place (``index_copy``) at ``position + arange(new tokens)``,
so the traced function takes the cache and returns the updated cache; it is
donated, so the compiler writes it in place. transformers builds the mask from a
static layer's sizes (every position of the cache, causal by ``position_ids``).

- prefill: tokens ``[batch, seq]`` written at positions ``0..seq-1``; returns the last
  position's logits (what serving samples from; all positions' logits would be a
  ``[batch, seq, vocab]`` float buffer that serving never reads) and the cache;
- decode: tokens ``[batch, 1]`` and ``position`` (an int64 scalar) attend to a cache of
  ``seq`` positions; returns the new token's logits and the cache.

Shardings: parameters as training's (``param_placements``; with an FSDP axis gathered
where read, ``_fsdp_program``); the cache ``[batch, kv_heads, seq, head_dim]`` split
over the batch axes (dp, fsdp) on batch and over tp on kv heads, each when the axis
divides it (otherwise that dimension is whole on every chip, as a serving engine
replicates KV heads when tp exceeds them).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
from tpu_debug.fit.model_step import TracedStep, meta_of, nbytes_of
from tpu_debug.fit.sharded import (
    AXES,
    FitCompile,
    Plan,
    _fsdp_program,
    _local_bytes,
    _mesh,
    compile_fit,
    gathered,
    param_placements,
    partition_spec,
    unsplit,
)
from tpu_debug.runtime.compiled import GraphProgram, graph_decompositions
from tpu_debug.runtime.dtypes import to_jax_dtype
from tpu_debug.runtime.target.hardware import Target

__all__ = ["trace_infer", "compile_infer", "cache_shape", "cache_spec"]


def cache_shape(config, batch: int, seq: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache: ``[batch, kv_heads, seq, head_dim]``."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return (batch, kv, seq, head_dim)


def cache_spec(shape: tuple[int, ...], plan: Plan):
    """The cache's ``PartitionSpec``: batch over (dp, fsdp), kv heads over tp, where they divide."""
    from jax.sharding import PartitionSpec

    batch_axes = tuple(a for a, n in zip(AXES, plan.shape) if n > 1 and a != "tp")
    on_batch = batch_axes if batch_axes and shape[0] % plan.batch_ways == 0 else None
    on_heads = "tp" if plan.tp > 1 and shape[1] % plan.tp == 0 else None
    return PartitionSpec(on_batch, on_heads, None, None)


def _layer_class():
    import torch
    from transformers.cache_utils import StaticLayer

    class _CacheLayer(StaticLayer):
        """A static layer over given tensors, updated out of place at ``position``."""

        def __init__(self, keys, values, position):
            super().__init__(max_cache_len=keys.shape[2])
            self.keys, self.values, self.position = keys, values, position
            self.batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim = self.v_head_dim = keys.shape[-1]
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            at = torch.arange(key_states.shape[-2], device=key_states.device) + self.position
            self.keys = self.keys.index_copy(2, at, key_states)
            self.values = self.values.index_copy(2, at, value_states)
            return self.keys, self.values

        def get_seq_length(self):
            return self.position

    return _CacheLayer


def trace_infer(model, config, batch: int, seq: int, job: str, traceable) -> TracedStep:
    """Trace prefill or decode: flat inputs (parameters, buffers, keys per layer, values per layer,
    tokens[, position]); outputs (logits, keys per layer, values per layer); the cache donated."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from transformers.cache_utils import Cache


    started = time.perf_counter()
    params = {n: meta_of(p) for n, p in model.named_parameters()}
    buffers = {n: meta_of(b) for n, b in model.named_buffers()}
    names, bnames = list(params), list(buffers)
    n_p, n_b, layers = len(names), len(bnames), config.num_hidden_layers
    dtype = next(iter(params.values())).dtype
    shape = cache_shape(config, batch, seq)
    cache = [torch.empty(shape, dtype=dtype, device="meta") for _ in range(2 * layers)]
    decode = job == "decode"
    tokens = torch.empty(batch, 1 if decode else seq, dtype=torch.long, device="meta")
    extra = [torch.empty((), dtype=torch.long, device="meta")] if decode else []
    layer_cls = _layer_class()

    def step(*flat):
        state = {**dict(zip(names, flat[:n_p])), **dict(zip(bnames, flat[n_p:n_p + n_b]))}
        kv = flat[n_p + n_b:n_p + n_b + 2 * layers]
        ids = flat[n_p + n_b + 2 * layers]
        position = flat[-1] if decode else 0
        cache_obj = Cache(layers=[layer_cls(kv[i], kv[layers + i], position) for i in range(layers)])
        positions = (torch.arange(ids.shape[1], device=ids.device) + position).unsqueeze(0)
        out = torch.func.functional_call(model, state, (ids,), {
            "cache": cache_obj, "use_cache": True, "position_ids": positions, "logits_to_keep": 1})
        return (out.logits, *(c.keys for c in cache_obj.layers), *(c.values for c in cache_obj.layers))

    flat = [*params.values(), *buffers.values(), *cache, tokens, *extra]
    with torch.no_grad(), traceable():
        gm = make_fx(step, decomposition_table=graph_decompositions(), record_stack_traces=True)(*flat)
    specs = tuple(jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), to_jax_dtype(n.meta["val"].dtype))
                  for n in gm.graph.find_nodes(op="placeholder"))
    return TracedStep(gm, GraphProgram(gm, "fit", "inference"), specs,
                      tuple(range(n_p + n_b, n_p + n_b + 2 * layers)), "inference",
                      parameters=sum(math.prod(p.shape) for p in params.values()),
                      parameter_bytes=nbytes_of(params.values()), state_bytes=0,
                      trace_seconds=time.perf_counter() - started)


_MERGES = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})


def _unmerged_bmm(node):
    """``(a, b)``: the 4-D tensors a ``view(bmm(view(a), view(b)))`` multiplies, when the views only
    merge and split the two leading (batch, heads) dimensions; else None."""
    if str(node.target) not in _MERGES or not node.args or str(getattr(node.args[0], "target", "")) != \
            "aten.bmm.default":
        return None
    shape = tuple(node.meta["val"].shape)
    sources = []
    for view in node.args[0].args[:2]:
        src = view.args[0] if str(getattr(view, "target", "")) in _MERGES else None
        if src is None or len(src.meta["val"].shape) != 4 or len(shape) != 4 \
                or tuple(src.meta["val"].shape[:2]) != shape[:2]:
            return None
        sources.append(src)
    return tuple(sources)


def _heads_kept(program):
    """``program`` with attention's batched matmuls done on ``[batch, heads, m, k]`` tensors.

    The decomposed SDPA merges batch and heads into one dimension for ``bmm`` and splits them after;
    a tp split of the heads (the minor factor of the merged dimension) cannot be carried through
    that merge, and XLA gathered the KV cache and the scores in every layer (Llama-3-8B decode,
    tp=8). Multiplying the unmerged tensors (the same products) keeps each chip on its heads.
    """
    import jax.numpy as jnp

    base = type(program)

    class HeadsKept(base):
        def _call(self, node, env, key, draws, mutations):
            pair = _unmerged_bmm(node)
            if pair is not None:
                out = jnp.matmul(env[pair[0]], env[pair[1]], preferred_element_type=env[pair[0]].dtype)
                return out.astype(env[pair[0]].dtype)
            return super()._call(node, env, key, draws, mutations)

    program.__class__ = HeadsKept
    return program


def compile_infer(traced: TracedStep, names: list[str], layers: int, target: Target, plan: Plan, *,
                  optimization_level: str | None = None, cache: bool = True) -> tuple[FitCompile, int]:
    """Compile ``trace_infer``'s step under ``plan``: (the compile, one chip's KV cache bytes)."""
    from jax.sharding import NamedSharding, PartitionSpec


    mesh = _mesh(target, plan)
    specs = traced.specs
    n_p = len(names)
    n_b = len(specs) - n_p - 2 * layers - (2 if len(specs[-1].shape) == 0 else 1)
    placements = {n: param_placements(n, specs[i].shape, plan) for i, n in enumerate(names)}
    param_sh = [NamedSharding(mesh, partition_spec(placements[n], len(specs[i].shape)))
                for i, n in enumerate(names)]
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_axes = tuple(a for a, n in zip(AXES, plan.shape) if n > 1 and a != "tp")
    batch = NamedSharding(mesh, PartitionSpec(batch_axes)) if batch_axes else replicated
    cache_sh = NamedSharding(mesh, cache_spec(specs[n_p + n_b].shape, plan))
    rest = [batch if s.shape else replicated for s in specs[n_p + n_b + 2 * layers:]]
    in_sh = [*param_sh, *[replicated] * n_b, *[cache_sh] * (2 * layers), *rest]
    out_sh = (batch, *[cache_sh] * (2 * layers))
    if plan.fsdp > 1:
        reads = [NamedSharding(mesh, partition_spec(gathered(placements[n]), len(specs[i].shape)))
                 for i, n in enumerate(names)]
        program = _fsdp_program(traced, n_p, n_b, reads, param_sh, batch if batch_axes else None)
        traced = dataclasses.replace(traced, program=program)
    if plan.tp > 1:
        traced = dataclasses.replace(traced, program=_heads_kept(traced.program))
    fn = jax.jit(traced.function(), in_shardings=tuple(in_sh), out_shardings=out_sh,
                 donate_argnums=traced.donate)
    args = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s, sh in zip(specs, in_sh))
    result = compile_fit(fn, args, target, optimization_level=optimization_level, cache=cache)
    local = [_local_bytes(s, sh) for s, sh in zip(specs, in_sh)]
    unsharded = tuple(n for i, n in enumerate(names) if unsplit(placements[n], specs[i].shape, plan))
    kv_bytes = sum(local[n_p + n_b:n_p + n_b + 2 * layers])
    fc = FitCompile(result, plan, placements, sum(local[:n_p]), 0, sum(local[n_p + n_b + 2 * layers:]),
                    unsharded)
    return fc, kv_bytes


def decode_bound(estimate, measured, tgt: Target):
    """The decode estimate with its memory-bound time: one token step reads every weight and the
    whole KV cache once (each chip its share), at the published HBM bandwidth."""
    seconds = (measured.param_bytes + measured.kv_bytes) / tgt.hbm_bandwidth_per_device
    why = ("decode memory-bound time: the chip's parameter share and KV cache share read once per token "
           "step at the HBM bandwidth (no reuse across steps, activations ignored); tokens/s counts one "
           "token per sequence per step")
    return dataclasses.replace(estimate, memory_bound_seconds=seconds,
                               assumptions=(*estimate.assumptions, why))
