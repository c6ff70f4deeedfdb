"""``tpu_debug.fit``: does a model train (or run its forward) on a TPU slice, and how fast?

The model is built from a Hugging Face config on ``meta`` tensors (no weights,
nothing downloaded); one step (forward, loss, backward and AdamW for ``job="train"``)
is traced into a JAX function (``tpu_debug.fit.model_step.trace_step``), placed on a
``(dp, fsdp, tp)`` mesh of the slice's compile-only devices and compiled by XLA's
TPU compiler as one SPMD program (``tpu_debug.fit.sharded``). The answer, per chip:
the HBM the compiler's buffer assignment needs against what the compiler offers,
a breakdown, the collectives the partitioner inserted with their bytes and an ICI
time estimate, and estimated step time, tokens per second and MFU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpu_debug.core.collective_kinds import DATA_OPERAND_OPCODES, of_opcode
from tpu_debug.core.collectives import parse_collectives
from tpu_debug.core.format import format_bytes, format_count, format_seconds
from tpu_debug.core.hlo_text import parse_module
from tpu_debug.core.options import default_logdir
from tpu_debug.fit import moe as fit_moe
from tpu_debug.fit import techniques
from tpu_debug.fit.communication import OVER, CollectiveBound, ParamInfo, bounds, classify, collective_sites
from tpu_debug.fit.infer import compile_infer, decode_bound, trace_infer
from tpu_debug.fit.model_step import trace_step
from tpu_debug.fit.options import LOOP_ABOVE, FitOptions
from tpu_debug.fit.peak import looped_context, step_peak, unrolled_context
from tpu_debug.fit.scan import compile_scan_step, layer_stack, loop_repeats, trace_pieces
from tpu_debug.fit.sharded import AXES, FitCompile, Plan, _mesh, compile_sharded_step, parse_plan
from tpu_debug.runtime.target import parse_target
from tpu_debug.runtime.target.capacity import hbm_capacity
from tpu_debug.runtime.target.compile import CostStats, MemoryStats
from tpu_debug.runtime.target.errors import TargetError
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.runtime.target.roofline import op_by_op, roofline
from tpu_debug.tracers.events import FitBound, FitCollective, FitEvent
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.reading.peak_buffers import KIND_TEXT, made_where, remedies, shape_text
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import DB_NAME

from tpu_debug.runs import new_run_dir
from tpu_debug.tracing import active_trace

__all__ = [
    "PRESETS",
    "CollectiveCost",
    "FitReport",
    "Fixes",
    "MemoryBreakdown",
    "PlanSearch",
    "StepEstimate",
    "build_config",
    "fit",
    "fixes",
    "search",
]

#: Hugging Face configs by name (sizes from the models' published config.json files)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                max_position_embeddings=8192, rope_theta=500000.0)),
    "llama3-70b": ("llama", dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                 num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                 max_position_embeddings=8192, rope_theta=500000.0)),
    # mistralai/Mixtral-8x7B-v0.1 config.json
    "mixtral-8x7b": ("mixtral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                     num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
                                     rope_theta=1e6, sliding_window=None)),
    # google/gemma-2-9b config.json
    "gemma2-9b": ("gemma2", dict(
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, max_position_embeddings=8192,
        sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0)),
    "llama2-70b": ("llama", dict(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                                 num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                 max_position_embeddings=4096, rms_norm_eps=1e-5)),
    "tiny-llama": ("llama", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)),
}

# the largest FSDP axis whose program tests/fit compares with a direct sharded compile of the
# same FSDP layout
_FSDP_CHECKED = 32
# the same for the step whose layers run as one loop (tests/fit/test_fit_loop.py)
_FSDP_CHECKED_LOOP = 256


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """One chip's HBM for the step (bytes).

    The compiler's figures: ``arguments``, ``outputs``, ``aliased``, ``temporaries``,
    ``code``, ``total``. Split from the shardings (logical sizes, before TPU tile
    padding): ``parameters``, ``optimizer_state`` and ``batch`` are in the arguments;
    ``gradients`` (one copy of the chip's parameter share, an estimate) is in the
    temporaries; ``activations`` is the rest of the temporaries. ``host``: what the step
    places in the host's memory space (activations offloaded by the checkpoint policy; the
    compiler checks it against the host's space), outside ``total``; None when not known.
    """

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int
    total: int
    parameters: int
    optimizer_state: int
    batch: int
    gradients: int
    activations: int
    kv_cache: int = 0  # inference: one chip's share of the KV cache by its sharding (in the arguments)
    host: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveCost:
    """The collectives of one kind in the compiled step, per chip.

    Attributes:
        kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ...
        count: how many instructions.
        bytes: the data each chip contributes or receives, summed.
        wire_bytes: bytes each chip sends with ring algorithms, summed.
        seconds: estimated time on the ICI (see ``StepEstimate.assumptions``).
    """

    kind: str
    count: int
    bytes: int
    wire_bytes: int
    seconds: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class StepEstimate:
    """Estimated step time and throughput (model estimates, not measurements).

    Attributes:
        compute_seconds: the compiler's flops per chip (float32 dots at their bf16
            passes) over the chip's published bf16 peak.
        memory_seconds: the compiler's bytes accessed per chip over the HBM bandwidth.
        comm_seconds: the collectives' wire bytes over the ICI rate (None: no ICI figure).
        seconds: max(compute, memory) + communication, none of it overlapped.
        overlapped_seconds: max(compute, memory, communication), all of it overlapped.
        tokens_per_second: batch x seq / seconds.
        model_flops: the step's model FLOPs (see ``assumptions``), all chips.
        mfu: model_flops / (seconds x chips x peak); ``mfu_overlapped`` at the overlapped time.
        assumptions: what the estimate assumes, in words.
        op_by_op_seconds: the compiled step's ops one after another, each at the longer of
            its flops at peak and its HBM bytes (``runtime.target.roofline.op_by_op``; Pallas
            kernels at their own flops), plus communication; ``mfu_op_by_op`` at that time
            (None: not worked out for this kind of step).
    """

    compute_seconds: float
    memory_seconds: float
    comm_seconds: float | None
    seconds: float
    overlapped_seconds: float
    tokens_per_second: float
    model_flops: float
    mfu: float
    mfu_overlapped: float
    assumptions: tuple[str, ...]
    memory_bound_seconds: float | None = None  # decode: the weights and the KV cache read once, at HBM bandwidth
    op_by_op_seconds: float | None = None
    mfu_op_by_op: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FitReport:
    """The answer of ``fit``: one chip's memory, the collectives, the estimates.

    Attributes:
        model: what was built (``"llama3-8b"``, the config class name).
        target: the slice; plan: the mesh axes' sizes; job: ``"train"``, ``"forward"``,
            ``"prefill"`` or ``"decode"``.
        batch, seq: global batch (sequences) and sequence length.
        parameters: parameter count.
        fits: True, False (the compiler's HBM out-of-memory), None (another refusal).
        capacity: HBM one chip offers a program; capacity_source: ``"compiler"`` or ``"spec"``.
        required: HBM one chip needs (the compiler's total, or the figure of its OOM message).
        memory: the breakdown (None when the compile failed).
        collectives: per kind, in order of wire bytes.
        estimate: step time, tokens/s, MFU (None when the compile failed).
        unsharded: parameters no plan axis could split.
        error: the compiler's message when it refused the step.
        compile_seconds, seconds: the TPU compile(s) and the whole answer, wall clock.
        extrapolation: how the figures were extended from fewer layers; None when the
            whole model was compiled.
        method: how the decoder layers were compiled when not unrolled (as one loop).
        compile_cached: the compile was read back from the target compile cache
            (``compile_seconds`` is then what the first compile took).
        communication: each collective kind per step beside the plan's bound, with where its
            bytes come from (``tpu_debug.fit.communication.CollectiveBound``); empty when the
            compile failed or for inference.
        at_least: the parts of ``required`` when the compiler stopped early (an out-of-memory
            refusal): its message's figure (temporaries only) and the arguments known without
            it, ``(what, bytes)``; ``required`` is then their sum, a lower bound. Empty when
            ``required`` is the compiler's whole figure.
        peak: the step at its peak, buffer by buffer, with each buffer's kind and model line
            (``tracers.events.ProgramMemoryEvent``, from the compiler's buffer assignment, a
            refused step's too); None when the compiler wrote none (an extended answer).
    """

    model: str
    target: Target
    plan: Plan
    job: str
    batch: int
    seq: int
    parameters: int
    fits: bool | None
    capacity: int
    capacity_source: str
    required: int | None
    memory: MemoryBreakdown | None
    collectives: tuple[CollectiveCost, ...]
    estimate: StepEstimate | None
    unsharded: tuple[str, ...]
    error: str | None
    compile_seconds: float
    seconds: float
    extrapolation: str | None = None
    method: str | None = None
    compile_cached: bool = False
    at_least: tuple[tuple[str, int], ...] = ()
    communication: tuple[CollectiveBound, ...] = ()
    peak: Any = None

    @property
    def caveats(self) -> tuple[str, ...]:
        """What the answer cannot vouch for, said beside the verdict."""
        out = []
        checked = _FSDP_CHECKED_LOOP if self.method else _FSDP_CHECKED
        if self.plan.fsdp > checked:
            out.append(f"FSDP over {self.plan.fsdp} chips is wider than the {checked} checked against a "
                       "direct compile: the step is constrained to FSDP's layout (weights gathered where read, "
                       "gradients reduced to their shards, docs/fit.md), but how XLA lowers it this wide is "
                       "not checked")
        if self.extrapolation:
            out.append("the per-chip figures are extended from 2 and 3 layers, asked for: the TPU compiler "
                       "schedules a short program differently, and extended figures measured from 8 % under to "
                       "2.3 times their full compile (docs/fit.md): compile the whole model (the default) to settle "
                       "the verdict")
        return tuple(out)

    @property
    def headroom(self) -> int | None:
        """capacity - required: positive bytes to spare, negative bytes short."""
        return None if self.required is None else self.capacity - self.required

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (``--json``)."""
        data = dataclasses.asdict(self)
        data["target"] = self.target.name
        data["plan"] = str(self.plan)
        data["headroom"] = self.headroom
        data["caveats"] = list(self.caveats)
        data["communication"] = [{**dataclasses.asdict(b), "ratio": b.ratio, "over": b.over,
                                  "reasons": list(b.reasons())} for b in self.communication]
        return data

    def render(self, *, fixes_hint: bool = True) -> str:
        """The answer as text; ``fixes_hint``: a step that does not fit says how to find the fixes
        that do (off when the fixes are printed after it)."""
        return _render(self, fixes_hint)


def build_config(model: Any, overrides: dict[str, Any] | None = None):
    """A Hugging Face config from a preset name, a ``config.json`` path, a dict or a config.

    Raises:
        TargetError: an unknown preset or a file that is not a model config.
    """
    from transformers import AutoConfig, PretrainedConfig

    overrides = dict(overrides or {})
    if isinstance(model, PretrainedConfig):
        config = model.__class__.from_dict({**model.to_dict(), **overrides})
    elif isinstance(model, dict):
        data = {**model, **overrides}
        config = AutoConfig.for_model(data.pop("model_type", "llama"), **data)
    elif isinstance(model, str) and model in PRESETS:
        kind, sizes = PRESETS[model]
        config = AutoConfig.for_model(kind, **{**sizes, **overrides})
    elif isinstance(model, (str, Path)) and Path(model).is_file():
        data = json.loads(Path(model).read_text())
        if "model_type" not in data:
            raise TargetError(f"{model}: a Hugging Face config.json has a 'model_type'; this file has none")
        config = AutoConfig.for_model(data.pop("model_type"), **{**data, **overrides})
    else:
        raise TargetError(f"model {model!r}: give a Hugging Face config (LlamaConfig(...)), a config.json "
                          f"path, or a preset: {', '.join(PRESETS)}")
    config.use_cache = False  # a training step keeps no KV cache (and its empty tensors are graph constants)
    if getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None):

        # experts as one grouped matmul over the tokens each expert was routed (lowered to
        # lax.ragged_dot, dropless, as MaxText's MoE on TPU), each batch shard's tokens routed
        # on their own chip (tpu_debug.fit.moe): transformers' default loops over the
        # experts with data-dependent indexing, which a trace without data cannot follow
        fit_moe.register()
        config._experts_implementation = fit_moe.EXPERTS
    return config


@contextlib.contextmanager
def _hf_traceable():
    """Let transformers build its attention mask from traced tensors.

    Its mask code skips a packed-sequence check and the SDPA causal shortcut only while
    it believes it is being traced (``is_tracing``: dynamo, jit, fx proxies); ``make_fx``
    tensors are none of those, and the check reads a value a dry run does not have. The
    mask it then builds is the one ``torch.compile`` of the model gets.
    """
    try:
        import transformers.masking_utils as masking
    except ImportError:
        yield
        return
    saved = masking.is_tracing
    masking.is_tracing = lambda *args, **kwargs: True
    try:
        yield
    finally:
        masking.is_tracing = saved


def _loss(outputs, labels):
    import torch.nn.functional as F

    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    # next-token prediction, as a causal LM's own loss computes it
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


def _model_flops(model, config, tokens: int, seq: int, job: str) -> tuple[float, str]:
    from torch import nn

    embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    matmul = sum(p.numel() for p in model.parameters()) - embedding
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts and getattr(config, "num_experts_per_tok", None):
        # a token runs through num_experts_per_tok of the experts: only their weights count
        routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        matmul -= routed - routed * config.num_experts_per_tok // experts
    layers = getattr(config, "num_hidden_layers", 0)
    head_dim = getattr(config, "head_dim", None)
    heads = getattr(config, "num_attention_heads", 0)
    width = heads * head_dim if head_dim else getattr(config, "hidden_size", 0)
    forward = 2 * matmul + 4 * layers * seq * width  # weights' matmuls + QK^T and AV (no causal halving)
    per_token = 3 * forward if job == "train" else forward
    text = (f"model FLOPs per token {'6' if job == 'train' else '2'}N + {'12' if job == 'train' else '4'}"
            f"·L·s·d (N = {matmul / 1e9:.3g} B non-embedding parameters, L = {layers}, s = {seq}, "
            f"d = {width}; attention not halved for causality"
            + ("; N counts the experts a token is routed to" if experts else "") + ")")
    return float(per_token * tokens), text


def fit(model_or_config: Any, target: str | Target = "v5e-8", **options: Any) -> FitReport:
    """Compile one training (or forward) step of a model for a TPU slice as one sharded program.

    Args:
        model_or_config: a Hugging Face config (``LlamaConfig(...)``), a preset name
            (``"llama3-8b"``), a ``config.json`` path or a dict with ``model_type``.
        target: the slice (``"v5e-8"``, ``"v6e-256"``, ``"v5p-128"``).
        options: the other fields of :class:`~tpu_debug.fit.options.FitOptions`, as
            keywords: ``plan``, ``batch``, ``seq``, ``job``, ``dtype``, ``overrides``,
            ``extrapolate``, ``shard_activations``, ``optimization_level``, ``cache``,
            ``loop``, ``remat``, ``master_dtype``, ``loss``, ``remat_policy``, ``attention``
            (each described there).

    Returns:
        A ``FitReport``.

    Raises:
        TargetError: an unknown job, model, or a plan that does not match the slice; options
            that contradict each other (``FitOptions``).
        TargetSpecError, LibtpuMissingError: as ``compile_for_target``.

    Example::

        report = tpu_debug.fit(LlamaConfig(...), "v5e-8", plan="fsdp", batch=8, seq=2048)
        report.fits, report.headroom
    """
    return _fit(model_or_config, FitOptions(target=target, **options))


fit.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("model_or_config", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     *(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name == "target"
                         else inspect.Parameter.KEYWORD_ONLY, default=f.default)
       for f in dataclasses.fields(FitOptions))],
    return_annotation="FitReport",
)


def _fit(model_or_config: Any, options: FitOptions) -> FitReport:
    """``fit`` with its options made (and so checked)."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    o = options
    tgt = parse_target(o.target)
    chosen = parse_plan(o.plan, tgt.devices)
    if o.batch % chosen.batch_ways:
        raise TargetError(f"batch {o.batch} does not split over dp x fsdp = {chosen.batch_ways} chips: "
                          f"use a multiple of {chosen.batch_ways}")
    config = build_config(model_or_config, dict(o.overrides) if o.overrides is not None else None)
    layers = getattr(config, "num_hidden_layers", 0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, o.dtype))
    parameters = sum(p.numel() for p in model.parameters())
    tokens = o.batch if o.job == "decode" else o.batch * o.seq
    flops, flops_text = _model_flops(model, config, tokens, o.seq, o.job)
    del model
    name = str(model_or_config if isinstance(model_or_config, str) else type(config).__name__)
    loop = o.loop
    if loop is None:
        loop = o.job == "train" and layers > LOOP_ABOVE and _has_layer_stack(config, o.dtype)
    _probe_capacity(tgt)
    if loop or o.shapes_the_loop:
        measured, how = _measure_loop(config, tgt, chosen, o)
        return _report(name, tgt, o.job, o.batch, o.seq, parameters, measured, flops, flops_text,
                       time.perf_counter() - started, None, how)
    if o.extrapolate and layers > FIRST + 1:
        one = _measure(build_config(config, {"num_hidden_layers": FIRST}), tgt, chosen, o)
        two = _measure(build_config(config, {"num_hidden_layers": FIRST + 1}), tgt, chosen, o)
        measured = _extrapolate(one, two, FIRST, layers)
        if measured.error is not None:
            refused = FIRST + 1 if two.error is not None else FIRST
            how = (f"the step with {refused} of the {layers} decoder layers was refused already; its figure "
                   "is a lower bound for the whole model")
        else:
            how = (f"compiled with {FIRST} and {FIRST + 1} of the {layers} decoder layers; every per-chip "
                   f"figure extended linearly to {layers} (identical layers add identical buffers, "
                   "collectives and flops)")
    else:
        measured, how = _measure(config, tgt, chosen, o), None
    return _report(name, tgt, o.job, o.batch, o.seq, parameters, measured, flops, flops_text,
                   time.perf_counter() - started, how)


def _probe_capacity(tgt: Target) -> None:
    """Find the target's usable HBM (``hbm_capacity``: a dozen tiny compiles, once per
    topology and process) on a thread beside the step's tracing and compile, which need
    seconds to minutes; ``_report`` reads it (waiting if the probes are still compiling).
    Not a daemon: the interpreter waits for it, so no compile is cut off at exit."""
    import threading


    def probe():
        try:
            hbm_capacity(tgt)
        except Exception:  # noqa: BLE001 - _report asks again and raises it there
            pass

    threading.Thread(target=probe, name="tpu_debug-fit-capacity").start()


def _has_layer_stack(config, dtype: str) -> bool:
    import torch
    from transformers import AutoModelForCausalLM


    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return layer_stack(model) is not None


def _measure_loop(config, tgt: Target, plan: Plan, o: FitOptions) -> tuple[_Measure, str]:
    """The training step with its decoder layers as one loop (``tpu_debug.fit.scan``)."""
    batch, seq, dtype, remat, master_dtype, attention = o.batch, o.seq, o.dtype, o.remat, o.master_dtype, o.attention
    optimization_level, cache, loss, policy_name = o.optimization_level, o.cache, o.loss, o.remat_policy
    import torch
    from transformers import AutoModelForCausalLM


    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    tokens = torch.empty(batch, seq, dtype=torch.long, device="meta")
    chunked = loss == "chunked"
    with fit_moe.per_shard(plan.batch_ways), techniques.attention_as(attention), \
            techniques.traced_loss(model, chunked) as head_loss:
        pieces = trace_pieces(model, tokens, techniques.hidden_of if chunked else _loss, _hf_traceable)
    chosen = techniques.policy(policy_name or ("full" if remat else "matmuls"))
    fc = compile_scan_step(pieces, (batch, seq), tgt, plan, remat=remat, master_dtype=master_dtype,
                           optimization_level=optimization_level, cache=cache, policy=chosen.make(),
                           head_loss=head_loss, compiler_options=techniques.compiler_options(attention))
    c = fc.compile
    repeats = loop_repeats(c.hlo or "", pieces.layers) if c.ok else {}
    collectives = collective_costs(c.hlo or "", tgt, repeats) if c.ok else ()
    communication = ()
    if c.ok:
        params = [ParamInfo(n, tuple(pieces.specs[n].shape[1:]), pieces.layers,
                            _split(fc.placements[f"{pieces.prefix}.0.{n}"]), recomputed=chosen.name == "full")
                  for n in pieces.inner]
        params += [ParamInfo(n, tuple(pieces.specs[n].shape), 1, _split(fc.placements[n]),
                             embedding=n.endswith("embed_tokens.weight")) for n in pieces.outer]
        communication = _communication(c.hlo, repeats, collectives, params, plan, dtype, master_dtype or dtype)
    keeps = chosen.keeps
    gathers = "; FSDP weights gathered inside the loop, again in the backward" if plan.fsdp > 1 else ""
    how = (f"the {pieces.layers} decoder layers as one loop over their stacked parameters (jax.lax.scan, "
           f"every layer in the program, one compiled; backward by JAX's autodiff); each layer keeps {keeps} "
           f"for the backward{gathers}")
    if master_dtype:
        how += f"; parameters and AdamW state kept in {master_dtype}, cast to {dtype} where read"
    if chunked:
        how += f"; {techniques.CHUNKED_NOTE}"
    if attention in techniques.NOTES:
        how += f"; {techniques.NOTES[attention]}"
    if getattr(config, "_experts_implementation", None) == fit_moe.EXPERTS:
        how += f"; {_MOE_NOTE}"
    if optimization_level in ("O0", "O1"):
        how += (f"; compiled at {optimization_level}, whose buffers are not the default level's: Llama-3-8B's "
                "looped step needed 16.7 GiB per chip at O0, 11.8 at the default level (v6e-64, fsdp)")
    passes = 0.0
    by_op = None
    if c.ok:  # the f32 dots' extra bf16 passes are read from the HLO, where the loop body is once
        r = roofline(c)
        passes = r.flops + (r.pass_flops - r.flops) * fc.flops_scale
        by_op = op_by_op(c.hlo or "", tgt, repeats, techniques.splash_kernel_flops).seconds
    peak = step_peak(c, looped_context(f"{type(config).__name__} train step", pieces))
    return _Measure(plan, c.error, c.memory, c.cost, collectives, fc.param_bytes, fc.state_bytes,
                    fc.batch_bytes, fc.unsharded, c.seconds, passes, cached=c.cached,
                    communication=communication, op_by_op_seconds=by_op, peak=peak), how


def _split(placements: tuple) -> bool:
    """The placements split the tensor over the fsdp axis (the mesh's second)."""
    return not placements[1].is_replicate()


def _communication(hlo: str, repeats: dict[str, int], collectives: Sequence[CollectiveCost],
                   params: Sequence[ParamInfo], plan: Plan, dtype: str, grad_dtype: str):
    """Each collective kind of the compiled step beside the plan's bound, with where its bytes
    come from (``tpu_debug.fit.communication``)."""

    items = [(c, data, runs) for c, data, _, runs in collective_items(hlo, repeats)]
    return bounds({c.kind: c.bytes for c in collectives}, classify(items, params), params, fsdp=plan.fsdp,
                  dp=plan.dp, tp=plan.tp, dtype=dtype, grad_dtype=grad_dtype)


# how the looped step's mixture-of-experts layers run (docs/fit.md)
_MOE_NOTE = ("each batch shard's tokens routed to the experts on its own chip, the experts as one grouped "
             "matmul over them (a shard_map over the batch axes), their weights gathered as FSDP gathers")


# the layer counts compiled to extrapolate from: a one-layer step's temporaries are not on the
# line the longer ones lie on (a Llama step's peak grows by one layer's activations from two
# layers on; from one to two by less), so the line goes through 2 and 3
FIRST = 2


@dataclasses.dataclass(frozen=True, slots=True)
class _Measure:
    """One compiled step's per-chip figures (or the compiler's refusal)."""

    plan: Plan
    error: Any
    memory: Any
    cost: Any
    collectives: tuple[CollectiveCost, ...]
    param_bytes: int
    state_bytes: int
    batch_bytes: int
    unsharded: tuple[str, ...]
    compile_seconds: float
    pass_flops: float  # the compiler's flops with each float32 dot counted once per bf16 pass
    kv_bytes: int = 0  # one chip's KV cache (prefill, decode)
    cached: bool = False  # read back from the target compile cache: compile_seconds is the first compile's
    communication: tuple = ()  # CollectiveBound per kind (tpu_debug.fit.communication)
    op_by_op_seconds: float | None = None  # the step's ops one after another (roofline.op_by_op), no collectives
    peak: Any = None  # the step at its peak, buffer by buffer (tracers.events.ProgramMemoryEvent)


def _measure_infer(model, config, tgt: Target, plan: Plan, o: FitOptions):
    """``fit``'s per-chip figures of a prefill or decode program."""
    batch, seq, job, optimization_level, cache = o.batch, o.seq, o.job, o.optimization_level, o.cache

    traced = trace_infer(model, config, batch, seq, job, _hf_traceable)
    names = [n for n, _ in model.named_parameters()]
    fc, kv_bytes = compile_infer(traced, names, config.num_hidden_layers, tgt, plan,
                                 optimization_level=optimization_level, cache=cache)
    c = fc.compile
    collectives = collective_costs(c.hlo or "", tgt) if c.ok else ()
    peak = step_peak(c, unrolled_context(f"{type(config).__name__} {job} step", traced, names, train=False))
    return _Measure(plan, c.error, c.memory, c.cost, collectives, fc.param_bytes, 0, fc.batch_bytes,
                    fc.unsharded, c.seconds, roofline(c).pass_flops if c.ok else 0.0, kv_bytes, c.cached,
                    peak=peak)


def _measure(config, tgt: Target, plan: Plan, o: FitOptions) -> _Measure:
    import torch
    from transformers import AutoModelForCausalLM


    batch, seq, job, dtype = o.batch, o.seq, o.job, o.dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if job in ("prefill", "decode"):

        axes = tuple(a for a, n in zip(AXES, plan.shape) if n > 1 and a != "tp")
        with fit_moe.per_shard(plan.batch_ways), fit_moe.sharded(_mesh(tgt, plan), axes):
            return _measure_infer(model, config, tgt, plan, o)
    tokens = torch.empty(batch, seq, dtype=torch.long, device="meta")
    train = job == "train"
    with _hf_traceable(), fit_moe.per_shard(plan.batch_ways):
        traced = trace_step(model, (tokens,), train=train, loss_fn=_loss if train else None,
                            targets=(tokens,) if train else ())
    names = [n for n, _ in model.named_parameters()]
    fc: FitCompile = compile_sharded_step(traced, names, 2 if train else 1, tgt, plan,
                                          shard_activations=o.shard_activations,
                                          optimization_level=o.optimization_level, cache=o.cache)

    c = fc.compile
    collectives = collective_costs(c.hlo or "", tgt) if c.ok else ()
    communication = ()
    if c.ok and train:  # the bound counts a training step's passes
        shapes = dict(model.named_parameters())
        params = [ParamInfo(n, tuple(shapes[n].shape), 1, _split(fc.placements[n]),
                            embedding=n.endswith("embed_tokens.weight")) for n in names]
        communication = _communication(c.hlo, {}, collectives, params, plan, dtype, dtype)
    peak = step_peak(c, unrolled_context(f"{type(config).__name__} {job} step", traced, names, train=train))
    return _Measure(plan, c.error, c.memory, c.cost, collectives, fc.param_bytes, fc.state_bytes,
                    fc.batch_bytes, fc.unsharded, c.seconds, roofline(c).pass_flops if c.ok else 0.0,
                    cached=c.cached, communication=communication, peak=peak)


def _extrapolate(one: _Measure, two: _Measure, first: int, layers: int) -> _Measure:
    """Figures of a ``layers``-layer step from the ``first``- and ``first + 1``-layer steps:
    x(L) = x1 + (L - first)(x2 - x1)."""

    def ext(a, b):
        return a + (layers - first) * (b - a)

    if one.error is not None or two.error is not None:  # a refusal stands: a longer model needs more
        return two if two.error is not None else one
    def extended(a, b):
        return None if a is None or b is None else int(ext(a, b))

    m = MemoryStats(*(extended(getattr(one.memory, f.name), getattr(two.memory, f.name))
                      for f in dataclasses.fields(MemoryStats)))
    cost = CostStats(ext(one.cost.flops, two.cost.flops),
                     ext(one.cost.transcendentals, two.cost.transcendentals),
                     ext(one.cost.bytes_accessed, two.cost.bytes_accessed), None)
    kinds = dict.fromkeys([c.kind for c in two.collectives] + [c.kind for c in one.collectives])
    zero = CollectiveCost("", 0, 0, 0, 0.0)
    collectives = []
    for kind in kinds:
        a = next((c for c in one.collectives if c.kind == kind), zero)
        b = next((c for c in two.collectives if c.kind == kind), zero)
        seconds = None if b.seconds is None else max(ext(a.seconds or 0.0, b.seconds), 0.0)
        collectives.append(CollectiveCost(kind, max(ext(a.count, b.count), 0), max(ext(a.bytes, b.bytes), 0),
                                          max(ext(a.wire_bytes, b.wire_bytes), 0), seconds))
    collectives.sort(key=lambda c: -c.wire_bytes)
    return _Measure(two.plan, None, m, cost, tuple(collectives), ext(one.param_bytes, two.param_bytes),
                    ext(one.state_bytes, two.state_bytes), two.batch_bytes, two.unsharded,
                    one.compile_seconds + two.compile_seconds, ext(one.pass_flops, two.pass_flops),
                    ext(one.kv_bytes, two.kv_bytes), one.cached and two.cached)


def _report(name: str, tgt: Target, job: str, batch: int, seq: int, parameters: int, fc: _Measure,
            flops: float, flops_text: str, seconds: float, extrapolation: str | None,
            method: str | None = None) -> FitReport:

    capacity, source = hbm_capacity(tgt)
    memory = estimate = None
    at_least: tuple[tuple[str, int], ...] = ()
    if fc.error is None:
        m = fc.memory
        grads = fc.param_bytes if job == "train" else 0
        memory = MemoryBreakdown(m.argument_bytes, m.output_bytes, m.alias_bytes, m.temp_bytes,
                                 m.generated_code_bytes, m.total_bytes, fc.param_bytes, fc.state_bytes,
                                 fc.batch_bytes, grads, max(m.temp_bytes - grads, 0), fc.kv_bytes,
                                 m.host_bytes)
        estimate = _estimate(fc, tgt, batch if job == "decode" else batch * seq, flops, flops_text)
        if job == "decode":

            estimate = decode_bound(estimate, fc, tgt)
        required = m.total_bytes
        fits = required <= capacity
    else:
        required, at_least = _lower_bound(fc, job)
        fits = False if fc.error.kind == "hbm_oom" else None
    return FitReport(name, tgt, fc.plan, job, batch, seq, parameters, fits, capacity, source, required,
                     memory, fc.collectives, estimate, fc.unsharded,
                     None if fc.error is None else fc.error.message, fc.compile_seconds, seconds,
                     extrapolation, method, fc.cached, at_least, fc.communication,
                     dataclasses.replace(fc.peak, name=step_name(name, job)) if fc.peak is not None else None)


def step_name(model: str, job: str) -> str:
    """How a fit's step is named among a run's programs (its peak's ``ProgramMemoryEvent.name``)."""
    return f"{model} {job} step"


def _lower_bound(fc: _Measure, job: str) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    """What a refused step needs. The compiler's "total memory required for HLO temporaries"
    is its whole buffer assignment, the parameters and optimizer state included (the refused
    program's assignment adds up to it, to the byte: core/buffers.py): that is the need. The
    older "Used X of Y hbm" counts what it had placed when it stopped, not the arguments: the
    need is at least that plus the parameters and optimizer state (one chip's shards)."""
    figure = fc.error.required_bytes
    if figure is None or fc.error.kind != "hbm_oom" or getattr(fc.error, "what", None) == "HLO temporaries":
        return figure, ()
    parts = [("the compiler's temporaries when it stopped", figure), ("parameters", fc.param_bytes)]
    if job == "train":
        parts.append(("optimizer state", fc.state_bytes))
    parts = [(what, n) for what, n in parts if n]
    return sum(n for _, n in parts), tuple(parts)


def needs_text(r: FitReport) -> str:
    """``needs 12.00 GiB``, or ``needs at least 141.74 GiB`` when the compiler stopped early."""
    return f"needs {'at least ' if r.at_least else ''}{format_bytes(r.required)}"


FIXES_HINT = ("  to find what fits: add --fixes (tpu_debug.fit.fixes): it compiles each fix (bfloat16, activation "
              "checkpointing, fewer sequences, a bigger slice) and prints the ones that fit")


def ici_rate(tgt: Target) -> float | None:
    """Bytes/s one chip sends: half its published bidirectional ICI bandwidth (every port
    busy, one direction sending); None where the generation publishes no figure."""
    bw = tgt.generation.ici_bandwidth
    return None if bw is None else bw / 2 / tgt.generation.devices_per_chip


def collective_costs(hlo: str, tgt: Target, repeats: dict[str, int] | None = None) -> tuple[CollectiveCost, ...]:
    """The compiled step's collectives by kind, with an ICI time estimate for each.

    ``repeats``: instruction name -> runs per step, for instructions in loops (the looped
    step's layer loops); a collective there counts that many times.

    A collective's bytes are the larger of what its result and its operands hold (an
    all-gather's result is operand x group, a reduce-scatter's operand result x group):
    the TPU compiler fuses converts into collectives, so an all-reduce may sum float32
    operands into a bfloat16 result, and the operands are then what travels. A collective
    the compiler threads through several fusions to overlap it with compute is counted
    once (``tpu_debug.fit.communication.collective_sites``).
    """
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for c, data, wire, runs in collective_items(hlo, repeats):
        by_kind.setdefault(c.opcode, []).extend([(data, wire)] * runs)
    rate = ici_rate(tgt)
    costs = [CollectiveCost(kind, len(items), sum(d for d, _ in items), sum(w for _, w in items),
                            None if rate is None else sum(w for _, w in items) / rate)
             for kind, items in by_kind.items()]
    return tuple(sorted(costs, key=lambda c: -c.wire_bytes))


def collective_items(hlo: str, repeats: dict[str, int] | None = None) -> list[tuple[Any, int, int, int]]:
    """``(Collective, bytes, wire bytes, runs per step)`` for each collective the step runs
    (see ``collective_costs``), each once however many fusions hold a copy of it."""

    operands = _operand_bytes(hlo)
    sites = collective_sites(hlo)
    holder: dict[tuple[str, str], str] = {}  # (running computation, channel) -> the computation counted
    out = []
    for c in parse_collectives(hlo):
        times = 1
        site = sites.get(c.instruction)
        if site is not None:
            root, channel, computation, times = site
            if holder.setdefault((root, channel), computation) != computation:
                continue  # a copy of a collective already counted, in another fusion
        n = max(c.group_size, 1)
        given = operands.get(c.instruction, 0)
        if of_opcode(c.opcode).gathers:
            given *= n
        data = max(c.nbytes, given)
        wire = c.wire_bytes if data == c.nbytes or c.nbytes == 0 else c.wire_bytes * data // c.nbytes
        out.append((c, data, wire, (repeats or {}).get(c.instruction, 1) * times))
    return out




def _operand_bytes(hlo: str) -> dict[str, int]:
    """Collective instruction name -> bytes of its operands (from their definitions' shapes)."""
    module = parse_module(hlo)
    shapes = {i.name: i.shape for i in module.instructions()}
    return {i.name: sum(shapes[n].nbytes for n in i.operands if n in shapes) for i in module.instructions()
            if i.opcode.removesuffix("-start") in DATA_OPERAND_OPCODES}


def _estimate(fc: _Measure, tgt: Target, tokens: int, flops: float, flops_text: str) -> StepEstimate:
    collectives = fc.collectives
    compute = fc.pass_flops / tgt.peak_bf16_flops_per_device
    memory = fc.cost.bytes_accessed / tgt.hbm_bandwidth_per_device
    comm = None if ici_rate(tgt) is None else sum(x.seconds or 0.0 for x in collectives)
    step = max(compute, memory) + (comm or 0.0)
    overlapped = max(compute, memory, comm or 0.0)
    peak = tgt.peak_bf16_flops_per_device * tgt.devices
    rate = ici_rate(tgt)
    assumptions = (
        "compute: the TPU compiler's flops per chip (a float32 dot once per bf16 pass its precision "
        f"takes) at the published bf16 peak ({tgt.generation.peak_bf16_flops / 1e12:.0f} TFLOP/s per chip), "
        "every flop at peak",
        f"memory: the compiler's bytes accessed per chip at the published HBM bandwidth "
        f"({tgt.generation.hbm_bandwidth / 1e9:.0f} GB/s)",
        ("communication: ring wire bytes per chip at half the published bidirectional ICI bandwidth "
         f"({rate / 1e9:.0f} GB/s sent per chip)") if rate else
        f"communication: not estimated ({tgt.generation.name} publishes no per-chip ICI bandwidth)",
        "step = max(compute, memory) + communication (nothing overlapped); the overlapped figure "
        "assumes XLA hides every collective behind compute",
        *(() if fc.op_by_op_seconds is None else (
            ("op by op: each op of the compiled step (a loop body's once per trip) at the longer of its flops "
             "at peak and its HBM bytes at the bandwidth, one after another, plus communication; Pallas "
             "kernels at the flops they compute (splash: the causal blocks only); copies to and from host "
             "memory not timed (the link's rate is not published)"),)),
        flops_text,
        f"source: {tgt.generation.source}",
    )
    by_op = None if fc.op_by_op_seconds is None else fc.op_by_op_seconds + (comm or 0.0)
    return StepEstimate(compute, memory, comm, step, overlapped,
                        tokens / step if step > 0 else 0.0, flops,
                        flops / (step * peak) if step > 0 else 0.0,
                        flops / (overlapped * peak) if overlapped > 0 else 0.0, assumptions,
                        op_by_op_seconds=by_op,
                        mfu_op_by_op=flops / (by_op * peak) if by_op else None)


# buffers of the step's peak an answer names
PEAK_LINES = 5


def _peak_lines(r: FitReport) -> list[str]:
    """The step's peak by kind and its largest buffers, each with its model line."""
    p = r.peak
    if p is None:
        return []
    kinds = ", ".join(f"{KIND_TEXT.get(k, k)} {format_bytes(v)}" for k, v in p.by_kind().items())
    executable = (f"; the executable reports {format_bytes(p.compiler_bytes)} without its code"
                  if p.compiler_bytes is not None and p.compiler_bytes != p.total_bytes else "")
    lines = [f"  at its peak: {format_bytes(p.total_bytes)} in the compiler's buffer assignment{executable}, "
             f"while {p.peak_op or '-'} runs: {kinds}"]
    for b in [b for b in p.buffers if b.count == 1 and b.kind != "unused"][:PEAK_LINES]:
        made = f"{b.op} at {made_where(b)}" if b.file else made_where(b)
        lines.append(f"    {format_bytes(b.nbytes):>11} {KIND_TEXT.get(b.kind, b.kind)}, {shape_text(b)}, {made}")
    return lines


def _render(r: FitReport, fixes_hint: bool = True) -> str:
    verdict = {True: "FITS", False: "DOES NOT FIT", None: "REFUSED by the compiler"}[r.fits]
    source = "the compiler's usable HBM" if r.capacity_source == "compiler" else "spec sheet"
    lines = [(f"{r.model} ({format_count(r.parameters)} parameters), {r.job}, batch {r.batch} x seq {r.seq} on "
              f"{r.target.name} ({r.target.devices} x {r.target.device_kind}), plan {r.plan}: {verdict}")]
    lines.extend(f"  caution: {c}" for c in r.caveats)
    if r.required is not None:
        room = r.headroom
        spare = f"{format_bytes(room)} to spare" if room >= 0 else f"{format_bytes(-room)} short"
        spare = f"at least {spare}" if r.at_least and room < 0 else spare
        lines.append(f"  per chip: {needs_text(r)} of {format_bytes(r.capacity)} ({source}); {spare}")
        if r.at_least:
            lines.append("    the compiler stopped at its first allocation that did not fit: "
                         + " + ".join(f"{what} {format_bytes(n)}" for what, n in r.at_least))
    if r.error and not r.fits:
        lines.append(f"  compiler: {r.error}")
    m = r.memory
    if m is not None:
        lines.append(f"  compiler: arguments {format_bytes(m.arguments)}, outputs {format_bytes(m.outputs)} "
                     f"(aliased {format_bytes(m.aliased)}), temporaries {format_bytes(m.temporaries)}, "
                     f"code {format_bytes(m.code)}")
        lines.append(f"  breakdown: parameters {format_bytes(m.parameters)}, optimizer state "
                     f"{format_bytes(m.optimizer_state)}, batch {format_bytes(m.batch)}, gradients "
                     f"~{format_bytes(m.gradients)}, activations and other temporaries ~{format_bytes(m.activations)}")
        if m.host:
            lines.append(f"  host memory: {format_bytes(m.host)} per chip offloaded by the checkpoint policy "
                         "(the compiler's host temporaries; not in the HBM figures)")
        if m.kv_cache:
            lines.append(f"  KV cache: {format_bytes(m.kv_cache)} per chip (its share by the cache's sharding; "
                         "in the arguments, donated and written in place)")
    lines.extend(_peak_lines(r))
    if r.collectives:
        lines.append("  collectives per step (per chip):")
        for c in r.collectives:
            lines.append(f"    {c.kind:<18} x{c.count:<4} {format_bytes(c.bytes):>11} data, "
                         f"{format_bytes(c.wire_bytes):>11} on the wire, ~{format_seconds(c.seconds)}")
    if r.communication:
        lines.append("  communication per step (per chip) beside the plan's bound:")
        for b in r.communication:
            ratio = f"{b.ratio:.2f}x the bound" if b.ratio is not None else "the plan needs none"
            lines.append(f"    {b.kind:<18} {format_bytes(b.compiled):>11} compiled, bound {format_bytes(b.bound):>11}: "
                         f"{ratio}")
            lines.append(f"      bound: {b.basis}")
            reasons = b.reasons()
            if reasons:
                lines.append(f"      over {OVER}x: measured in the compiled HLO, the bytes come from")
                lines.extend(f"        {why}" for why in reasons)
            elif b.ratio is not None and b.ratio < 1 and b.shares:
                # under the plan's count: the compiler shared a gather between passes; the shares say which ran
                lines.append("      under the bound: measured in the compiled HLO, " + "; ".join(
                    f"{x.what} {format_bytes(x.bytes)}" for x in b.shares[:3]))
    e = r.estimate
    if e is not None:
        lines.append(f"  estimate (not a measurement): step ~{format_seconds(e.seconds)} (compute "
                     f"{format_seconds(e.compute_seconds)}, memory {format_seconds(e.memory_seconds)}, communication "
                     f"{format_seconds(e.comm_seconds)}; {format_seconds(e.overlapped_seconds)} if all overlapped), "
                     f"~{e.tokens_per_second:,.0f} tokens/s, MFU ~{e.mfu:.1%} "
                     f"({e.mfu_overlapped:.1%} overlapped)")
        if e.op_by_op_seconds is not None:
            lines.append(f"  op by op (estimate): step ~{format_seconds(e.op_by_op_seconds)}, MFU ~{e.mfu_op_by_op:.1%}")
        if e.memory_bound_seconds is not None:
            lines.append(f"  decode, memory-bound (estimate): ~{format_seconds(e.memory_bound_seconds)} per token step "
                         "reading the chip's weights and KV cache once at HBM bandwidth")
        lines.extend(f"    assumes {a}" for a in e.assumptions)
    if r.unsharded:
        more = " ..." if len(r.unsharded) > 6 else ""
        lines.append(f"  not split by the plan (whole on every chip): {', '.join(r.unsharded[:6])}{more}")
    if r.extrapolation:
        lines.append(f"  extrapolated: {r.extrapolation}")
    if r.method:
        lines.append(f"  compiled as: {r.method}")
    compiled = (f"TPU compile read from the cache; it took {r.compile_seconds:.1f} s when compiled"
                if r.compile_cached else f"TPU compile {r.compile_seconds:.1f} s")
    lines.append(f"  answered in {r.seconds:.1f} s ({compiled})")
    if fixes_hint and r.fits is False:
        lines.append(FIXES_HINT)
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True, slots=True)
class PlanSearch:
    """A small plan search: each candidate compiled, and the one recommended.

    Attributes:
        question: ``"smallest slice"`` or ``"largest batch"``.
        candidates: every candidate's report, in the order compiled.
        best: the recommended candidate (None when none fits).
    """

    question: str
    candidates: tuple[FitReport, ...]
    best: FitReport | None

    def render(self) -> str:
        lines = [f"{self.question}: {self.headline()}"]
        lines.append(f"  {'target':<9} {'plan':<14} {'batch':>6} {'remat':<5}  {'fits':<5} {'needs/chip':>11} "
                     f"{'of':>10}  {'step~':>9} {'MFU~':>6}")
        for r in self.candidates:
            e = r.estimate
            fits = {True: "yes", False: "no", None: "refused"}[r.fits]
            needs = (">=" if r.at_least else "") + format_bytes(r.required)
            lines.append(f"  {r.target.name:<9} {r.plan!s:<14} {r.batch:>6} {_yes_no(remat_of(r)):<5}  {fits:<5} "
                         f"{needs:>11} {format_bytes(r.capacity):>10}  "
                         f"{format_seconds(e.seconds) if e else '-':>9} {f'{e.mfu:.1%}' if e else '-':>6}")
        if self.best is None:
            lines.append(self.next_step())
        return "\n".join(lines)

    def headline(self) -> str:
        """The answer and what it holds only under (``v5e-8, plan fsdp=8, batch 8, fits only
        with activation checkpointing``)."""
        b = self.best
        if b is None:
            last = self.candidates[-1] if self.candidates else None
            tried = f" (the last tried, {last.target.name} batch {last.batch}, {needs_text(last)} of " \
                    f"{format_bytes(last.capacity)} per chip)" if last is not None else ""
            return f"no candidate fits{tried}"
        answer = f"{b.target.name}, plan {b.plan}, batch {b.batch}"
        return answer + (", fits only with activation checkpointing (remat)" if remat_of(b) else "")

    def next_step(self) -> str:
        """What to try when no candidate fits."""
        if not any(remat_of(r) for r in self.candidates):
            return "  next: --with-remat also compiles each candidate with activation checkpointing;\n" + FIXES_HINT
        return FIXES_HINT


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def search(model_or_config: Any, question: str, target: str | Target = "v5e-8", *, plan: str = "fsdp",
           batch: int = 8, seq: int = 2048, max_batch: int = 4096, with_remat: bool = False,
           **options: Any) -> PlanSearch:
    """Compile candidates to find the smallest slice that fits, or the largest batch.

    Args:
        question: ``"slice"``: the slices of ``target``'s generation from the smallest up,
            each with ``plan``'s axis over all its chips and the global ``batch``
            (slices whose chips do not divide it are skipped), until one fits;
            ``"batch"``: on ``target``, the batch doubled from ``batch`` until a step
            does not fit (or ``max_batch``).
        plan: one axis name (``"fsdp"``, ``"dp"``) for ``"slice"``; any plan for ``"batch"``.
        with_remat: also compile each candidate with activation checkpointing (``remat=True``):
            a slice that fits only with it is recommended with it; the largest batch is the
            largest either way.
        options: as ``fit`` (``job``, ``dtype``, ``overrides``, ``optimization_level``, ...).

    Raises:
        TargetError: an unknown question, or a sized plan for ``"slice"``.
    """
    tgt = parse_target(target)
    reports: list[FitReport] = []
    if question == "slice":
        if plan not in ("fsdp", "dp", "tp"):
            raise TargetError(f"search 'slice' takes one plan axis (fsdp, dp or tp), not {plan!r}")
        gen = tgt.generation
        for count in sorted(gen.slices):
            candidate = parse_target(f"{gen.name}-{count}")
            if plan != "tp" and batch % candidate.devices:
                continue
            for remat in (False, True) if with_remat else (False,):
                reports.append(fit(model_or_config, candidate, plan=plan, batch=batch, seq=seq,
                                   **{**options, **({"remat": True} if remat else {})}))
                if reports[-1].fits:
                    return PlanSearch("smallest slice", tuple(reports), reports[-1])
        return PlanSearch("smallest slice", tuple(reports), None)
    if question != "batch":
        raise TargetError(f"search {question!r}: ask 'slice' (the smallest slice that fits) or 'batch' "
                          "(the largest batch)")
    best = None
    for remat in (False, True) if with_remat else (False,):
        size = batch
        while size <= max_batch:
            reports.append(fit(model_or_config, tgt, plan=plan, batch=size, seq=seq,
                               **{**options, **({"remat": True} if remat else {})}))
            if not reports[-1].fits:
                break
            if best is None or size > best.batch:
                best = reports[-1]
            size *= 2
    return PlanSearch("largest batch", tuple(reports), best)


def remat_of(report: FitReport) -> bool:
    """Whether the answer's step checkpointed its layers' activations."""
    return bool(report.method and "activation checkpointing" in report.method)


@dataclasses.dataclass(frozen=True, slots=True)
class Fixes:
    """What would make a step fit, each compiled: ``(what was changed, its answer)``, the
    recommended first (the first that fits, in the order tried); ``best`` is it or None."""

    original: FitReport
    tried: tuple[tuple[str, FitReport], ...]
    # the PyTorch change each of ``tried`` means, in its order
    code: tuple[str, ...] = ()
    # what of the original step's peak each of ``tried`` goes after ("activations kept for
    # backward, 8.00 GiB at the peak"; "" when the peak is not known), in its order
    addresses: tuple[str, ...] = ()

    @property
    def best(self) -> tuple[str, FitReport] | None:
        return next(((what, r) for what, r in self.tried if r.fits), None)

    def lines(self) -> tuple[str, ...]:
        """One line per change: what, the need per chip, the verdict; the recommended first."""
        best = self.best
        ordered = ([best] if best else []) + [t for t in self.tried if t is not best]
        verdicts = {True: "fits", False: "does not fit", None: "refused"}
        aim = dict(zip((what for what, _ in self.tried), self.addresses))
        # "<change>: <need> of <capacity>[ (for <kinds>)], <verdict>": the advisor reads the change
        # before the first colon and the verdict after the last comma (tracers/advisor/fit_rules.py)
        return tuple(f"{what}: {needs_text(r)} of {format_bytes(r.capacity)}"
                     f"{f' (for {aim[what]})' if aim.get(what) else ''}, {verdicts[r.fits]}" for what, r in ordered)

    def render(self) -> str:
        lines = [f"fixes for {self.original.model} on {self.original.target.name} "
                 f"({needs_text(self.original)} of {format_bytes(self.original.capacity)} per chip), "
                 "each compiled:"]
        code = dict(zip((what for what, _ in self.tried), self.code))
        aim = dict(zip((what for what, _ in self.tried), self.addresses))
        lines.extend(_peak_lines(self.original))
        for what, r in sorted(self.tried, key=lambda t: not t[1].fits):
            verdict = {True: "fits", False: "does not fit", None: "refused"}[r.fits]
            step = f", step ~{format_seconds(r.estimate.seconds)}" if r.fits and r.estimate else ""
            needs = ("needs at least" if r.at_least else "needs") + f" {format_bytes(r.required):>11}"
            lines.append(f"  {what:<52} {needs} of {format_bytes(r.capacity):>10}: "
                         f"{verdict}{step}")
            if what in code:
                lines.append(f"      PyTorch: {code[what]}")
            if aim.get(what):
                lines.append(f"      for: {aim[what]}")
        best = self.best
        lines.append(f"  recommended: {best[0]}" if best else "  none of these fits")
        return "\n".join(lines)


def fixes(model_or_config: Any, target: str | Target = "v5e-8", *, plan: str = "fsdp", batch: int = 8,
          seq: int = 2048, **options: Any) -> Fixes:
    """Compile the step with each change that could make it fit, cheapest first.

    The changes, in this order (what each costs): activation checkpointing (about one more
    forward of compute; a step of identical layers), float32 parameters to bfloat16 (when
    float32), float32 master weights dropped (when kept), the next slice of the generation
    with the plan's axes over it (more chips), half the global batch (fewer sequences a step).
    Before them, the memory techniques (``tpu_debug.fit.techniques.technique_fixes``): the
    chunked loss when the logits are large, activations offloaded to host memory, both with
    checkpointing. Each is a ``fit`` with that change; the original is compiled first. The
    answer lists what fits first: the changes that keep the job (same slice and batch)
    fastest first by the estimated step time, then more chips or fewer sequences; each with
    the PyTorch change it means (``Fixes.code``).
    """
    tgt = parse_target(target)
    original = fit(model_or_config, tgt, plan=plan, batch=batch, seq=seq, **options)
    changes: list[tuple[str, dict]] = []
    if not options.get("remat"):
        changes.append(("activation checkpointing (--remat)", {"remat": True}))
    if options.get("dtype", "bfloat16") == "float32":
        changes.append(("bfloat16 parameters (--dtype bfloat16)", {"dtype": "bfloat16"}))
    if options.get("master_dtype"):
        changes.append(("no float32 master weights", {"master_dtype": None}))
    bigger = sorted(n for n in tgt.generation.slices if n > tgt.devices)
    if bigger and "=" not in str(plan) and batch % bigger[0] == 0:
        changes.append((f"{tgt.generation.name}-{bigger[0]} ({plan} over {bigger[0]} chips)",
                        {"target": f"{tgt.generation.name}-{bigger[0]}"}))
    if batch // 2 and (batch // 2) % parse_plan(plan, tgt.devices).batch_ways == 0:
        changes.append((f"batch {batch // 2} (half)", {"batch": batch // 2}))
    if options.get("job", "train") == "train":
        vocab = getattr(build_config(model_or_config, options.get("overrides")), "vocab_size", 0) or 0
        logits = vocab * batch * seq // parse_plan(plan, tgt.devices).batch_ways * 4
        changes[:0] = techniques.technique_fixes(options, logits, original.capacity)
    tried = []
    for what, change in changes:
        args = {"target": tgt, "plan": plan, "batch": batch, "seq": seq, **options, **change}
        tried.append((what, fit(model_or_config, args.pop("target"), **args), techniques.torch_code(change),
                      "target" in change or "batch" in change))

    def rank(item):  # what fits first; of those, the same job before more chips or fewer sequences, fastest first
        _, r, _, other = item
        return (not r.fits, other, r.estimate.seconds if r.fits and r.estimate else 0.0)

    tried.sort(key=rank)
    aims, change_of = _aims(original.peak), dict(changes)
    return Fixes(original, tuple((what, r) for what, r, _, _ in tried), tuple(code for _, _, code, _ in tried),
                 tuple(aims(change_of[what]) for what, *_ in tried))


# what of a step's peak each change of ``fixes`` goes after (tracers.reading.peak_buffers's kinds;
# "logits": the vocabulary-wide activations a chunked loss never makes whole)
_AIMS = {"remat": ("activation",), "remat_policy": ("activation",), "attention": ("activation",),
         "loss": ("logits",), "dtype": ("parameter", "optimizer_state"), "master_dtype": ("optimizer_state",),
         "target": ("parameter", "optimizer_state", "gradient"), "batch": ("activation", "temporary")}


def _aims(peak: Any):
    """``aims(change) -> text``: the kinds of ``peak`` a change goes after, with their bytes."""
    found = {r.kind: r.nbytes for r in remedies(peak)} if peak is not None else {}

    def aims(change: dict) -> str:
        kinds = dict.fromkeys(k for key in change for k in _AIMS.get(key, ()) if found.get(k))
        return ", ".join(f"{KIND_TEXT.get(k, 'the logits')} at the peak ({format_bytes(found[k])})" for k in kinds)

    return aims


def fit_event(report: FitReport, *, event_id: int = 0, ts: float = 0.0, location: Any = None,
              fixes: Fixes | None = None, candidate_of: str | None = None):
    """The report as the run store keeps it (a ``FitEvent``), with ``fixes``' lines if given;
    ``candidate_of``: the question of the search it was an earlier candidate of."""

    m, e = report.memory, report.estimate
    memory = {} if m is None else dict(
        argument_bytes=m.arguments, output_bytes=m.outputs, alias_bytes=m.aliased, temp_bytes=m.temporaries,
        code_bytes=m.code, total_bytes=m.total, parameter_bytes=m.parameters,
        optimizer_bytes=m.optimizer_state, batch_bytes=m.batch, gradient_bytes=m.gradients,
        activation_bytes=m.activations, kv_cache_bytes=m.kv_cache or None, host_bytes=m.host)
    if report.at_least:  # a refusal: the compiler's out-of-memory figure, its temporaries when it stopped
        memory = {"temp_bytes": report.at_least[0][1]}
    estimate = {} if e is None else dict(
        compute_seconds=e.compute_seconds, memory_seconds=e.memory_seconds, comm_seconds=e.comm_seconds,
        step_seconds=e.seconds, overlapped_seconds=e.overlapped_seconds,
        tokens_per_second=e.tokens_per_second, model_flops=e.model_flops, mfu=e.mfu,
        mfu_overlapped=e.mfu_overlapped, assumptions=tuple(e.assumptions),
        op_by_op_seconds=e.op_by_op_seconds, mfu_op_by_op=e.mfu_op_by_op)
    return FitEvent(
        event_id, ts, None, 0, location,
        model=report.model, target=report.target.name, chips=report.target.devices,
        device_kind=report.target.device_kind, plan=str(report.plan), job=report.job, batch=report.batch,
        seq=report.seq, parameters=report.parameters, fits=report.fits, capacity_bytes=report.capacity,
        capacity_source=report.capacity_source, required_bytes=report.required, seconds=report.seconds,
        compile_seconds=report.compile_seconds,
        collectives=tuple(FitCollective(c.kind, c.count, c.bytes, c.wire_bytes, c.seconds)
                          for c in report.collectives),
        communication=tuple(FitBound(b.kind, b.compiled, b.bound, b.basis, b.reasons())
                            for b in report.communication),
        unsharded=tuple(report.unsharded), caveats=tuple(report.caveats), error=report.error,
        extrapolation=report.extrapolation, method=report.method,
        verified_fixes=() if fixes is None else fixes.lines(), candidate_of=candidate_of, **memory, **estimate)


def record_fit(report: FitReport, *, logdir: str | Path | None = None, name: str | None = None,
               fixes: Fixes | None = None) -> Path:
    """Keep a fit's answer as a run: ``tpu-debug report``, ``report --json``, the TUI's fit
    view, the advisor and ``tpu-debug diff`` read it as they read any run.

    Inside an active trace (``tpu_debug.trace()``, ``tpu-debug run``) with no ``logdir``
    given, the answer joins that trace's run, at the user line that asked; otherwise a
    new run is made under ``logdir`` (default ``TPU_DEBUG_LOGDIR`` or ``./tpu_debug_runs``).

    ``fixes`` (``fixes(...)`` of the same step) are kept with it, and the advisor's finding
    names them.

    Returns:
        The run's directory.

    Raises:
        TpuDebugError: the run directory cannot be created; RunWriteError: nor its database.

    Example::

        run_dir = record_fit(tpu_debug.fit("tiny-llama", "v5e-8", batch=8, seq=128))
    """
    return _keep((report,), logdir, name or f"fit-{report.model}-{report.target.name}", fixes)


def record_search(found: PlanSearch, *, logdir: str | Path | None = None, name: str | None = None) -> Path:
    """Keep a plan search as one run: every candidate's answer, the recommended one last (the
    TUI's fit view and ``tpu-debug diff`` read a run's last answer; ``tpu-debug report`` lists
    them all). The earlier candidates are marked as such (``FitEvent.candidate_of``): the
    advisor judges the search's answer only. Where it goes: as ``record_fit``.

    Returns:
        The run's directory.

    Raises:
        TargetError: a search with no candidate; otherwise as ``record_fit``.
    """
    if not found.candidates:
        raise TargetError(f"search for the {found.question}: no candidate was compiled, nothing to keep")
    rest = [r for r in found.candidates if r is not found.best]
    reports = (*rest, found.best) if found.best is not None else tuple(rest)
    last = reports[-1]
    return _keep(reports, logdir, name or f"fit-search-{last.model}-{last.target.name}", question=found.question)


def _keep(reports: Sequence[FitReport], logdir: str | Path | None, name: str, fixes: Fixes | None = None,
          question: str | None = None) -> Path:
    """Put ``reports`` into the active trace's run when there is one and no ``logdir``; into a
    new run otherwise. The last is the answer (``fixes`` go with it); the ones before it are
    candidates of the search for ``question``."""

    active = active_trace()
    writer = getattr(active, "_writer", None)  # the trace's own run writer, while it records
    if logdir is None and writer is not None:
        _put(writer, reports, fixes, question, active._recorder.clock, user_location())
        return active.session.run_dir
    return _new_fit_run(reports, logdir, name, fixes, question)


def _put(writer, reports: Sequence[FitReport], fixes: Fixes | None, question: str | None,
         clock=lambda: 0.0, location: Any = None) -> None:
    last = len(reports) - 1
    for i, report in enumerate(reports):
        writer.put(fit_event(report, event_id=writer.new_id(), ts=clock(), location=location,
                             fixes=fixes if i == last else None, candidate_of=question if i < last else None))
    peak = reports[-1].peak if reports else None
    if peak is not None:  # the answer's step at its peak, buffer by buffer (the report's Peak buffers)
        writer.put(dataclasses.replace(peak, id=writer.new_id(), ts=clock(), location=location))


def _new_fit_run(reports: Sequence[FitReport], logdir: str | Path | None, name: str,
                 fixes: Fixes | None = None, question: str | None = None) -> Path:
    import datetime as _dt
    import sys



    run_dir = new_run_dir(Path(logdir) if logdir is not None else default_logdir(), name)
    meta = {"name": name, "status": "running", "argv": list(sys.argv),
            "command": list(getattr(sys, "orig_argv", sys.argv)), "cwd": str(Path.cwd()),
            "start_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
            "platform": "tpu", "device_kind": reports[-1].target.device_kind,
            "device_count": reports[-1].target.devices,
            "compile_only": True}
    writer = RunWriter(run_dir / DB_NAME, meta)
    _put(writer, reports, fixes, question)
    writer.close({"status": "finished", "exit_status": 0, "duration": sum(r.seconds for r in reports)})
    return run_dir
