"""Memory techniques of the looped fit step (``tpu_debug.fit.techniques``).

References, neither the tool's own output:
- PyTorch on CPU: the chunked cross-entropy's value and gradients against
  ``F.cross_entropy`` of the whole logits, and the looped step with it against
  ``model(...)``, ``loss.backward()`` and ``torch.optim.AdamW.step()``;
- a direct compile: the looped FSDP step with the technique written in this file (its own
  head patch, chunked loss, checkpoint policy, scan, gathers and AdamW over the traced
  pieces), compiled with plain ``jax.jit(...).lower(...).compile()`` for the deviceless
  v5e-8; the per-chip figures must agree within 2 %.
"""

from __future__ import annotations

import functools
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip(
    "transformers", reason="builds Hugging Face models: pip install -e '.[models]'"
)

# a vocabulary large beside the hidden size, so that the logits are the step's biggest buffer
SIZES = dict(
    vocab_size=4096,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    use_cache=False,
)
CHIPS, SEQ = 8, 1024
TOLERANCE = 0.02  # one program, one compiler on both sides; 2 % is what the fit answer promises
needs_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)



def _loss(outputs, labels):
    return F.cross_entropy(outputs.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


def _traceable():
    # transformers skips a value-dependent mask check only while it thinks it is traced
    return mock.patch.object(transformers.masking_utils, "is_tracing", lambda *a, **k: True)


@pytest.mark.parametrize("chunk", [8, 12, 64])
def test_chunked_cross_entropy_computes_pytorchs_loss_and_gradients(chunk):
    from tpu_debug.fit.techniques import chunked_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 40, 16, generator=g, requires_grad=True)
    weight = torch.randn(100, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, 100, (3, 40), generator=g)
    want = F.cross_entropy((hidden @ weight.T)[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    want.backward()
    got, (g_hidden, g_weight) = jax.value_and_grad(
        lambda h, w: chunked_cross_entropy(h, w, jnp.asarray(labels.numpy()), chunk=chunk), argnums=(0, 1)
    )(jnp.asarray(hidden.detach().numpy()), jnp.asarray(weight.detach().numpy()))
    # float32 on both sides, the same sums in another order: a logsumexp over 100 logits,
    # the mean over 117 positions (whole, or chunk by chunk), the weight's gradient a sum
    # over 120 positions; each a few ulps (1e-7 relative) per term, far under 1e-5
    assert float(got) == pytest.approx(want.item(), rel=1e-6)
    np.testing.assert_allclose(np.asarray(g_hidden), hidden.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g_weight), weight.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_the_looped_step_with_a_chunked_loss_computes_pytorchs_training_step():
    from tpu_debug.fit.scan import scan_step, trace_pieces
    from tpu_debug.fit.techniques import hidden_of, traced_loss

    torch.manual_seed(0)
    sizes = {**SIZES, "vocab_size": 256, "max_position_embeddings": 64}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)).float()
    tokens = torch.randint(0, sizes["vocab_size"], (2, 48))
    with traced_loss(model, True) as head_loss:
        pieces = trace_pieces(
            model, torch.empty(2, 48, dtype=torch.long, device="meta"), hidden_of, _traceable
        )
    layers = model.model.layers

    def value(n):
        if n in pieces.inner:
            return jnp.asarray(np.stack([dict(l.named_parameters())[n].detach().numpy() for l in layers]))
        return jnp.asarray(dict(model.named_parameters())[n].detach().numpy())

    names = (*pieces.outer, *pieces.inner)
    params = {n: value(n) for n in names}
    buffers = {n: jnp.asarray(b.numpy()) for n, b in model.named_buffers() if n in pieces.buffers}
    zeros = {n: jnp.zeros_like(p) for n, p in params.items()}
    step = scan_step(pieces, gathered=None, split={}, batch=None, head_loss=head_loss)
    with jax.enable_x64(True):
        loss, _, new_m, _, _ = jax.jit(step)(
            params,
            buffers,
            zeros,
            zeros,
            jnp.float32(0),
            jnp.asarray(tokens.numpy()),
            jnp.asarray(tokens.numpy()),
        )
    opt = torch.optim.AdamW(model.parameters())
    expected = _loss(model(tokens), tokens)
    expected.backward()
    opt.step()
    # float32 both sides over ~100 ops in another order (as the plain looped step's test)
    assert float(loss) == pytest.approx(expected.item(), rel=1e-5)
    torch_params = dict(model.named_parameters())
    for n in pieces.outer:  # the head and embedding gradients pass through the chunked loss
        want_m = opt.state[torch_params[n]]["exp_avg"].numpy()
        np.testing.assert_allclose(np.asarray(new_m[n]), want_m, rtol=1e-4, atol=1e-7, err_msg=n)
    for n in pieces.inner:
        want_m = np.stack([opt.state[dict(l.named_parameters())[n]]["exp_avg"].numpy() for l in layers])
        np.testing.assert_allclose(np.asarray(new_m[n]), want_m, rtol=1e-4, atol=1e-7, err_msg=n)


def _chunked(hidden, weight, labels, chunk):
    """The test's own fused chunked next-token loss: per chunk (each after the previous
    one's weight gradient), float32 logits, the loss, and the gradients from softmax minus
    one-hot; the backward scales the gradients made in the forward."""
    batch, seq = labels.shape
    n = batch * (seq - 1)

    def forward(h_all, w):
        nxt = jnp.pad(labels[:, 1:], ((0, 0), (0, 1))).astype(jnp.int32)
        total, gw, gh = 0.0, jnp.zeros(w.shape, jnp.float32), []
        for start in range(0, seq, chunk):
            h, gw = jax.lax.optimization_barrier((h_all[:, start : start + chunk], gw))
            logits = jnp.einsum("bsh,vh->bsv", h, w, preferred_element_type=jnp.float32)
            log_p = jax.nn.log_softmax(logits, axis=-1)
            t = nxt[:, start : start + chunk]
            valid = (start + jnp.arange(h.shape[1]) < seq - 1)[None, :, None]
            hot = jax.nn.one_hot(t, w.shape[0], dtype=jnp.float32)
            total = total - jnp.sum(jnp.where(valid, log_p * hot, 0.0))
            d = (jnp.where(valid, jnp.exp(log_p) - hot, 0.0) / n).astype(h.dtype)
            gh.append(jnp.einsum("bsv,vh->bsh", d, w, preferred_element_type=jnp.float32).astype(h.dtype))
            gw = gw + jnp.einsum("bsv,bsh->vh", d, h, preferred_element_type=jnp.float32)
        return total / n, (jnp.concatenate(gh, axis=1), gw.astype(w.dtype))

    @jax.custom_vjp
    def loss(h, w):
        return forward(h, w)[0]

    loss.defvjp(
        forward,
        lambda grads, ct: (grads[0] * ct.astype(grads[0].dtype), grads[1] * ct.astype(grads[1].dtype)),
    )
    return loss(hidden, weight)


def _reference_pieces(model, *, chunked: bool, attention: str = "blocked"):
    """``model``'s pieces as the reference's step runs them: the layer with the tool's
    ``attention``; ``chunked``: the head left out, the post piece giving the last hidden states."""
    from tpu_debug.fit.scan import trace_pieces
    from tpu_debug.fit.techniques import attention_as

    head = model.lm_head
    tokens = torch.empty(CHIPS, SEQ, dtype=torch.long, device="meta")
    if chunked:
        head.forward = lambda x: x
    try:
        with attention_as(attention):
            return trace_pieces(
                model, tokens, (lambda out, labels: out.logits) if chunked else _loss, _traceable
            )
    finally:
        head.__dict__.pop("forward", None)


@functools.cache
def _plain_pieces():
    """The bfloat16 SIZES Llama's pieces with the blocked attention and the whole loss, traced
    once: each named policy's reference scans the same pieces under its own policy."""
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(torch.bfloat16)
    return _reference_pieces(model, chunked=False)


def _reference(model, *, chunked: bool, policy, attention: str = "blocked", named_input: bool = False,
               pieces=None):
    """The looped FSDP step over 8 v5e chips written here and compiled with plain JAX
    (``attention``: the layer traced with the tool's attention of that kind; ``named_input``:
    each layer's input read through ``checkpoint_name(..., "decoder_layer_input")``, as
    MaxText's layers name it; ``pieces``: ``_reference_pieces`` of ``model`` with the same
    ``chunked`` and ``attention``, when the caller has them)."""
    from jax.ad_checkpoint import checkpoint_name
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from tpu_debug.fit import moe as fit_moe
    from tpu_debug.fit.techniques import compiler_options

    if pieces is None:
        pieces = _reference_pieces(model, chunked=chunked, attention=attention)
    devices = topologies.get_topology_desc(
        topology_name="v5e:2x4", platform="tpu", chips_per_host_bounds=[2, 4, 1]
    ).devices
    mesh = Mesh(np.array(devices).reshape(1, CHIPS), ("dp", "fsdp"))
    whole, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("fsdp"))

    def split(n):
        shape = pieces.specs[n].shape[1:] if n in pieces.inner else pieces.specs[n].shape
        dim = next((d for d, size in enumerate(shape) if size % CHIPS == 0), None)
        spec = [None] * len(shape)
        if dim is not None:
            spec[dim] = "fsdp"
        return NamedSharding(mesh, P(None, *spec) if n in pieces.inner else P(*spec))

    sharding = {n: split(n) for n in (*pieces.outer, *pieces.inner)}

    def loss_of(outer, inner, buffers, tokens, labels):
        o = [outer[n] for n in pieces.outer]
        b = [buffers[n] for n in pieces.buffers]
        hidden, *side = pieces.pre(*o, *b, tokens)

        def one_layer(h, w):
            h = checkpoint_name(h, "decoder_layer_input") if named_input else h
            w = [jax.lax.with_sharding_constraint(w[n], whole) for n in pieces.inner]
            return jax.lax.with_sharding_constraint(pieces.layer(*w, h, *side)[0], batch), None

        hidden, _ = jax.lax.scan(
            jax.checkpoint(one_layer, policy=policy), jax.lax.with_sharding_constraint(hidden, batch), inner
        )
        out = pieces.post(*o, *b, tokens, hidden, labels)[0]
        return _chunked(out, outer["lm_head.weight"], labels, 512) if chunked else out

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
            p1 = p * (1 - 1e-3 * 1e-2) - 1e-3 * (m1 / (1 - 0.9**count)) / (
                jnp.sqrt(v1 / (1 - 0.999**count)) + 1e-8
            )
            new[0][n], new[1][n], new[2][n] = p1.astype(p.dtype), m1, v1
        return loss, *new, count

    buffers = {n: whole for n in pieces.buffers}
    fn = jax.jit(
        step,
        in_shardings=(sharding, buffers, sharding, sharding, whole, batch, batch),
        out_shardings=(whole, sharding, sharding, sharding, whole),
        donate_argnums=(0, 2, 3, 4),
    )
    specs = {
        n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding[n])
        for n, s in pieces.specs.items()
        if n in sharding
    }
    ids = jax.ShapeDtypeStruct((CHIPS, SEQ), jnp.int64, sharding=batch)
    args = (
        specs,
        {
            n: jax.ShapeDtypeStruct(pieces.specs[n].shape, pieces.specs[n].dtype, sharding=whole)
            for n in pieces.buffers
        },
        specs,
        specs,
        jax.ShapeDtypeStruct((), jnp.float32, sharding=whole),
        ids,
        ids,
    )
    # at O0 a small step's temporaries stay in HBM (the default level may put them on chip)
    saved = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", "O0")
    try:
        # the splash kernel runs per chip on its sequences: the tool's lowering reads the
        # mesh and the batch axes from here, as fit's compile sets them
        with jax.enable_x64(True), fit_moe.sharded(mesh, ("fsdp",)):
            # the same compiler options as fit's (the splash kernel's VMEM scope)
            return fn.lower(*args).compile(compiler_options=compiler_options(attention))
    finally:
        jax.config.update("jax_optimization_level", saved)


def _close(a, b):
    return abs(a - b) <= TOLERANCE * max(abs(b), 1)


def _fit(**options):
    import tpu_debug

    return tpu_debug.fit(
        transformers.LlamaConfig(**SIZES),
        f"v5e-{CHIPS}",
        plan="fsdp",
        batch=CHIPS,
        seq=SEQ,
        loop=True,
        optimization_level="O0",
        **options,
    )


def _assert_matches(report, compiled):
    ref = compiled.memory_analysis()
    m = report.memory
    assert _close(m.arguments, ref.argument_size_in_bytes)
    assert _close(m.outputs, ref.output_size_in_bytes)
    assert _close(m.aliased, ref.alias_size_in_bytes)
    assert _close(m.temporaries, ref.temp_size_in_bytes), (m.temporaries, ref.temp_size_in_bytes)
    # what the step places in host memory (offloaded activations), read from the same analysis
    host = (ref.host_argument_size_in_bytes + ref.host_output_size_in_bytes - ref.host_alias_size_in_bytes
            + ref.host_temp_size_in_bytes)
    assert _close(m.host, host), (m.host, host)


@needs_libtpu
def test_chunked_loss_step_matches_a_direct_compile_and_keeps_less_than_the_whole_logits():
    chunked = _fit(loss="chunked")
    plain = _fit()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(torch.bfloat16)
    _assert_matches(
        chunked,
        _reference(model, chunked=True, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    )
    assert "the loss chunked" in chunked.method and "never whole" in chunked.method
    # one sequence of 1024 per chip: the whole float32 logits are 1024 x 4096 x 4 B = 16 MiB,
    # and their gradient as much again; a chunk of 512 positions holds half of each, one chunk
    # live at a time. The step's peak then moves elsewhere (the attention's blocks in the
    # backward), so the peak drops by at least one chunk's logits, not by all of them
    assert chunked.memory.temporaries < plain.memory.temporaries - 8 * 2**20


@needs_libtpu
@pytest.mark.parametrize("name", ["offload", "all-matmuls"])
def test_a_named_checkpoint_policy_matches_a_direct_compile(name):
    from tpu_debug.fit.techniques import POLICIES

    report = _fit(remat_policy=name)
    policy = (
        jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
        if name == "offload"
        else jax.checkpoint_policies.dots_saveable
    )
    compiled = _reference(None, chunked=False, policy=policy, pieces=_plain_pieces())
    _assert_matches(report, compiled)
    assert POLICIES[name].keeps in report.method
    if name == "offload":
        # what the layers keep went to XLA's host memory space: the compiler counts host temporaries
        assert compiled.memory_analysis().host_temp_size_in_bytes > 0


@pytest.mark.parametrize(
    ("causal", "masked", "heads_kv"), [(True, False, 2), (False, True, 4), (True, False, 4)]
)
def test_flash_attention_computes_pytorchs_attention_and_its_gradients(causal, masked, heads_kv):
    from tpu_debug.fit.techniques import flash_attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 32, 16, generator=g, requires_grad=True)
    k = torch.randn(2, heads_kv, 32, 16, generator=g, requires_grad=True)
    v = torch.randn(2, heads_kv, 32, 16, generator=g, requires_grad=True)
    mask = torch.rand(2, 1, 32, 32, generator=g) > 0.3 if masked else None
    if masked:
        mask[..., 0] = True  # every query sees a key (a row of -inf has no softmax)
    weights = torch.randn(2, 4, 32, 16, generator=g)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=0.2, enable_gqa=heads_kv != 4
    )
    (want * weights).sum().backward()

    def arr(t):
        return jnp.asarray(t.detach().numpy())

    def weighted(a, b, c):
        out = flash_attention(a, b, c, None if mask is None else arr(mask), causal, 0.2, block=8)
        return jnp.sum(out * arr(weights)), out

    (_, got), grads = jax.value_and_grad(weighted, argnums=(0, 1, 2), has_aux=True)(arr(q), arr(k), arr(v))
    # four blocks of 8 queries, each against every key: float32 on both sides, sums of 32
    # terms in another order (the backward's through the kept log-sum-exp, as a flash kernel's)
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    for got_grad, t in zip(grads, (q, k, v)):
        np.testing.assert_allclose(np.asarray(got_grad), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_chunked_loss_is_offered_as_a_fix_when_the_logits_are_large_and_each_fix_names_its_pytorch_code():
    from tpu_debug.fit.techniques import technique_fixes, torch_code

    hbm = 16 * 2**30
    small = dict(technique_fixes({}, hbm // 16, hbm))
    large = dict(technique_fixes({}, hbm // 8, hbm))
    assert "chunked loss (--chunked-loss)" not in small
    assert large["chunked loss (--chunked-loss)"] == {"loss": "chunked"}
    assert large["chunked loss, flash attention and activation checkpointing"] == {
        "loss": "chunked",
        "remat": True,
        "attention": "flash",
    }
    # MaxText's way first: splash attention with its offload policy, chunked when the logits are large
    first = technique_fixes({}, hbm // 8, hbm)[0]
    assert first == (
        (
            "splash attention, MaxText's offload policy and the chunked loss "
            "(--attention splash --remat-policy maxtext --chunked-loss)"
        ),
        {"attention": "splash", "remat_policy": "maxtext", "loss": "chunked"},
    )
    assert technique_fixes({}, hbm // 16, hbm)[0][1] == {"attention": "splash", "remat_policy": "maxtext"}
    # nothing offered twice: a step already chunked, checkpointed and flash gets only MaxText's
    # way, and a step already trained MaxText's way gets none
    assert [c for _, c in technique_fixes({"loss": "chunked", "remat": True, "attention": "flash"}, hbm, hbm)] == [
        {"attention": "splash", "remat_policy": "maxtext"}
    ]
    assert technique_fixes({"loss": "chunked", "remat_policy": "maxtext", "attention": "splash"}, hbm, hbm) == []
    code = torch_code(first[1])
    assert "splash_sdpa" in code and "save_on_cpu" in code and "create_selective_checkpoint_contexts" in code
    assert "LigerFusedLinearCrossEntropyLoss" in code
    assert "save_on_cpu" in torch_code({"remat_policy": "offload"})
    assert "splash_sdpa" in torch_code({"attention": "flash"})
    assert "LigerFusedLinearCrossEntropyLoss" in torch_code({"loss": "chunked"})
    assert "create_selective_checkpoint_contexts" in torch_code({"remat_policy": "all-matmuls"})


@needs_libtpu
def test_the_flash_attention_step_matches_a_direct_compile():
    # the reference's layer runs the tool's flash_attention (its numerics are checked against
    # SDPA above); what this compares is the looped FSDP step fit builds around it
    flash = _fit(attention="flash")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(torch.bfloat16)
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    _assert_matches(flash, _reference(model, chunked=False, policy=policy, attention="flash"))
    assert "flash attention" in flash.method


def test_splash_attention_computes_pytorchs_causal_attention_and_its_gradients():
    from tpu_debug.fit.techniques import splash_attention

    g = torch.Generator().manual_seed(3)
    # grouped-query (4 query heads over 2 key heads), two blocks of 128 each way: the kernel
    # skips the block of keys above the diagonal; Pallas's interpreter runs it on the CPU
    q = torch.randn(2, 4, 256, 64, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 256, 64, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 256, 64, generator=g, requires_grad=True)
    weights = torch.randn(2, 4, 256, 64, generator=g)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    (want * weights).sum().backward()

    def arr(t):
        return jnp.asarray(t.detach().numpy())

    def weighted(a, b, c):
        out = splash_attention(a, b, c, None, True, 0.2, block=128)
        return jnp.sum(out * arr(weights)), out

    (_, got), grads = jax.value_and_grad(weighted, argnums=(0, 1, 2), has_aux=True)(arr(q), arr(k), arr(v))
    # float32 on both sides; the kernel's softmax runs online over its key blocks and its
    # backward goes through the kept log-sum-exp: sums of up to 256 terms of magnitude ~1-10
    # in another order, so ~1e-6 relative of the largest values (measured 1.6e-6 absolute
    # for the output, 6e-6 for the gradients, whose largest entries are ~4)
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for got_grad, t in zip(grads, (q, k, v)):
        np.testing.assert_allclose(np.asarray(got_grad), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_splash_attention_refuses_what_is_not_causal():
    from tpu_debug.fit.techniques import splash_attention
    from tpu_debug.runtime.target.errors import TargetError

    x = jnp.zeros((1, 2, 128, 64), jnp.float32)
    with pytest.raises(TargetError, match=r"attention='splash' models causal attention .*got no mask"):
        splash_attention(x, x, x, None, False, None)


def _maxtext_policy():
    """MaxText's offload policy written directly in JAX: the tool's names, nothing else saved."""
    from tpu_debug.fit.techniques import OFFLOADED_NAMES

    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(OFFLOADED_NAMES),
        offload_src="device", offload_dst="pinned_host")


@needs_libtpu
@pytest.mark.slow  # the named policies' direct compiles (offload, all-matmuls) stay in the default tier
def test_the_maxtext_policy_with_splash_attention_matches_a_direct_compile():
    from tpu_debug.fit.techniques import POLICIES

    report = _fit(attention="splash", remat_policy="maxtext")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(torch.bfloat16)
    # the reference names the layer input itself; the queries, keys and values are named by
    # the tool's splash lowering the reference's layer runs (its numerics are checked above)
    policy = _maxtext_policy()
    compiled = _reference(model, chunked=False, policy=policy, attention="splash", named_input=True)
    _assert_matches(report, compiled)
    assert POLICIES["maxtext"].keeps in report.method and "splash attention" in report.method
    hlo = compiled.as_text()
    # the kernel is in the program (a Mosaic custom call), and what the layers keep went to
    # XLA's host memory space
    assert "tpu_custom_call" in hlo
    assert compiled.memory_analysis().host_temp_size_in_bytes > 0
    # the kernel's custom call prints its metadata over several lines: the reader still reads
    # every instruction of the program, the loop body's after the kernel too
    from tpu_debug.core.hlo_text import parse_module

    printed = re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = ", hlo, re.MULTILINE)
    assert sorted(i.name for i in parse_module(hlo).instructions()) == sorted(printed)
    # op by op, the kernels count at the flops they compute (no cost analysis counts a kernel's):
    # the forward's two products and the fused backward's five, over the causal blocks (SEQ is
    # one block here, computed whole)
    from tpu_debug.fit.techniques import splash_kernel_flops

    assert report.estimate.op_by_op_seconds > 0
    heads, dim = SIZES["num_attention_heads"], SIZES["hidden_size"] // SIZES["num_attention_heads"]
    square = 2.0 * heads * SEQ * SEQ * dim  # one chip's one sequence
    module = parse_module(hlo)
    kernels = {i.name.split(".")[0]: splash_kernel_flops(i, module.computation(i.computation))
               for i in module.instructions() if i.opcode == "custom-call" and i.name.startswith("splash")}
    assert kernels == {"splash_mha_fwd_residuals": 2 * square, "splash_mha_dkv_no_residuals": 5 * square}


def _attention_nodes(pieces):
    nodes = pieces.layer.gm.graph.nodes
    return [n for n in nodes if n.op == "call_function" and "attention" in str(n.target)]


def test_the_splash_step_of_a_grouped_query_llama_computes_pytorchs_training_step():
    from tpu_debug.fit.scan import scan_step, trace_pieces
    from tpu_debug.fit.techniques import attention_as

    torch.manual_seed(0)
    # head dim 64 (the kernel's lanes), 4 query heads over 2 key/value heads: Hugging Face's
    # Llama repeats the keys and values to 4 heads before SDPA; one block of 128 positions
    sizes = {**SIZES, "vocab_size": 256, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2,
             "max_position_embeddings": 128}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)).float()
    tokens = torch.randint(0, sizes["vocab_size"], (2, 128))
    meta = torch.empty(2, 128, dtype=torch.long, device="meta")
    with attention_as("splash"):
        pieces = trace_pieces(model, meta, _loss, _traceable)
    # the kernel gets the keys and values with their own 2 heads (the repeat is gone from the
    # graph); the default blocked attention's graph keeps the repeat as traced
    (node,) = _attention_nodes(pieces)
    shapes = [tuple(a.meta["val"].shape) for a in node.args[:3]]
    assert shapes == [(2, 4, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64)]
    assert not any(n.target is torch.ops.aten.expand.default for n in pieces.layer.gm.graph.nodes)
    (blocked,) = _attention_nodes(trace_pieces(model, meta, _loss, _traceable))
    assert tuple(blocked.args[1].meta["val"].shape) == (2, 4, 128, 64)

    layers = model.model.layers

    def value(n):
        if n in pieces.inner:
            return jnp.asarray(np.stack([dict(l.named_parameters())[n].detach().numpy() for l in layers]))
        return jnp.asarray(dict(model.named_parameters())[n].detach().numpy())

    params = {n: value(n) for n in (*pieces.outer, *pieces.inner)}
    buffers = {n: jnp.asarray(b.numpy()) for n, b in model.named_buffers() if n in pieces.buffers}
    zeros = {n: jnp.zeros_like(p) for n, p in params.items()}
    step = scan_step(pieces, gathered=None, split={}, batch=None)
    ids = jnp.asarray(tokens.numpy())
    with jax.enable_x64(True):  # as fit traces the step (int64 tokens); the kernel runs without
        loss, _, new_m, _, _ = jax.jit(step)(params, buffers, zeros, zeros, jnp.float32(0), ids, ids)
    expected = _loss(model(tokens), tokens)
    expected.backward()
    # float32 on both sides: the kernel's online softmax and its fused backward (through the
    # kept log-sum-exp) sum the same terms as PyTorch's math attention in another order, and
    # the layers around it are the same ops; a few ulps per op over ~100 ops, so 1e-5 relative
    # for the loss. AdamW's first moment after one step from zero is 0.1 x the gradient, so
    # this compares every gradient (the keys' and values' projections' through the grouped
    # heads: the repeat's backward sums the query heads' shares, the kernel's does too).
    # Measured: the loss equal to the last bit, each gradient within 1e-6 of its largest entry
    assert float(loss) == pytest.approx(expected.item(), rel=1e-5)
    torch_params = dict(model.named_parameters())
    for n in pieces.outer:
        np.testing.assert_allclose(np.asarray(new_m[n]), 0.1 * torch_params[n].grad.numpy(), rtol=1e-4,
                                   atol=1e-7, err_msg=n)
    for n in pieces.inner:
        want = np.stack([0.1 * dict(l.named_parameters())[n].grad.numpy() for l in layers])
        np.testing.assert_allclose(np.asarray(new_m[n]), want, rtol=1e-4, atol=1e-7, err_msg=n)


@needs_libtpu
@pytest.mark.slow  # half a minute of compiles; the flash and chunked-loss steps' direct compiles stay in the default tier
def test_the_splash_step_with_grouped_keys_and_values_matches_a_direct_compile(monkeypatch):
    report = _fit(attention="splash", remat_policy="maxtext")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(torch.bfloat16)
    policy = _maxtext_policy()

    def reference(grouped: bool):
        # the layer traced as it is, without the tool's rewrite of the repeat; ``grouped``:
        # transformers' own switch makes its SDPA call take the 2 key/value heads with
        # enable_gqa (no repeat to rewrite), else the repeat to 4 heads reaches the kernel
        with monkeypatch.context() as m:
            m.setattr("tpu_debug.fit.techniques.kv_unrepeated", lambda gm: 0)
            m.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1" if grouped else "0")
            return _reference(model, chunked=False, policy=policy, attention="splash", named_input=True)

    grouped, repeated = reference(True), reference(False)
    _assert_matches(report, grouped)
    # the host memory holds each layer's input and its q, k and v (one sequence of 1024 per
    # chip, bfloat16): the keys and values with their own 2 heads, not repeated to 4, are 2
    # heads fewer each, in the TPU's tiled layout the head's 16 values padded to 128 lanes:
    # 3 layers x (k, v) x 2 heads x 1024 positions x 128 x 2 bytes = 3 MiB less offloaded
    host = [c.memory_analysis().host_temp_size_in_bytes for c in (repeated, grouped)]
    saved = host[0] - host[1]
    assert saved == SIZES["num_hidden_layers"] * 2 * 2 * 1024 * 128 * 2, saved
