"""Communication beside the plan's bound (``tpu_debug.fit.communication``).

References, neither the tool's own output:
- a direct compile: the same looped FSDP step written in ``test_fit_loop.py`` compiled with
  plain ``jax.jit(...).lower(...).compile()`` at XLA's default effort (where the TPU compiler
  threads each gather through several fusions to overlap it with compute), its
  ``compiled.as_text()`` read by a parser written here: one collective per channel id and
  computation it runs in (once per fusion calling the computation that holds it), a loop
  body's collectives once per layer;
- the parameters' own sizes from PyTorch (``numel() x itemsize``) for the bound.
"""

from __future__ import annotations

import functools
import re

import jax
import pytest
import torch
from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")
needs_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, use_cache=False)
BATCH, SEQ = 8, 32



@pytest.fixture(scope="module")
def looped():
    """``looped(remat)``: the looped FSDP step's answer on a v5e-8, each asked once in this module."""
    import tpu_debug

    return functools.cache(lambda remat: tpu_debug.fit(transformers.LlamaConfig(**SIZES), "v5e-8", plan="fsdp",
                                                        batch=BATCH, seq=SEQ, loop=True, remat=remat))


def _sibling(name: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"_fit_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_BITS = {"bf16": 16, "f32": 32, "f16": 16, "s32": 32, "u32": 32, "s64": 64, "pred": 8}


def _arrays(shape: str) -> list[int]:
    out = []
    for dtype, dims in re.findall(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]", shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out.append(n * _BITS.get(dtype, 0) // 8)
    return out


def _gathered_per_step(hlo: str, layers: int) -> int:
    """All-gather bytes per step (each gathered result), read from ``hlo`` independently of the
    tool: one gather per (computation a fusion's body runs in, channel id); the gathers of the
    layer loop's body (and of what it calls) count ``layers`` times."""
    body, calls, parent, callers, loops = {}, {}, {}, {}, set()
    current = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if head:
            current = head.group(1)
            body[current], calls[current] = [], set()
            continue
        if current is None or not line.startswith("  "):
            continue
        body[current].append(line)
        for callee in re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", line):
            calls[current].add(callee)
            if " fusion(" in line:
                parent[callee] = current
                callers[callee] = callers.get(callee, 0) + 1
        loops.update(re.findall(r"body=%([\w.\-]+)", line))
    in_loop, todo = set(), list(loops)
    while todo:
        name = todo.pop()
        if name not in in_loop:
            in_loop.add(name)
            todo.extend(calls.get(name, ()))

    def runs_in(name):  # (the computation it runs in, times per run of that computation)
        times = 1
        while name in parent:
            times *= callers[name]
            name = parent[name]
        return name, times

    seen, total = {}, 0
    for name, lines in body.items():
        for line in lines:
            m = re.match(r"^\s+(?:ROOT )?%\S+ = (.+?) all-gather(-start)?\(", line)
            channel = re.search(r"channel_id=(\d+)", line)
            if m is None:
                continue
            where, times = runs_in(name)
            if seen.setdefault((where, channel.group(1) if channel else line), name) != name:
                continue  # a copy in another fusion
            sizes = _arrays(m.group(1))
            size = sizes[1] if m.group(2) and len(sizes) > 1 else sum(sizes)
            total += size * times * (layers if name in in_loop else 1)
    return total


def _direct(model, remat: bool):
    """``test_fit_loop``'s direct compile of the looped FSDP step, at XLA's default effort."""
    loop = _sibling("test_fit_loop")
    saved = jax.config.jax_optimization_level
    real = jax.config.update

    def keep_default(name, value):  # the reference pins O0; this test reads the default level's program
        if name != "jax_optimization_level":
            real(name, value)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax.config, "update", keep_default)
        compiled = loop._reference(model, (1, 8), remat=remat, batch_size=BATCH)
    assert jax.config.jax_optimization_level == saved
    return compiled


@needs_libtpu
@pytest.mark.parametrize("remat", [False, True])
def test_the_answers_gathers_equal_an_independent_parse_of_a_direct_compile(looped, remat):
    from tpu_debug.fit.answer import collective_costs
    from tpu_debug.fit.scan import loop_repeats
    from tpu_debug.runtime.target.hardware import parse_target

    config = transformers.LlamaConfig(**SIZES)
    report = looped(remat)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    text = _direct(model, remat).as_text()
    layers = SIZES["num_hidden_layers"]
    expected = _gathered_per_step(text, layers)
    # the default level overlaps gathers with compute: copies of one gather in several fusions
    # (the case the count must see through)
    assert text.count("AsyncCollectiveStart") > 0
    mine = {c.kind: c.bytes for c in collective_costs(text, parse_target("v5e-8"), loop_repeats(text, layers))}
    assert mine["all-gather"] == expected
    # the answer's program is the same step: the same gathers, byte for byte
    got = {c.kind: c.bytes for c in report.collectives}
    assert got["all-gather"] == expected
    row = next(b for b in report.communication if b.kind == "all-gather")
    assert row.compiled == expected
    # --json carries each kind's figures and its ratio; the text names the bound beside them
    data = next(b for b in report.to_dict()["communication"] if b["kind"] == "all-gather")
    assert (data["compiled"], data["bound"]) == (row.compiled, row.bound)
    assert data["ratio"] == pytest.approx(row.compiled / row.bound)
    assert f"{row.ratio:.2f}x the bound" in report.render()


@needs_libtpu
def test_the_fsdp_bound_counts_each_layer_parameter_once_per_pass(looped):
    """Without checkpointing each layer's weights are gathered once for the forward and once for
    the backward: the loop's gathers are the bound's layer term, 2 x the layers' bfloat16 bytes."""
    config = transformers.LlamaConfig(**SIZES)
    report = looped(False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    layer_bytes = sum(p.numel() * 2 for n, p in model.named_parameters() if ".layers." in n)
    matrices = sum(p.numel() * 2 for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    row = next(b for b in report.communication if b.kind == "all-gather")
    assert "2 x " in row.basis and "bfloat16" in row.basis
    looped = [s for s in row.shares if "in the layer loop" in s.what]
    forward = sum(s.bytes for s in looped if s.what.startswith("forward"))
    backward = sum(s.bytes for s in looped if not s.what.startswith("forward"))
    # exact for the weight matrices: each gathered once per pass, whole, in bfloat16 (the
    # norms' 64-element vectors travel inside other collectives)
    assert forward == matrices and backward == matrices
    # the bound: every parameter of the model (PyTorch's sizes) in its passes
    outer = {n: p.numel() * 2 for n, p in model.named_parameters() if ".layers." not in n}
    embedding = outer.pop("model.embed_tokens.weight")
    assert row.bound == 2 * layer_bytes + 2 * sum(outer.values()) + embedding
    # the compiled loop is the bound's layer term within the norms' bytes
    assert abs(forward + backward - 2 * layer_bytes) <= 2 * (layer_bytes - matrices)


def test_a_kind_well_over_its_bound_names_where_its_bytes_come_from():
    from tpu_debug.fit.communication import CollectiveBound, Share

    shares = (Share("no metadata (the compiler's own), float32, several tensors combined, in the layer loop x32",
                    26 * 2**30, 224, "(f32[14336,4096]) 224.00 MiB, ''"),
              Share("backward, bfloat16, several tensors combined", 2**20, 1))
    row = CollectiveBound("all-reduce", 26 * 2**30 + 2**20, 13 * 2**30, "1 x 13 GiB", shares)
    assert row.ratio == pytest.approx(2.0, rel=1e-3)
    assert row.over
    reasons = row.reasons()
    assert len(reasons) == 1  # the 1 MiB share is not where the excess is
    assert reasons[0].startswith("no metadata (the compiler's own), float32") and "26.00 GiB in 224 collectives" in reasons[0]
    assert not CollectiveBound("all-gather", 14, 10, "", shares).reasons()
