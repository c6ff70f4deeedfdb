"""Tiny Hugging Face models, built from configs (no weights are downloaded), run on `tpu`
eagerly and compiled and compared with the same model on CPU.

Every model shares one shape family (hidden 32, 4 heads of 8, 2 layers, vocab 128, batch 2 x 8
tokens): the eager runtime keeps one executable per op and shape, so models that share shapes
share executables across the tests of a worker.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

# set before transformers/diffusers import huggingface_hub, which reads it once
os.environ["HF_HUB_OFFLINE"] = "1"

transformers = pytest.importorskip(
    "transformers", reason='Hugging Face Transformers is not installed (pip install -e ".[models]")'
)

VOCAB = 128
BATCH, SEQ = 2, 8
# the optimizer step of the training test: plain SGD, so the parameters after it differ from
# CPU's exactly by lr x the gradients' difference
LR = 0.05

_DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model under test: its config, the class built from it and its inputs."""

    model_type: str
    config: dict[str, Any]
    family: str  # decoder | encoder | encoder-decoder | vision
    model_class: str = "AutoModelForCausalLM"
    inputs: Callable[[Any, torch.Generator], dict[str, torch.Tensor]] | None = None

    def make_config(self, **overrides):
        config = transformers.AutoConfig.for_model(self.model_type, **{**self.config, **overrides})
        _no_dropout(config)
        return config

    def build(self, **overrides) -> torch.nn.Module:
        torch.manual_seed(0)
        cls = getattr(transformers, self.model_class)
        return (
            cls.from_config(self.make_config(**overrides))
            if cls.__name__.startswith("Auto")
            else cls(self.make_config(**overrides))
        )

    def batch(self, config) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        if self.inputs is not None:
            return self.inputs(config, g)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        return {"input_ids": ids, "labels": ids}


def _no_dropout(config) -> None:
    """Dropout draws different random numbers on `tpu` than on CPU: every dropout probability
    (``*dropout*``, GPT-2's ``*_pdrop``) is set to 0, here and in sub-configs."""
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
            setattr(config, name, 0.0)
        elif isinstance(value, transformers.PretrainedConfig):
            _no_dropout(value)


def _t5_inputs(config, g):
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(2, VOCAB, (BATCH, SEQ // 2), generator=g)
    return {"input_ids": ids, "labels": labels}


def _whisper_inputs(config, g):
    frames = 2 * config.max_source_positions  # the encoder's second convolution has stride 2
    features = torch.randn(BATCH, config.num_mel_bins, frames, generator=g)
    labels = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g)
    return {"input_features": features, "labels": labels}


def _vit_inputs(config, g):
    pixels = torch.randn(BATCH, config.num_channels, config.image_size, config.image_size, generator=g)
    return {"pixel_values": pixels, "labels": torch.randint(0, config.num_labels, (BATCH,), generator=g)}


def _bert_inputs(config, g):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0  # padding in the second sequence: the attention mask takes part
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


SPECS: dict[str, Spec] = {
    "llama": Spec("llama", _DECODER, "decoder"),
    "qwen2": Spec("qwen2", _DECODER, "decoder"),
    "qwen3": Spec("qwen3", _DECODER, "decoder"),
    "qwen2_moe": Spec("qwen2_moe", {**_DECODER, **_MOE, "shared_expert_intermediate_size": 32}, "decoder"),
    "qwen3_moe": Spec("qwen3_moe", {**_DECODER, **_MOE}, "decoder"),
    "mixtral": Spec("mixtral", {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2}, "decoder"),
    "gemma": Spec("gemma", _DECODER, "decoder"),
    "phi": Spec("phi", {k: v for k, v in _DECODER.items() if k != "head_dim"}, "decoder"),
    "gpt2": Spec(
        "gpt2",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "decoder",
    ),
    "bert": Spec(
        "bert",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
        "encoder",
        model_class="BertForMaskedLM",
        inputs=_bert_inputs,
    ),
    "t5": Spec(
        "t5",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 64,
            "num_layers": 2,
            "num_decoder_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 16,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "decoder_start_token_id": 0,
        },
        "encoder-decoder",
        model_class="T5ForConditionalGeneration",
        inputs=_t5_inputs,
    ),
    "whisper": Spec(
        "whisper",
        {
            "vocab_size": VOCAB,
            "num_mel_bins": 16,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "max_source_positions": 16,
            "max_target_positions": 32,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "decoder_start_token_id": 1,
        },
        "encoder-decoder",
        model_class="WhisperForConditionalGeneration",
        inputs=_whisper_inputs,
    ),
    "vit": Spec(
        "vit",
        {
            "image_size": 16,
            "patch_size": 4,
            "num_channels": 3,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "num_labels": 5,
        },
        "vision",
        model_class="ViTForImageClassification",
        inputs=_vit_inputs,
    ),
}


@dataclasses.dataclass
class StepResult:
    """What one forward + backward + optimizer step produced, as CPU tensors."""

    output: torch.Tensor  # logits
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]  # after the optimizer step


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], call=None) -> StepResult:
    """One training step: forward with labels, ``loss.backward()``, an SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt.zero_grad()
    out = (model if call is None else call)(**batch)
    out.loss.backward()
    opt.step()
    names = dict(model.named_parameters())
    return StepResult(
        output=out.logits.detach().cpu(),
        loss=out.loss.detach().cpu(),
        grads={n: p.grad.detach().cpu() for n, p in names.items() if p.grad is not None},
        params={n: p.detach().cpu() for n, p in names.items()},
    )


_cpu_results: dict[tuple, tuple[torch.nn.Module, StepResult]] = {}


def cpu_reference(name: str, **overrides) -> tuple[torch.nn.Module, StepResult]:
    """(the model as built, before training; its training step on CPU), once per worker."""
    key = (name, tuple(sorted(overrides.items())))
    if key not in _cpu_results:
        spec = SPECS[name]
        model = spec.build(**overrides)
        model.train()
        pristine = copy.deepcopy(model)
        result = train_step(model, spec.batch(model.config))
        _cpu_results[key] = (pristine, result)
    return _cpu_results[key]


def on_tpu(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to("tpu") for k, v in batch.items()}


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@dataclasses.dataclass(frozen=True)
class Errors:
    """Max absolute errors against CPU: the forward's logits, the loss, every gradient and every
    parameter after the step (the largest over parameters)."""

    forward: float
    loss: float
    grad: float
    param: float

    @property
    def train(self) -> float:
        return max(self.loss, self.grad, self.param)


def compare(dev: StepResult, ref: StepResult) -> Errors:
    assert dev.grads.keys() == ref.grads.keys()
    return Errors(
        forward=max_abs(dev.output, ref.output),
        loss=max_abs(dev.loss, ref.loss),
        grad=max(max_abs(dev.grads[n], g) for n, g in ref.grads.items()),
        param=max(max_abs(dev.params[n], p) for n, p in ref.params.items()),
    )


def run_on_tpu(name: str, mode: str, **overrides) -> tuple[StepResult, StepResult]:
    """The training step of model ``name`` on `tpu` (``mode`` eager or compiled) and on CPU."""
    pristine, ref = cpu_reference(name, **overrides)
    model = copy.deepcopy(pristine).to("tpu")
    model.train()
    call = torch.compile(model, backend="tpu_debug") if mode == "compiled" else None
    batch = on_tpu(SPECS[name].batch(model.config))
    return train_step(model, batch, call), ref
