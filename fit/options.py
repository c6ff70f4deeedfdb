"""How ``tpu_debug.fit`` compiles a step: one validated record that the function (its keywords),
``tpu-debug fit`` (its flags) and ``--json`` (its ``"options"``) share."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tpu_debug.fit.sharded import Plan
from tpu_debug.fit.techniques import LOSSES
from tpu_debug.runtime.target.errors import TargetError
from tpu_debug.runtime.target.hardware import Target

__all__ = ["JOBS", "LOOP_ABOVE", "FitOptions"]

JOBS = ("train", "forward", "prefill", "decode")
# a training step of more layers than this is compiled as a loop by default
LOOP_ABOVE = 4


@dataclasses.dataclass(frozen=True, slots=True)
class FitOptions:
    """What to compile: the slice, the mesh, the batch, the job and how its step is built.

    Made, it is valid: the options that contradict each other raise here, before anything
    is built or compiled.

    Args:
        target: the slice (``"v5e-8"``, ``"v6e-256"``, ``"v5p-128"``).
        plan: ``"fsdp"``, ``"dp"``, ``"fsdp=4,tp=2"``, ... (see ``tpu_debug.fit.sharded.parse_plan``).
        batch: global batch, in sequences (split over dp x fsdp).
        seq: sequence length.
        job: ``"train"`` (forward, loss, backward, AdamW), ``"forward"``, ``"prefill"`` (the
            forward over ``seq`` tokens filling a static KV cache, the last position's logits) or
            ``"decode"`` (one token per sequence attending to a KV cache of ``seq`` positions;
            ``tpu_debug.fit.infer``).
        dtype: the parameters' dtype; AdamW's state is kept in it, as ``torch.optim.AdamW`` does.
        overrides: config fields to change (``{"num_hidden_layers": 2}``).
        extrapolate: a forward, prefill or decode step, asked for: compile it with 2 and 3
            decoder layers and extend every per-chip figure linearly to the model's layer
            count (quicker for a big model that fits; the report says it was used and that
            the figures are not settled). Off by default (None, False): against full compiles
            it missed by far (Llama-3-8B prefill on v5e-8, tp=8, 2 x 4096: 18.3 GiB extended,
            7.9 compiled; docs/fit.md). A training step is never extended (``loop`` instead).
        shard_activations: constrain every activation whose first dimension is the batch
            (or batch x seq) to be split over the batch axes; off, only the embeddings'
            output is, and XLA's propagation carries the split on
            (``tpu_debug.fit.sharded._fsdp_program``).
        optimization_level: XLA's effort level (None: the compiler's default).
        cache: use the target compile cache.
        loop: compile a training step's decoder layers as one loop over their stacked
            parameters (``tpu_debug.fit.scan``: every layer in the program, one
            compiled, nothing extrapolated); None does so for models of more than
            ``LOOP_ABOVE`` identical layers; False compiles them unrolled (the program
            ``torch.compile`` of the step makes; slow for big models).
        remat: activation checkpointing in the loop: each layer keeps only its input for
            the backward and recomputes the rest.
        master_dtype: ``"float32"``: mixed precision in the loop: parameters and AdamW state
            kept in float32, cast to ``dtype`` where the step reads them (as MaxText's
            float32 weights with bfloat16 compute).
        loss: ``"plain"`` (the whole logits, then cross-entropy) or ``"chunked"`` (the looped
            step's head, cross-entropy and their gradients a chunk of positions at a time:
            ``tpu_debug.fit.techniques.chunked_cross_entropy``).
        remat_policy: what each layer of the loop keeps for its backward, by name
            (``tpu_debug.fit.techniques.POLICIES``: ``"matmuls"``, the default; ``"full"``,
            as ``remat=True``; ``"all-matmuls"``; ``"offload"``, the matmul outputs in host
            memory).
        attention: the looped step's attention: ``"blocked"`` (a block of queries at a time,
            each block recomputed in the backward) or ``"flash"`` (flash attention's backward,
            blocks in order: ``tpu_debug.fit.techniques.flash_attention``).

    Raises:
        TargetError: an unknown job, master dtype or loss, or options that contradict each
            other (the looped step's options with another job or with ``loop=False``, an
            extended training step, ``remat=True`` with another policy).

    Example::

        options = FitOptions(target="v5e-8", plan="fsdp", batch=8, seq=2048, remat=True)
        tpu_debug.fit("llama3-8b", **options.keywords())
    """

    target: str | Target = "v5e-8"
    plan: str | Plan = "fsdp"
    batch: int = 8
    seq: int = 2048
    job: str = "train"
    dtype: str = "bfloat16"
    overrides: Mapping[str, Any] | None = None
    extrapolate: bool | None = None
    shard_activations: bool = False
    optimization_level: str | None = None
    cache: bool = True
    loop: bool | None = None
    remat: bool = False
    master_dtype: str | None = None
    loss: str = "plain"
    remat_policy: str | None = None
    attention: str = "blocked"

    def __post_init__(self) -> None:
        if self.job not in JOBS:
            raise TargetError(f"job {self.job!r} is not one of {', '.join(JOBS)}")
        if self.extrapolate and self.job == "train":
            raise TargetError(
                "a training step is not extended from fewer layers: the XLA TPU compiler schedules a short step "
                "differently (Llama-3-8B from 2 and 3 of 32 layers: 36 % under the full compile on v5e-64, 2.9x "
                "over on v6e-64); its layers are compiled as one loop (loop=True, the default above "
                f"{LOOP_ABOVE} layers) or unrolled (loop=False)")
        if self.master_dtype not in (None, "float32"):
            raise TargetError(f"master_dtype {self.master_dtype!r}: give 'float32' (or None: the parameters' dtype)")
        if self.loss not in LOSSES:
            raise TargetError(f"loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        if self.remat and self.remat_policy not in (None, "full"):
            raise TargetError(
                f"remat=True is remat_policy='full': drop remat=True or remat_policy={self.remat_policy!r}")
        if self.shapes_the_loop:
            if self.job != "train":
                raise TargetError(f"loop=True, remat=True and master_dtype shape a training step; job {self.job!r} "
                                  "has no backward")
            if self.loop is False:
                raise TargetError("remat=True and master_dtype are built into the looped step: drop loop=False")

    @property
    def shapes_the_loop(self) -> bool:
        """Whether an option asks for the looped training step (``tpu_debug.fit.scan``) itself:
        ``loop=True``, or one the loop alone has (checkpointing, master weights, the chunked loss,
        a policy, another attention)."""
        return bool(self.loop or self.remat or self.master_dtype or self.loss != "plain" or self.remat_policy
                    or self.attention != "blocked")

    def keywords(self) -> dict[str, Any]:
        """The options as ``fit``'s keywords (``target`` among them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """The options as plain data (``--json``'s ``"options"``): the target's and the plan's names."""
        data = self.keywords()
        data["target"] = self.target.name if isinstance(self.target, Target) else str(self.target)
        data["plan"] = str(self.plan)
        data["overrides"] = dict(self.overrides or {})
        return data
