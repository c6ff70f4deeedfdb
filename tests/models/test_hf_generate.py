"""``model.generate()`` on `tpu`: greedy decoding eagerly with the dynamic cache (a KV cache
concatenated one token at a time, so every decode step meets new shapes) and compiled with the
static cache (allocated at its final length once, so decoding reuses one program), both giving
CPU's tokens. The run's report tells the two apart: the eager ops recompile once per length,
named by the growing dimension; the compiled decode stops compiling after its first steps.
"""

from __future__ import annotations

import torch
from hf_common import SPECS

import tpu_debug

NEW_TOKENS = 6


class _CompileCounter:
    """A generation streamer: the number of compiled-mode compiles in the live trace each
    time generate() hands over tokens (the prompt first, then one call per new token)."""

    def __init__(self, session) -> None:
        self.session = session
        self.counts: list[int] = []

    def put(self, value) -> None:
        self.counts.append(len(self.session.compiles(mode="compiled")))

    def end(self) -> None:
        pass


def _model_and_prompt():
    model = SPECS["llama"].build()
    model.eval()
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(1, 128, (1, 5), generator=torch.Generator().manual_seed(3))
    return model, prompt


def test_generate_dynamic_eager_and_static_compiled_match_cpu(tmp_path):
    model, prompt = _model_and_prompt()
    greedy = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
    with torch.no_grad():
        expected = model.generate(prompt, **greedy)
    model.to("tpu")
    with tpu_debug.trace(logdir=tmp_path, hlo=False) as session:
        eager = model.generate(prompt.to("tpu"), **greedy)
        model.forward = torch.compile(model.forward, backend="tpu_debug")
        counter = _CompileCounter(session)
        compiled = model.generate(prompt.to("tpu"), cache_implementation="static", streamer=counter, **greedy)
    assert torch.equal(eager.cpu(), expected)
    assert torch.equal(compiled.cpu(), expected)

    # the prompt, then one put per new token: the prefill and the first decode step compile,
    # every later step reuses their programs
    assert len(counter.counts) == NEW_TOKENS + 1
    assert counter.counts[2] >= 1
    assert counter.counts[2:] == [counter.counts[2]] * (NEW_TOKENS - 1), counter.counts

    groups = session.recompiles.groups()
    compiled_groups = [g for g in groups if g.mode == "compiled"]
    assert compiled_groups and all(not g.storm for g in compiled_groups)
    # eagerly, attention's ops meet one key length per token: the report names that
    # dimension as growing, through every length the cache took
    grown = [
        g for g in groups if g.mode == "eager" and g.storm and g.changing is not None and g.changing.grows
    ]
    assert grown, [(g.identity, g.changing) for g in groups]
    lengths = [str(n) for n in range(prompt.shape[1], prompt.shape[1] + NEW_TOKENS)]
    assert any(g.changing.values == tuple(lengths) for g in grown), [g.changing for g in grown]
    assert any("grows at every call" in a and "static cache" in a for g in grown for a in g.advice)
    text = session.summary(width=200)
    assert "(grows)" in text  # the Recompiles table marks the growing dimension
