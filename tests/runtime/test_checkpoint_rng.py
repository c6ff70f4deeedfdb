"""``torch.utils.checkpoint`` around dropout on tpu: the recomputed forward draws the masks the
first forward drew, in eager, lazy and compiled mode, with ``use_reentrant`` either way.

Eagerly (and lazily) checkpointing stashes the tpu RNG state before the checkpointed forward
and restores it for the recomputation, through ``torch.tpu``; compiled, AOTAutograd's
partitioner wraps each recomputed random op in PyTorch's RNG-state operators
(``run_and_save_rng_state`` in the forward, ``run_with_rng_state`` in the backward), and the
tpu program passes the draw's PRNG key from one to the other.

A dropout mask on tpu cannot equal CPU's (another generator), so the checks factor the
randomness out:

* with dropout off (p=0) the checkpointed layer trains equal to the same layer on CPU;
* with dropout on, the checkpointed layer trains equal to the same layer without checkpoint on
  tpu from the same seed: both draw the same masks in the forward, and a recomputation that drew
  others would give other gradients (a mask differs in about half its elements: the parameters
  would then differ by the order of the learning rate times a gradient, not by rounding).

Tolerances: float32 layers of width 16 (attention, layer norms, GELU), one SGD step. Against
CPU, XLA and PyTorch order the products' and reductions' sums differently: a few roundings
each, relative 1e-5 of values of order 1 (atol 1e-5 for values near 0). With and without
checkpoint on tpu the programs are the same ops, fused differently when the backward
recomputes: the same bound.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

TOL = {"rtol": 1e-5, "atol": 1e-5}
MODES = ("eager", "lazy", "compiled")


@pytest.fixture(autouse=True)
def _forget_graphs():
    yield
    torch._dynamo.reset()


class BertLayer(nn.Module):
    """A BERT encoder layer (post-norm): attention with dropout on its weights and its output,
    then a GELU feed-forward block ending in dropout; each sublayer optionally checkpointed."""

    def __init__(self, p: float, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.drop, self.norm1 = nn.Dropout(p), nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))
        self.norm2 = nn.LayerNorm(d)
        self.checkpointed: bool | None = None  # None: no checkpoint; else use_reentrant

    def _attention(self, x):
        return self.norm1(x + self.drop(self.attn(x, x, x, need_weights=False)[0]))

    def _sublayer(self, fn, x):
        if self.checkpointed is None:
            return fn(x)
        return checkpoint(fn, x, use_reentrant=self.checkpointed)

    def forward(self, x):
        h = self._sublayer(self._attention, x)
        return self.norm2(h + self._sublayer(self.ffn, h))


def _train(model: nn.Module, x: torch.Tensor, mode: str, steps: int = 1):
    """Losses and the parameters after ``steps`` SGD steps, on CPU."""
    call = torch.compile(model, backend="tpu_debug") if mode == "compiled" else model
    lazy = mode == "lazy" and x.device.type == "tpu"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE) if lazy else contextlib.nullcontext():
            opt.zero_grad()
            loss = call(x).square().mean()
            loss.backward()
            opt.step()
        losses.append(loss.detach().cpu())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _layer(p: float, checkpointed: bool | None) -> BertLayer:
    torch.manual_seed(0)
    layer = BertLayer(p).train()
    layer.checkpointed = checkpointed
    return layer


def _x() -> torch.Tensor:
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))


def _assert_same_training(got, want):
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("mode", MODES)
def test_checkpointed_layer_without_dropout_trains_as_on_cpu(mode, reentrant):
    layer = _layer(0.0, reentrant)
    want = _train(copy.deepcopy(layer), _x().requires_grad_(), "eager")
    got = _train(layer.to("tpu"), _x().to("tpu").requires_grad_(), mode)
    _assert_same_training(got, want)


def _slow_beyond_eager(mode: str, reentrant: bool):
    # compiling the layer twice (with and without checkpoint, forward and backward) costs
    # seconds a case: the default tier runs it eagerly, and the cheap dropout-only check
    # below in every mode
    marks = () if (mode, reentrant) == ("eager", False) else (pytest.mark.slow,)
    return pytest.param(mode, reentrant, marks=marks, id=f"{mode}-{'reentrant' if reentrant else 'nonreentrant'}")


@pytest.mark.parametrize(("mode", "reentrant"), [_slow_beyond_eager(m, r) for m in MODES for r in (False, True)])
def test_checkpoint_recomputes_the_forwards_dropout_masks(mode, reentrant):
    runs = []
    for checkpointed in (reentrant, None):
        torch._dynamo.reset()
        layer = _layer(0.3, checkpointed).to("tpu")
        torch.manual_seed(7)  # the same draws in both runs
        runs.append(_train(layer, _x().to("tpu").requires_grad_(), mode))
    _assert_same_training(*runs)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("mode", MODES)
def test_the_recomputed_mask_is_the_forwards(mode, reentrant):
    """Dropout alone: its input's gradient is the mask scaled, which is the output over the input."""
    drop = nn.Dropout(0.5).to("tpu")

    def fn(x):
        return checkpoint(drop, x, use_reentrant=reentrant)

    call = torch.compile(fn, backend="tpu_debug") if mode == "compiled" else fn
    x = (torch.rand(16, 32) + 0.5).to("tpu").requires_grad_()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE) if mode == "lazy" else contextlib.nullcontext():
        out = call(x)
        out.sum().backward()
    kept = x.grad.cpu()
    assert 0 < (kept > 0).float().mean() < 1  # a mask was drawn
    # out = x * mask * 2 exactly (scaling by a power of two), so out / x is the mask times 2
    torch.testing.assert_close(kept, (out / x).detach().cpu(), rtol=0, atol=0)
