"""Device RNG: reproducible under manual_seed, fresh per call, generator honoured."""

from __future__ import annotations

import pytest
import torch

RANDOM = {
    "randn": lambda **kw: torch.randn(1000, device="tpu", **kw),
    "rand": lambda **kw: torch.rand(1000, device="tpu", **kw),
    "randint": lambda **kw: torch.randint(0, 10, (1000,), device="tpu", **kw),
    "normal_": lambda **kw: torch.empty(1000, device="tpu").normal_(2.0, 3.0, **kw),
    "uniform_": lambda **kw: torch.empty(1000, device="tpu").uniform_(-1, 1, **kw),
    "bernoulli": lambda **kw: torch.bernoulli(torch.full((1000,), 0.3, device="tpu"), **kw),
    "randperm": lambda **kw: torch.randperm(50, device="tpu", **kw),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_manual_seed_reproduces_and_calls_differ(name):
    make = RANDOM[name]
    torch.manual_seed(123)
    a, b = make().cpu(), make().cpu()
    torch.manual_seed(123)
    a2, b2 = make().cpu(), make().cpu()
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(b, b2)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_explicit_generator_is_honoured(name):
    make = RANDOM[name]
    g = torch.Generator().manual_seed(7)
    a = make(generator=g).cpu()
    b = make(generator=g).cpu()
    g.manual_seed(7)
    torch.manual_seed(999)  # the global seed must not matter
    a2 = make(generator=g).cpu()
    torch.testing.assert_close(a, a2)
    assert not torch.equal(a, b)


def test_distributions_shape_dtype_and_range():
    torch.manual_seed(0)
    n = torch.randn(20000, device="tpu").cpu()
    assert n.dtype == torch.float32 and abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    u = torch.rand(20000, dtype=torch.float64, device="tpu").cpu()
    assert u.dtype == torch.float64 and u.min() >= 0 and u.max() < 1
    i = torch.randint(3, 9, (5000,), device="tpu").cpu()
    assert i.dtype == torch.int64 and i.min() == 3 and i.max() == 8
    p = torch.randperm(100, device="tpu").cpu()
    assert sorted(p.tolist()) == list(range(100))
    bern = torch.bernoulli(torch.full((20000,), 0.25, device="tpu")).cpu()
    assert abs(bern.mean().item() - 0.25) < 0.02


def test_dropout_statistics_and_scaling():
    torch.manual_seed(0)
    x = torch.ones(100000, device="tpu")
    y = torch.nn.functional.dropout(x, p=0.3, training=True).cpu()
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    same = torch.nn.functional.dropout(x, p=0.3, training=False).cpu()
    torch.testing.assert_close(same, torch.ones(100000))


def test_rng_state_round_trip():
    torch.manual_seed(5)
    torch.randn(3, device="tpu")
    state = torch.tpu.get_rng_state()
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.randn(4, device="tpu").cpu()
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="tpu RNG state must be the uint8 tensor of 16 bytes"):
        torch.tpu.set_rng_state(torch.zeros(3))


def test_tpu_manual_seed_functions():
    torch.tpu.manual_seed(11)
    a = torch.rand(3, device="tpu").cpu()
    torch.tpu.manual_seed_all(11)
    b = torch.rand(3, device="tpu").cpu()
    torch.testing.assert_close(a, b)
    assert torch.tpu.initial_seed() == 11
