"""Pod-scale fit: one training (or forward) step as ONE sharded SPMD program for a TPU slice.

``trace_step`` (``model_step``) turns a PyTorch model's step into a JAX function of
flat inputs (parameters, buffers, AdamW state, batch). Here each input gets a
placement on a ``(dp, fsdp, tp)`` mesh of the target's compile-only devices, in
DTensor's vocabulary (``Shard(dim)`` / ``Replicate()`` per mesh dimension):

- dp (data parallel): parameters and optimizer state replicated, batch split;
- fsdp (ZeRO-3): parameters, gradients and optimizer state split over the axis
  (each tensor's first dimension the axis divides), batch split;
- tp (tensor parallel, Megatron style): ``ColwiseParallel`` / ``RowwiseParallel``
  from ``runtime.distributed`` on the linears a name rule picks.

With an FSDP axis the step is constrained to FSDP's layout inside the traced
function (``_fsdp_program``: parameters gathered where read, gradients reduced
to their shards), since XLA's propagation from the inputs alone may not gather
the weights. The function is jitted with those in/out shardings (updated
parameters and state keep their input's, and are donated) and compiled by XLA's TPU compiler
for the topology: its SPMD partitioner inserts the collectives, its buffer
assignment gives the memory one chip needs. ``FitCompile`` keeps the compile,
the placements and the per-chip logical sizes the breakdown needs.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np
from tpu_debug.fit import moe as fit_moe
from tpu_debug.fit.model_step import TracedStep
from tpu_debug.runtime.compiled import GraphProgram
from tpu_debug.runtime.distributed.sharding import Replicate, Shard
from tpu_debug.runtime.target import topology
from tpu_debug.runtime.target.compile import CODEGEN_OPTIONS, TargetCompile, compile_for_target
from tpu_debug.runtime.target.errors import TargetError
from tpu_debug.runtime.target.hardware import Target

__all__ = ["Plan", "parse_plan", "FitCompile", "compile_sharded_step", "AXES", "TP_RULES"]

AXES = ("dp", "fsdp", "tp")

#: parameter-name pattern -> style over the tp axis (Llama, Mistral, Mixtral, Gemma, Qwen names)
TP_RULES: tuple[tuple[str, str], ...] = (
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3|lm_head)\.weight$", "colwise"),
    (r"(o_proj|down_proj|w2)\.weight$", "rowwise"),
    (r"embed_tokens\.weight$", "rowwise"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """A parallelism plan: the size of each mesh axis (their product is the slice's devices).

    Example:
        >>> parse_plan("fsdp=4,tp=2", 8)
        Plan(dp=1, fsdp=4, tp=2)
    """

    dp: int = 1
    fsdp: int = 1
    tp: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dp, self.fsdp, self.tp)

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.tp

    @property
    def batch_ways(self) -> int:
        """How many ways the batch splits (dp x fsdp)."""
        return self.dp * self.fsdp

    def __str__(self) -> str:
        parts = [f"{a}={n}" for a, n in zip(AXES, self.shape) if n > 1]
        return ",".join(parts) or "single"


def parse_plan(plan: str | Plan, devices: int) -> Plan:
    """The plan a spec names, for a slice of ``devices`` devices.

    ``"fsdp"`` / ``"dp"`` / ``"tp"`` use every device on that axis; ``"fsdp=4,tp=2"``
    sizes each axis; one axis given without a size takes the devices left over
    (``"dp,tp=2"`` on 8 devices is dp=4, tp=2).

    Raises:
        TargetError: an unknown axis, a malformed size, or sizes whose product is not
            the slice's device count.
    """
    if isinstance(plan, Plan):
        parsed = plan
    else:
        sizes: dict[str, int | None] = {}
        for part in filter(None, (p.strip() for p in str(plan).lower().split(","))):
            name, _, size = part.partition("=")
            name = {"ddp": "dp", "zero3": "fsdp"}.get(name.strip(), name.strip())
            if name not in AXES or (size and not size.strip().isdigit()) or name in sizes:
                raise TargetError(f"plan {plan!r}: {part!r} is not one of dp[=N], fsdp[=N], tp[=N] "
                                  "(comma-separated, each once), e.g. 'fsdp', 'fsdp=4,tp=2', 'dp=2,fsdp=4'")
            sizes[name] = int(size) if size.strip() else None
        open_axes = [a for a, n in sizes.items() if n is None]
        known = math.prod(n for n in sizes.values() if n is not None)
        if len(open_axes) > 1:
            raise TargetError(f"plan {plan!r}: give a size to all axes but one (e.g. 'dp,tp=2')")
        if open_axes:
            sizes[open_axes[0]] = max(devices // max(known, 1), 1)
        parsed = Plan(**{a: n for a, n in sizes.items() if n is not None})
    if parsed.devices != devices or min(parsed.shape) < 1:
        raise TargetError(f"plan {parsed} spans {parsed.devices} devices; the slice has {devices}: "
                          f"make dp x fsdp x tp = {devices} (e.g. 'fsdp={devices}')")
    return parsed


def _tp_style(name: str) -> str | None:
    return next((style for pattern, style in TP_RULES if re.search(pattern, name)), None)


def param_placements(name: str, shape: tuple[int, ...], plan: Plan) -> tuple:
    """DTensor placements of one parameter over the ``(dp, fsdp, tp)`` mesh."""

    tp_dim = None
    if plan.tp > 1 and len(shape) == 2:
        style = _tp_style(name)
        # ColwiseParallel splits weight rows (a linear's outputs), RowwiseParallel its columns;
        # an embedding's row split (vocab-parallel) is RowwiseParallel's
        tp_dim = {"colwise": 0, "rowwise": 1}.get(style or "")
        if style == "rowwise" and name.endswith("embed_tokens.weight"):
            tp_dim = 0
        if tp_dim is not None and shape[tp_dim] % plan.tp:
            tp_dim = None
    fsdp_dim = None
    if plan.fsdp > 1:
        fsdp_dim = next((d for d in range(len(shape)) if d != tp_dim and shape[d] % plan.fsdp == 0), None)
    return (Replicate(),
            Shard(fsdp_dim) if fsdp_dim is not None else Replicate(),
            Shard(tp_dim) if tp_dim is not None else Replicate())


def gathered(placements: tuple) -> tuple:
    """A parameter's placements as a layer reads it under FSDP: its fsdp split gathered, the rest kept."""

    return placements[:1] + (Replicate(),) + placements[2:]


def unsplit(placements: tuple, shape: tuple, plan: Plan) -> bool:
    """True for a parameter of more than one element that no axis but dp splits (whole on every
    chip although the plan has sharding axes)."""
    return plan.devices > plan.dp and all(p.is_replicate() for p in placements) and math.prod(shape) > 1


def partition_spec(placements: tuple, ndim: int):
    """The JAX ``PartitionSpec`` of placements over the ``(dp, fsdp, tp)`` mesh."""
    from jax.sharding import PartitionSpec


    per_dim: list[list[str]] = [[] for _ in range(ndim)]
    for axis, p in zip(AXES, placements):
        if isinstance(p, Shard):
            per_dim[p.dim].append(axis)
    return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else tuple(a) for a in per_dim))


@dataclasses.dataclass(frozen=True, slots=True)
class FitCompile:
    """A step compiled as one sharded program.

    Attributes:
        compile: the target compile (HLO, per-device memory and cost, or the HBM OOM).
        plan: the mesh axes' sizes.
        placements: parameter name -> its placements over ``(dp, fsdp, tp)``.
        param_bytes: one chip's share of the parameters (logical bytes, before tile padding).
        state_bytes: one chip's share of the optimizer state.
        batch_bytes: one chip's share of the step's inputs (tokens, labels).
        unsharded: parameters no axis could split (kept whole on every chip).
        flops_scale: how much the compile's cost was scaled to count every loop iteration.
    """

    compile: TargetCompile
    plan: Plan
    placements: dict[str, tuple]
    param_bytes: int
    state_bytes: int
    batch_bytes: int
    unsharded: tuple[str, ...]
    flops_scale: float = 1.0  # the looped step: its flops with every layer / XLA's (one layer counted)


def compile_fit(fn, args: tuple, target: Target, *, optimization_level: str | None,
                cache: bool, compiler_options: dict | None = None) -> TargetCompile:
    """Compile a fit program with small-window code generation (``CODEGEN_OPTIONS``).

    The HBM buffers, cost analysis and collectives are the full code generation's (only
    the code's own bytes are smaller); a program the small windows cannot lower (a
    compile error, not an out-of-memory) is compiled again without them, so the option
    never turns an answer into a refusal. ``compiler_options``: more of the compiler's
    options, given to both (``techniques.compiler_options``).
    """
    extra = dict(compiler_options or {})
    result = compile_for_target(fn, args, target, x64=True, optimization_level=optimization_level,
                                compiler_options={**CODEGEN_OPTIONS, **extra}, cache=cache)
    if result.error is not None and result.error.kind == "compile_error":
        result = compile_for_target(fn, args, target, x64=True, optimization_level=optimization_level,
                                    compiler_options=extra or None, cache=cache)
    return result


def _mesh(target: Target, plan: Plan):
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh


    devices = topology(target)[: plan.devices]
    try:  # ICI neighbours on the fastest-varying axis (tp), as JAX lays meshes out on a TPU
        grid = mesh_utils.create_device_mesh(plan.shape, devices=list(devices))
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.array(devices, dtype=object).reshape(plan.shape)
    return Mesh(grid, AXES)


def _local_bytes(spec: jax.ShapeDtypeStruct, sharding) -> int:
    return math.prod(sharding.shard_shape(spec.shape)) * np.dtype(spec.dtype).itemsize


# ops that only re-view a tensor: a parameter's transpose or reshape the backward reads
# is re-derived from a fresh gather instead of kept alive from the forward
_VIEWS = frozenset({"aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.view.default",
                    "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
                    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.alias.default"})


def _ancestors(node) -> set:
    seen, todo = set(), [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _gradients(graph, n_p: int, n_b: int) -> dict:
    """Gradient node -> parameter index, read off AdamW's ``m * b1 + g * (1 - b1)`` per parameter."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    outputs = next(iter(graph.find_nodes(op="output"))).args[0]
    found = {}
    for i in range(n_p):
        exp_avg = placeholders[n_p + n_b + i]
        for term in outputs[1 + n_p + i].all_input_nodes:
            if exp_avg not in term.all_input_nodes and term.all_input_nodes:
                found[term.all_input_nodes[0]] = i
    return found


def _fsdp_program(traced: TracedStep, n_p: int, n_b: int, gathered: list | None, split: list, batch,
                  every: bool = False):
    """``traced``'s program laid out as FSDP (ZeRO-3) runs it, whatever the width.

    Given only the inputs' shardings, XLA's sharding propagation may keep FSDP-split weights
    split and all-reduce partial activations instead (seen at 64 ways). So, as MaxText does:
    every forward or backward read of a parameter is constrained to its gathered layout
    (``gathered``: the tp split only), a backward read of a parameter's view re-derives it
    from a fresh gather (FSDP gathers again for the backward rather than keeping the whole
    weights alive), each gradient is constrained to its parameter's layout (``split``: a
    reduce-scatter, not an all-reduce) and the embeddings' output is split over the batch
    axes (``batch``; None: not split). AdamW reads the split parameters (its ``detach``).
    ``gathered`` None (no FSDP axis) constrains the activations only; ``every`` constrains
    every intermediate whose first dimension is the batch or batch x seq, not only the
    embeddings'.
    """
    from collections import ChainMap


    graph = traced.graph.graph
    params = {p: i for i, p in enumerate(list(graph.find_nodes(op="placeholder"))[:n_p])}
    outputs = next(iter(graph.find_nodes(op="output"))).args[0]
    forward = _ancestors(outputs[0]) | {outputs[0]} if traced.mode == "training" else None
    grads = _gradients(graph, n_p, n_b) if traced.mode == "training" and gathered is not None else {}
    rows = traced.specs[-1].shape[:2]
    rows = (rows[0], math.prod(rows)) if every and batch is not None else ()
    chains: dict = {}  # a parameter's view -> (parameter, the views from it in order)
    for node in graph.nodes:
        src = node.args[0] if node.op == "call_function" and node.args else None
        if str(node.target) in _VIEWS and (src in params or src in chains):
            p, chain = (src, ()) if src in params else chains[src]
            chains[node] = (p, (*chain, node))
    late: set = set()  # backward nodes: their gathers wait for the node's other inputs
    uses: dict = {}  # node -> the parameters and views it reads that are (re)gathered for it
    for node in graph.nodes if gathered is not None else ():
        if node.op != "call_function" or str(node.target) == "aten.detach.default":
            continue
        backward = forward is not None and node not in forward and node not in chains
        read = [a for a in node.all_input_nodes if a in params or (backward and a in chains)]
        if read:
            uses[node] = read
            if backward:
                late.add(node)
    embeds = {n for n in graph.nodes if str(n.target) == "aten.embedding.default"} if batch else set()

    class Fsdp(GraphProgram):
        def _call(self, node, env, key, draws, mutations):
            if node in uses:
                fresh: dict = {}
                view = ChainMap(fresh, env)
                after = [env[a] for a in node.all_input_nodes
                         if a not in uses[node] and hasattr(env[a], "shape")] if node in late else []
                for a in uses[node]:
                    p, chain = (a, ()) if a in params else chains[a]
                    value = jax.lax.optimization_barrier((env[p], *after))[0] if after else env[p]
                    fresh[p] = jax.lax.with_sharding_constraint(value, gathered[params[p]])
                    for link in chain:
                        fresh[link] = super()._call(link, view, key, draws, mutations)
                out = super()._call(node, view, key, draws, mutations)
            else:
                out = super()._call(node, env, key, draws, mutations)
            if node in grads:
                out = jax.lax.with_sharding_constraint(out, split[grads[node]])
            elif node in embeds or (getattr(out, "ndim", 0) >= 2 and out.shape[0] in rows):
                out = jax.lax.with_sharding_constraint(out, batch)
            return out

    return Fsdp(traced.graph, "fit", traced.mode)


def compile_sharded_step(traced: TracedStep, names: list[str], n_batch: int, target: Target, plan: Plan, *,
                         shard_activations: bool = False, optimization_level: str | None = None,
                         cache: bool = True) -> FitCompile:
    """Compile ``traced`` (``trace_step``'s training or inference step) for ``target`` under ``plan``.

    Args:
        traced: the step; its flat inputs are parameters (``names`` order), buffers,
            [AdamW exp_avg, exp_avg_sq, step count,] inputs, targets.
        names: the parameters' names, in ``named_parameters()`` order.
        n_batch: how many of the last flat inputs are the batch (forward inputs and loss targets).
        shard_activations: constrain every activation whose first dimension is the batch
            (or batch x seq) to be split over the batch axes; off, only the embeddings'
            output is (see ``_fsdp_program``).
        target: the slice; plan.devices of its devices are used.
        plan: the mesh axes' sizes.
        optimization_level, cache: as ``compile_for_target``.
    """
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _mesh(target, plan)
    specs = traced.specs
    n_p = len(names)
    train = traced.mode == "training"
    n_b = len(specs) - n_p - (2 * n_p + 1 if train else 0) - n_batch
    placements = {name: param_placements(name, specs[i].shape, plan) for i, name in enumerate(names)}
    param_sh = [NamedSharding(mesh, partition_spec(placements[n], len(specs[i].shape)))
                for i, n in enumerate(names)]
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_axes = tuple(a for a, n in zip(AXES, plan.shape) if n > 1 and a != "tp")
    in_sh = [*param_sh, *[replicated] * n_b]
    if train:
        in_sh += [*param_sh, *param_sh, replicated]
    for spec in specs[len(in_sh):]:
        splits = batch_axes and spec.shape and spec.shape[0] % plan.batch_ways == 0
        in_sh.append(NamedSharding(mesh, PartitionSpec(batch_axes if splits else None)))
    out_sh = (replicated, *param_sh, *param_sh, *param_sh, replicated) if train else None
    if plan.fsdp > 1 or shard_activations:
        reads = [NamedSharding(mesh, partition_spec(gathered(placements[n]), len(specs[i].shape)))
                 for i, n in enumerate(names)]
        batch = NamedSharding(mesh, PartitionSpec(batch_axes)) if batch_axes else None
        program = _fsdp_program(traced, n_p, n_b, reads if plan.fsdp > 1 else None, param_sh, batch,
                                every=shard_activations)
        traced = dataclasses.replace(traced, program=program)
    fn = jax.jit(traced.function(), in_shardings=tuple(in_sh), out_shardings=out_sh,
                 donate_argnums=traced.donate)
    args = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s, sh in zip(specs, in_sh))
    with fit_moe.sharded(mesh, batch_axes):  # experts layers multiply each batch shard's tokens on its chip
        result = compile_fit(fn, args, target, optimization_level=optimization_level, cache=cache)
    local = [_local_bytes(s, sh) for s, sh in zip(specs, in_sh)]
    param_bytes = sum(local[:n_p])
    state_bytes = sum(local[n_p + n_b:3 * n_p + n_b + 1]) if train else 0
    unsharded = tuple(n for i, n in enumerate(names) if unsplit(placements[n], specs[i].shape, plan))
    return FitCompile(result, plan, placements, param_bytes, state_bytes, sum(local[len(local) - n_batch:]),
                      unsharded)

