"""A training step whose decoder layers run as one loop (``tpu_debug.fit.scan``).

Two references, neither the tool's own output:
- PyTorch on CPU: the looped step run by JAX on the CPU with a tiny Llama's real random
  weights gives the loss, the AdamW state and the updated parameters that
  ``model(...)``, ``loss.backward()`` and ``torch.optim.AdamW.step()`` give;
- a direct compile: the same looped FSDP step written in this file (its own scan,
  checkpoint policy, gathers, gradient constraints and AdamW over the traced pieces) and
  compiled with plain ``jax.jit(..., in_shardings, out_shardings).lower(...).compile()``
  for the deviceless v5e topology; per-chip memory and collectives must agree.
"""

from __future__ import annotations

import math
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
BATCH, SEQ = 8, 32
# one program, one compiler on both sides: the figures agree exactly in practice; 2 % is
# what the fit answer promises
TOLERANCE = 0.02
needs_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')



@pytest.fixture(scope="module")
def six_layers():
    """``six_layers(**options)``: the answer for a six-layer version of SIZES on a v5e-8 (FSDP,
    one sequence per chip, O0), each set of options asked once in this module."""
    import tpu_debug

    config = transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 6})
    answers = {}

    def answer(**options):
        key = tuple(sorted(options.items()))
        if key not in answers:
            answers[key] = tpu_debug.fit(config, "v5e-8", plan="fsdp", batch=BATCH, seq=SEQ,
                                         optimization_level="O0", **options)
        return answers[key]

    return answer


def _loss(outputs, labels):
    return F.cross_entropy(outputs.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


def _traceable():
    # transformers skips a value-dependent mask check only while it thinks it is traced
    return mock.patch.object(transformers.masking_utils, "is_tracing", lambda *a, **k: True)


def _pieces(model, batch=BATCH):
    from tpu_debug.fit.scan import trace_pieces

    tokens = torch.empty(batch, SEQ, dtype=torch.long, device="meta")
    return trace_pieces(model, tokens, _loss, _traceable)


def test_the_looped_step_computes_pytorchs_training_step():
    from tpu_debug.fit.scan import scan_step

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).float()
    tokens = torch.randint(0, SIZES["vocab_size"], (2, SEQ))
    pieces = _pieces(model, batch=2)
    layers = model.model.layers

    def value(n):
        if n in pieces.inner:
            return jnp.asarray(np.stack([dict(l.named_parameters())[n].detach().numpy() for l in layers]))
        return jnp.asarray(dict(model.named_parameters())[n].detach().numpy())

    names = (*pieces.outer, *pieces.inner)
    params = {n: value(n) for n in names}
    buffers = {n: jnp.asarray(b.numpy()) for n, b in model.named_buffers() if n in pieces.buffers}
    zeros = {n: jnp.zeros_like(p) for n, p in params.items()}
    step = scan_step(pieces, gathered=None, split={}, batch=None)
    with jax.enable_x64(True):
        loss, new_p, new_m, _, count = jax.jit(step)(params, buffers, zeros, zeros, jnp.float32(0),
                                                     jnp.asarray(tokens.numpy()), jnp.asarray(tokens.numpy()))

    opt = torch.optim.AdamW(model.parameters())
    expected_loss = _loss(model(tokens), tokens)
    expected_loss.backward()
    opt.step()
    # float32 on both sides, the same math in a different order (XLA's fusions vs PyTorch's
    # kernels) over ~100 ops: relative differences of 1e-6 per op stay well under 1e-4
    assert float(loss) == pytest.approx(expected_loss.item(), rel=1e-5)
    assert float(count) == 1.0
    torch_params = dict(model.named_parameters())
    for n in names:
        if n in pieces.inner:
            want_p = np.stack([dict(l.named_parameters())[n].detach().numpy() for l in layers])
            want_m = np.stack([opt.state[dict(l.named_parameters())[n]]["exp_avg"].numpy() for l in layers])
        else:
            want_p = torch_params[n].detach().numpy()
            want_m = opt.state[torch_params[n]]["exp_avg"].numpy()
        # exp_avg after one step is 0.1 x the gradient: the gradients agree
        np.testing.assert_allclose(np.asarray(new_m[n]), want_m, rtol=1e-4, atol=1e-7, err_msg=n)
        # AdamW's first update is lr x g / (|g| + eps): where |g| is 100 eps or more it is
        # lr x sign(g) within 1 %, so the parameters agree to that share of an lr-sized step
        # (1e-5) plus float32 rounding; where |g| nears eps the update follows g's last bits,
        # whose agreement the exp_avg check above already bounds
        steady = np.abs(want_m / 0.1) >= 100 * 1e-8
        np.testing.assert_allclose(np.asarray(new_p[n])[steady], want_p[steady], rtol=1e-5, atol=1.2e-5,
                                   err_msg=n)


def _reference(model, mesh_shape=(1, 8), remat=False, topology="2x4", batch_size=BATCH, unroll=1, pieces=None):
    """The looped FSDP step written here and compiled with plain JAX (``pieces``: ``model``'s,
    traced for ``batch_size`` sequences, when the caller has them)."""
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    pieces = _pieces(model, batch=batch_size) if pieces is None else pieces
    devices = topologies.get_topology_desc(topology_name=f"v5e:{topology}", platform="tpu",
                                           chips_per_host_bounds=[2, 4, 1]).devices
    mesh = Mesh(np.array(devices).reshape(mesh_shape), ("dp", "fsdp"))
    whole = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("fsdp"))
    ways = mesh_shape[1]

    def split(n):
        # FSDP splits a tensor's first dimension the axis divides (a stacked layer tensor's
        # first after the layers'); a tensor with none stays whole
        shape = pieces.specs[n].shape[1:] if n in pieces.inner else pieces.specs[n].shape
        dim = next((d for d, size in enumerate(shape) if size % ways == 0), None)
        spec = [None] * len(shape)
        if dim is not None:
            spec[dim] = "fsdp"
        return NamedSharding(mesh, P(None, *spec) if n in pieces.inner else P(*spec))

    sharding = {n: split(n) for n in (*pieces.outer, *pieces.inner)}
    policy = (jax.checkpoint_policies.nothing_saveable if remat
              else jax.checkpoint_policies.dots_with_no_batch_dims_saveable)

    def loss_of(outer, inner, buffers, tokens, labels):
        o = [outer[n] for n in pieces.outer]
        b = [buffers[n] for n in pieces.buffers]
        hidden, *side = pieces.pre(*o, *b, tokens)

        def one_layer(h, w):
            w = [jax.lax.with_sharding_constraint(w[n], whole) for n in pieces.inner]
            return jax.lax.with_sharding_constraint(pieces.layer(*w, h, *side)[0], batch), None

        hidden, _ = jax.lax.scan(jax.checkpoint(one_layer, policy=policy),
                                 jax.lax.with_sharding_constraint(hidden, batch), inner, unroll=unroll)
        return pieces.post(*o, *b, tokens, hidden, labels)[0]

    def step(params, buffers, m, v, count, tokens, labels):
        outer = {n: params[n] for n in pieces.outer}
        inner = {n: params[n] for n in pieces.inner}
        loss, grads = jax.value_and_grad(loss_of, argnums=(0, 1))(outer, inner, buffers, tokens, labels)
        grads = {**grads[0], **grads[1]}
        count = count + 1
        new = ({}, {}, {})
        for n, p in params.items():
            g = jax.lax.with_sharding_constraint(grads[n], sharding[n])
            m1 = m[n] * 0.9 + g * 0.1
            v1 = v[n] * 0.999 + g * g * 0.001
            p1 = p * (1 - 1e-3 * 1e-2) - 1e-3 * (m1 / (1 - 0.9**count)) / (jnp.sqrt(v1 / (1 - 0.999**count)) + 1e-8)
            new[0][n], new[1][n], new[2][n] = p1.astype(p.dtype), m1, v1
        return loss, *new, count

    buffers = {n: whole for n in pieces.buffers}
    in_sh = (sharding, buffers, sharding, sharding, whole, batch, batch)
    out_sh = (whole, sharding, sharding, sharding, whole)
    fn = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=(0, 2, 3, 4))
    specs = {n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding[n])
             for n, s in pieces.specs.items() if n in sharding}
    args = (specs, {n: jax.ShapeDtypeStruct(pieces.specs[n].shape, pieces.specs[n].dtype, sharding=whole)
                    for n in pieces.buffers},
            specs, specs, jax.ShapeDtypeStruct((), jnp.float32, sharding=whole),
            jax.ShapeDtypeStruct((batch_size, SEQ), jnp.int64, sharding=batch),
            jax.ShapeDtypeStruct((batch_size, SEQ), jnp.int64, sharding=batch))
    # at XLA's O0 level the step's temporaries stay in HBM (at the default level a step this
    # small is placed in on-chip memory and its HBM temporaries read 0): both sides use it
    saved = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", "O0")
    try:
        with jax.enable_x64(True):
            return fn.lower(*args).compile()
    finally:
        jax.config.update("jax_optimization_level", saved)


def _sibling(name: str):
    """tests/fit/NAME.py as a module: its HLO collective parser is the reference's here too."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"_fit_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(a, b):
    return abs(a - b) <= TOLERANCE * max(abs(b), 1)


@needs_libtpu
@pytest.mark.parametrize(("remat", "chips", "topology"), [
    (False, 8, "2x4"), (True, 8, "2x4"), (False, 64, "8x8"),
    pytest.param(False, 256, "16x16", marks=pytest.mark.slow),  # the 64-chip slice checks the same loop sharding
])
def test_looped_fsdp_step_matches_a_direct_sharded_compile(remat, chips, topology):
    import tpu_debug


    config = transformers.LlamaConfig(**SIZES)
    # one sequence per chip
    report = tpu_debug.fit(config, f"v5e-{chips}", plan="fsdp", batch=chips, seq=SEQ, loop=True, remat=remat,
                           optimization_level="O0")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    # one trace of the model's pieces serves the looped reference and the unrolled one below
    pieces = _pieces(model, batch=chips)
    compiled = _reference(model, (1, chips), remat=remat, topology=topology, batch_size=chips, pieces=pieces)
    ref = compiled.memory_analysis()

    assert report.method and "one loop" in report.method
    m = report.memory
    assert _close(m.arguments, ref.argument_size_in_bytes)
    assert _close(m.outputs, ref.output_size_in_bytes)
    assert _close(m.aliased, ref.alias_size_in_bytes)
    assert _close(m.temporaries, ref.temp_size_in_bytes)
    assert m.temporaries > 0
    # every tensor of this config has a dimension 8 divides; at 64 ways the 64-wide ones split
    expected_params = sum(p.numel() * 2 // (chips if any(d % chips == 0 for d in p.shape) else 1)
                          for p in model.parameters())
    assert m.parameters == expected_params
    # collectives per step: every layer's, so the reference is the same step with its loop
    # unrolled (the HLO of a loop holds its body once); XLA combines the unrolled program's
    # collectives differently, so bytes are compared, within the 5 % the combining moves
    unrolled = _reference(model, (1, chips), remat=remat, topology=topology, batch_size=chips,
                          unroll=SIZES["num_hidden_layers"], pieces=pieces)
    expected = _sibling("test_fit")._collectives(unrolled.as_text(), chips)
    got = {c.kind: (c.count, c.bytes) for c in report.collectives}
    assert set(got) == set(expected)
    for kind, (count, size) in expected.items():
        assert got[kind][1] == pytest.approx(size, rel=0.05), (kind, got[kind], (count, size))


@needs_libtpu
def test_activation_checkpointing_keeps_less_and_recomputes_the_forward(six_layers):
    kept = six_layers(loop=True)
    remat = six_layers(loop=True, remat=True)
    # each layer's input [1 sequence x 32 x 64] bf16 per chip is all the loop keeps with remat;
    # without, each layer keeps at least its q, k, v, attention, gate and up matmul outputs too
    assert remat.memory.temporaries < kept.memory.temporaries
    assert "only its input" in remat.method
    # the backward runs each layer's forward again: more flops, less than one more whole step
    assert kept.estimate.compute_seconds < remat.estimate.compute_seconds < 2 * kept.estimate.compute_seconds


def test_a_training_step_is_never_extended_from_fewer_layers():
    import tpu_debug

    with pytest.raises(tpu_debug.TpuDebugError, match=r"a training step is not extended from fewer layers: .*"
                       r"compiled as one loop \(loop=True"):
        tpu_debug.fit(transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 6}), "v5e-8", batch=BATCH,
                      seq=SEQ, extrapolate=True)


@needs_libtpu
def test_float32_master_weights_hold_parameters_and_state_in_float32(six_layers):
    config = transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 6})
    # six layers run as one loop unless asked otherwise: the plain step is the looped one
    plain = six_layers(loop=True)
    master = six_layers(master_dtype="float32")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    # every tensor of this config splits 8 ways; float32 is 4 bytes, AdamW keeps two such per parameter
    # and a float32 step count
    assert master.memory.parameters == sum(p.numel() * 4 for p in model.parameters()) // 8
    assert master.memory.optimizer_state == 2 * master.memory.parameters + 4
    assert master.memory.parameters == 2 * plain.memory.parameters
    # the donated float32 parameters and state are in the compiler's arguments
    assert master.memory.arguments >= master.memory.parameters + master.memory.optimizer_state
    assert "kept in float32, cast to bfloat16 where read" in master.method


@needs_libtpu
def test_every_layer_counts_in_the_looped_steps_flops_and_collectives():
    from tpu_debug.fit.answer import _hf_traceable, collective_costs
    from tpu_debug.fit.sharded import parse_plan
    from tpu_debug.fit.scan import compile_scan_step, loop_repeats
    from tpu_debug.runtime.target.hardware import parse_target

    config = transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 6})
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    tokens = torch.empty(BATCH, SEQ, dtype=torch.long, device="meta")
    from tpu_debug.fit.scan import trace_pieces

    pieces = trace_pieces(model, tokens, _loss, _hf_traceable)
    target = parse_target("v5e-8")
    fc = compile_scan_step(pieces, (BATCH, SEQ), target, parse_plan("fsdp", 8), optimization_level="O0")
    # the reference: the same step with its loop unrolled, so XLA's cost analysis sees every
    # layer (it counts a loop's body once)
    unrolled = _reference(model, unroll=6)
    want = unrolled.cost_analysis()
    want = want[0] if isinstance(want, (list, tuple)) else want
    # the scale comes from the unoptimized programs' share of one layer, applied to the
    # optimized program: XLA's simplifications move a few percent of the flops
    assert fc.compile.cost.flops == pytest.approx(want["flops"], rel=0.05)
    assert fc.flops_scale > 3  # one of six layers was counted before scaling
    # a second fit of the same step (a search's or a fix's) reads the layers' share kept for its
    # optimized program: no unsharded two-layer program is built again, and the figures agree
    from tpu_debug.fit import scan

    splits = []
    built = scan.scan_step

    def counted(*args, **kwargs):
        splits.append(kwargs.get("split"))
        return built(*args, **kwargs)

    with mock.patch.object(scan, "scan_step", counted):
        again = compile_scan_step(pieces, (BATCH, SEQ), target, parse_plan("fsdp", 8), optimization_level="O0")
    assert splits and {} not in splits  # only the sharded step, whose parameters are split
    assert (again.compile.cost, again.flops_scale) == (fc.compile.cost, fc.flops_scale)
    got = {c.kind: (c.count, c.bytes) for c in collective_costs(fc.compile.hlo, target,
                                                                loop_repeats(fc.compile.hlo, 6))}
    expected = _sibling("test_fit")._collectives(unrolled.as_text(), 8)
    # the looped and the unrolled program move the same data; XLA combines the unrolled
    # program's all-reduces differently, so counts may differ where bytes agree
    assert got["all-gather"][1] == pytest.approx(expected["all-gather"][1], rel=0.05)
    assert got["all-reduce"][1] == pytest.approx(expected["all-reduce"][1], rel=0.05)


@needs_libtpu
def test_a_mixture_of_experts_runs_its_experts_as_one_grouped_matmul():
    import tpu_debug

    config = transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=128)
    report = tpu_debug.fit(config, "v5e-8", plan="fsdp", batch=BATCH, seq=SEQ, optimization_level="O0")
    assert report.fits is True and "one loop" in report.method
    # each batch shard's tokens are routed on its own chip (tests/fit/test_fit_moe.py): nothing to caveat
    assert "routed to the experts on its own chip" in report.method and not report.caveats
    # parameters by hand from the config, each split 8 ways (every tensor has a dimension 8 divides)
    h, i, e, layers = 64, 128, 4, 6
    attention = h * h * 2 + 2 * h * (2 * 16)  # q and o: h x h; k and v: h x (2 heads x 16)
    experts = e * (2 * i * h + h * i)  # gate_up and down per expert
    per_layer = attention + experts + e * h + 2 * h  # + router, two norms
    total = layers * per_layer + 2 * 256 * h + h  # + embedding, head, final norm
    assert report.parameters == total
    assert report.memory.parameters == total * 2 // 8
    # model FLOPs count the 2 experts of 4 a token is routed to
    active = layers * (attention + experts // 2 + e * h + 2 * h) + h + 256 * h  # the head is a matmul
    tokens = BATCH * SEQ
    assert report.estimate.model_flops == 3 * (2 * active + 4 * layers * SEQ * h) * tokens


@pytest.mark.parametrize(("causal", "masked", "heads_kv"), [(True, False, 2), (False, True, 4), (True, False, 4)])
def test_blocked_attention_computes_pytorchs_attention(causal, masked, heads_kv):
    from tpu_debug.fit.scan import blocked_attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 32, 16, generator=g)
    k = torch.randn(2, heads_kv, 32, 16, generator=g)
    v = torch.randn(2, heads_kv, 32, 16, generator=g)
    mask = torch.rand(2, 1, 32, 32, generator=g) > 0.3 if masked else None
    if masked:
        mask[..., 0] = True  # every query sees a key (a row of -inf has no softmax)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=0.2,
                                          enable_gqa=heads_kv != 4)
    # four blocks of 8 queries: each block's softmax runs over every key, so blocking changes
    # no sum; float32 on both sides, sums of 32 terms
    got = blocked_attention(jnp.asarray(q.numpy()), jnp.asarray(k.numpy()), jnp.asarray(v.numpy()),
                            None if mask is None else jnp.asarray(mask.numpy()), causal, 0.2, heads_kv != 4,
                            block=8)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


@needs_libtpu
def test_gemma2_alternating_layers_compile_unrolled_with_their_parameters_split():
    import tpu_debug

    hidden, inter, vocab, heads, kv, head_dim = 64, 128, 256, 4, 2, 32
    sizes = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=6,
                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, sliding_window=16,
                 max_position_embeddings=128)
    report = tpu_debug.fit({"model_type": "gemma2", **sizes}, "v5e-8", plan="fsdp", batch=BATCH, seq=SEQ,
                           optimization_level="O0")
    # sliding-window and global layers alternate: no loop of identical layers, every layer in line
    assert report.method is None and report.extrapolation is None
    # tied embedding and head; q, k, v, o; gate, up, down; four norms a layer and the final one
    layer = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter + 4 * hidden
    total = vocab * hidden + 6 * layer + hidden
    assert report.parameters == total
    assert report.fits is True
    assert report.memory.parameters == total * 2 // 8


def test_checkpointing_a_short_model_compiles_its_loop_and_unrolled_refuses_it():
    import tpu_debug

    # two layers: unrolled by default, but activation checkpointing is the loop's
    short = transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 2})
    if _find_libtpu():
        report = tpu_debug.fit(short, "v5e-8", batch=BATCH, seq=SEQ, remat=True, optimization_level="O0")
        assert "only its input" in report.method
    with pytest.raises(tpu_debug.TpuDebugError, match=r"built into the looped step: drop loop=False"):
        tpu_debug.fit(short, "v5e-8", batch=BATCH, seq=SEQ, remat=True, loop=False)
