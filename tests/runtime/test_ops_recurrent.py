"""Recurrent modules on tpu (runtime/ops/recurrent.py: the fused LSTM and GRU cells and their
backward) against the same modules on CPU: outputs, final states, and the gradients of the
parameters and the input, in eager, lazy and compiled mode.

CPU runs its own cell (gates from one matmul each, activations in ATen's CPU loop); tpu runs
the fused cell PyTorch uses for CUDA and PrivateUse1, with the biases added to the gate
products separately. The same float32 values summed in another order: a few roundings over
values of order 1, kept through 4 time steps and 2 layers (and their backward), within
rtol 1e-5 and atol 1e-6.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

TOL = {"rtol": 1e-5, "atol": 1e-6}
MODES = ("eager", "lazy", "compiled")


@pytest.fixture(autouse=True)
def _forget_graphs():
    yield
    torch._dynamo.reset()


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (tuple, list)):  # a PackedSequence too
        for x in v:
            yield from _tensors(x)


def _to(v, device):
    if isinstance(v, tuple) and not hasattr(v, "batch_sizes"):  # an LSTM's (h0, c0)
        return tuple(_to(x, device) for x in v)
    return copy.deepcopy(v).to(device)  # a PackedSequence keeps its batch_sizes on CPU


def _run(module, inputs, mode, device):
    """Outputs, then every parameter's and floating input's gradient of the outputs' sum."""
    module = copy.deepcopy(module).to(device)
    inputs = [_to(x, device) for x in inputs]
    leaves = [x.data if hasattr(x, "batch_sizes") else x for x in _tensors_or_packed(inputs)]
    for t in leaves:
        t.requires_grad_(t.is_floating_point())
    call = torch.compile(module, backend="tpu_debug") if mode == "compiled" and device == "tpu" else module
    lazy = mode == "lazy" and device == "tpu"
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE) if lazy else contextlib.nullcontext():
        out = call(*inputs)
        sum(t.sum() for t in _tensors(out) if t.is_floating_point()).backward()
    grads = [p.grad for p in module.parameters()] + [t.grad for t in leaves if t.is_floating_point()]
    return [t.detach().cpu() for t in _tensors(out)] + [g.cpu() for g in grads]


def _tensors_or_packed(v):
    if hasattr(v, "batch_sizes") or isinstance(v, torch.Tensor):
        yield v
    else:
        for x in v:
            yield from _tensors_or_packed(x)


def _check(module, *inputs, mode):
    want = _run(module, inputs, "eager", "cpu")
    got = _run(module, inputs, mode, "tpu")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# module_db's inputs (tests/runtime/test_moduleinfo.py) cover each option alone; these
# combine them, in every mode
LSTM_VARIANTS = {
    "no_bias": {"bias": False},
    "bidirectional_batch_first_proj_size": {"bidirectional": True, "batch_first": True, "proj_size": 2},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kwargs", LSTM_VARIANTS.values(), ids=LSTM_VARIANTS)
def test_lstm(kwargs, mode):
    torch.manual_seed(0)
    _check(nn.LSTM(3, 4, num_layers=2, **kwargs), _x(4, 2, 3), mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_gru(mode):
    torch.manual_seed(0)
    _check(nn.GRU(3, 4, num_layers=2, bias=False, bidirectional=True, batch_first=True), _x(4, 2, 3), mode=mode)


@pytest.mark.parametrize(("cls", "mode"), [(nn.LSTM, m) for m in MODES] + [(nn.GRU, "eager")])
def test_packed_sequences_with_initial_state(cls, mode):
    torch.manual_seed(0)
    module = cls(3, 4, num_layers=2, bidirectional=True)
    packed = pack_padded_sequence(_x(5, 3, 3), torch.tensor([5, 3, 2]))
    h0 = _x(4, 3, 4, seed=1)
    _check(module, packed, (h0, _x(4, 3, 4, seed=2)) if cls is nn.LSTM else h0, mode=mode)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell])
def test_cells_batched_and_unbatched(cls, mode):
    torch.manual_seed(0)
    cell = cls(3, 4, bias=mode != "eager")  # with biases and without
    _check(cell, _x(2, 3), mode=mode)
    _check(cell, _x(3), mode=mode)


def test_compiled_through_dynamos_rnn_tracing(monkeypatch):
    """Dynamo leaves recurrent modules to eager mode unless ``allow_rnn``; with it, the module
    is one graph, where PyTorch's decomposition of aten::lstm replaces the cells."""
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)
    torch.manual_seed(0)
    _check(nn.LSTM(3, 4, bidirectional=True), _x(3, 2, 3), mode="compiled")


def test_double_backward_takes_the_differentiable_cell():
    """Under create_graph the cells' backward is PyTorch's composite of differentiable ops."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 4)

    def grad_norm(device):
        c = copy.deepcopy(cell).to(device)
        x = _x(2, 3).to(device).requires_grad_()
        h, cstate = c(x)
        (g,) = torch.autograd.grad((h.sum() + cstate.sum()), x, create_graph=True)
        g.square().sum().backward()
        return [t.detach().cpu() for t in (g, x.grad, c.weight_ih.grad)]

    for got, want in zip(grad_norm("tpu"), grad_norm("cpu")):
        torch.testing.assert_close(got, want, **TOL)
