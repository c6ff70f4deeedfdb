"""Mixture-of-experts layers routed per batch shard (``tpu_debug.fit.moe``).

References, neither the tool's own output:
- PyTorch on CPU: transformers' own ``grouped_mm`` experts (the whole batch sorted at once)
  give the logits and gradients the per-group routing must give, run by JAX on the CPU;
  ``torch._grouped_mm`` and ``scatter_add`` with PyTorch's autograd give what the backward
  ops' lowerings must;
- the routed tokens' own size: routed over the whole batch, one chip would hold every
  token's expert intermediates; routed per shard, the step's temporaries at a fixed
  per-chip batch are those of a narrower slice.
"""

from __future__ import annotations

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")

SIZES = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
             use_cache=False)
needs_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')



def _models():
    """A tiny Mixtral with random float32 weights, as transformers' grouped_mm runs it and as a fit does."""
    from tpu_debug.fit import build_config

    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SIZES)
    config._experts_implementation = "grouped_mm"
    reference = transformers.AutoModelForCausalLM.from_config(config).eval()
    ours = transformers.AutoModelForCausalLM.from_config(build_config(config)).eval()
    ours.load_state_dict(reference.state_dict())
    return reference, ours


@pytest.mark.parametrize("groups", [1, 4])
def test_per_shard_routing_gives_transformers_grouped_mm_logits_and_gradients(groups):
    from tpu_debug.fit import moe as fit_moe
    from tpu_debug.fit.model_step import trace_step

    reference, ours = _models()
    assert ours.config._experts_implementation == fit_moe.EXPERTS
    tokens = torch.randint(0, SIZES["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(1))
    cotangent = torch.randn(4, 16, SIZES["vocab_size"], generator=torch.Generator().manual_seed(2))
    logits = reference(tokens).logits
    names = [n for n, _ in reference.named_parameters()]
    want = torch.autograd.grad((logits * cotangent).sum(), list(reference.parameters()))
    # four groups of one sequence each: every group sorted and multiplied on its own
    with fit_moe.per_shard(groups), mock.patch.object(transformers.masking_utils, "is_tracing",
                                                       lambda *a, **k: True):
        traced = trace_step(ours, (tokens,))
    assert sum("fit_grouped_mm" in str(n.target) for n in traced.graph.graph.nodes) == 2 * SIZES["num_hidden_layers"]
    params = [p.detach().numpy() for p in ours.parameters()]
    rest = [*(b.numpy() for b in ours.buffers()), tokens.numpy()]
    with jax.enable_x64(True):
        got, pullback = jax.vjp(lambda *p: jax.jit(traced.function())(*p, *rest)[0], *params)
        grads = pullback(jnp.asarray(cotangent.numpy()))
    # float32 on both sides, the same products summed in another order (sums of at most
    # 64 terms of order one): a few float32 ulps of the largest values
    np.testing.assert_allclose(np.asarray(got), logits.detach().numpy(), rtol=1e-5, atol=1e-5)
    for name, g, w in zip(names, grads, want):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_backward_lowerings_give_pytorchs_gradients():
    """The ops an unrolled step's PyTorch backward records, lowered, against PyTorch's autograd."""
    from tpu_debug.fit import moe as fit_moe

    fit_moe.register()
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, 10, 8, generator=g, requires_grad=True)
    b = torch.randn(4, 8, 12, generator=g, requires_grad=True)  # CPU kernel: rows of 16-byte multiples
    ends = torch.tensor([[2, 5, 5, 10], [0, 0, 4, 10], [10, 10, 10, 10]], dtype=torch.int32)
    grad = torch.randn(3, 10, 12, generator=g)
    out = torch.stack([torch._grouped_mm(a[i], b, offs=ends[i]) for i in range(3)])
    want_a, want_b = torch.autograd.grad(out, (a, b), grad)
    got_a, got_b = fit_moe.grouped_matmul_backward(*(jnp.asarray(t.detach().numpy()) for t in (a, b, ends, grad)))
    # float32 sums of at most 10 products
    np.testing.assert_allclose(np.asarray(got_a), want_a.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_b), want_b.numpy(), rtol=1e-5, atol=1e-5)

    x = torch.randn(3, 5, 4, generator=g, requires_grad=True)
    index = torch.randint(0, 5, (3, 7), generator=g)  # repeats: their gradients add up
    picked = x.gather(1, index.unsqueeze(-1).expand(-1, -1, 4))
    up = torch.randn(3, 7, 4, generator=g)
    (want,) = torch.autograd.grad(picked, x, up)
    np.testing.assert_allclose(np.asarray(fit_moe.take_rows(jnp.asarray(x.detach().numpy()), jnp.asarray(index.numpy()))),
                               picked.detach().numpy())
    got = fit_moe.take_rows_backward(jnp.asarray(index.numpy()), jnp.asarray(up.numpy()), 5)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6, atol=1e-6)


@needs_libtpu
def test_a_mixture_of_experts_steps_temporaries_per_chip_do_not_grow_with_the_slice():
    import tpu_debug

    hidden, inter, seq, k = 64, 256, 256, 2
    config = transformers.MixtralConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=4, num_experts_per_tok=k, max_position_embeddings=1024)
    temps = {}
    for chips in (8, 32):  # one sequence per chip
        report = tpu_debug.fit(config, f"v5e-{chips}", plan="fsdp", batch=chips, seq=seq, loop=True,
                               optimization_level="O0")
        assert report.fits is True and not report.caveats
        temps[chips] = report.memory.temporaries
    # routed over the whole batch, one chip would hold every token's gate and up projections:
    # 32 sequences x 2 experts a token, 2 x intermediate bfloat16 values each
    whole_batch = 32 * seq * k * 2 * inter * 2
    assert temps[32] < whole_batch
    # routed per shard, a chip's tokens and their routing are the same at 8 and 32 chips; XLA
    # may lay the wider step's buffers out a little differently (measured: 1 % apart)
    assert temps[32] == pytest.approx(temps[8], rel=0.1)


@needs_libtpu
def test_on_a_slice_the_grouped_matmul_and_its_gradients_cost_their_own_flops():
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_debug.fit import moe as fit_moe
    from tpu_debug.runtime.target import parse_target
    from tpu_debug.runtime.target.compile import compile_for_target
    from tpu_debug.fit.sharded import Plan, _mesh

    groups, rows, k, n, experts = 8, 512, 256, 512, 4
    mesh = _mesh(parse_target("v5e-8"), Plan(fsdp=groups))
    split, whole = NamedSharding(mesh, PartitionSpec("fsdp")), NamedSharding(mesh, PartitionSpec())

    def loss(a, b, offs):
        return fit_moe.grouped_matmul(a, b, offs).astype(jnp.float32).sum()

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(split, whole, split),
                 out_shardings=(whole, (split, whole)))
    args = (jax.ShapeDtypeStruct((groups, rows, k), jnp.bfloat16, sharding=split),
            jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16, sharding=whole),
            jax.ShapeDtypeStruct((groups, experts), jnp.int32, sharding=split))
    with fit_moe.sharded(mesh, ("fsdp",)):
        result = compile_for_target(fn, args, "v5e-8", x64=True, optimization_level="O0")
    # one group a chip: its rows by their experts' matrices, then the rows' and the weights'
    # gradients, each 2 x rows x k x n multiply-adds whatever the experts' count (the
    # elementwise sum and casts add under 1 %)
    assert result.cost.flops == pytest.approx(3 * 2 * rows * k * n, rel=0.02)
    # the weights' gradient runs per expert's rows: no [experts, rows, n] float32 product
    assert result.memory.temp_bytes < experts * rows * n * 4
