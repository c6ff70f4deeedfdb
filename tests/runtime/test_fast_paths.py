"""The runtime's fast paths against PyTorch on CPU: what they skip must not change a value."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_debug.runtime import eager, probes
from tpu_debug.runtime.tensor import PAYLOAD_ATTR, LazyArray

# Each accumulated gradient is the same float32 additions on both sides (one add per backward,
# in the same order); the gradients themselves come from different matmul kernels on CPU and
# XLA, which round differently: float32 tolerances.
TOL = dict(rtol=1e-5, atol=1e-6)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _batches(n=3):
    torch.manual_seed(1)
    return [(torch.randn(5, 8), torch.randint(0, 3, (5,))) for _ in range(n)]


def _backward(model, x, y):
    F.cross_entropy(model(x), y).backward()


def _pair():
    cpu = _model()
    return cpu, copy.deepcopy(cpu).to("tpu")


class _Count:
    """A probe counting each kind of eager run (a tracer listening)."""

    def __init__(self):
        self.runs = []

    def on_execute(self, mode, name, key, seconds):
        self.runs.append(name)


def _accumulate_both_and_compare():
    """Backward over several batches into existing ``.grad``s, on CPU and on ``tpu``: equal."""
    cpu, dev = _pair()
    for x, y in _batches():
        _backward(cpu, x, y)
        _backward(dev, x.to("tpu"), y.to("tpu"))
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL)


def test_gradients_accumulated_over_backwards_equal_cpu():
    _accumulate_both_and_compare()


def test_sums_run_by_the_end_of_the_backward():
    _, dev = _pair()
    (x, y), = _batches(1)
    _backward(dev, x.to("tpu"), y.to("tpu"))
    eager._accumulators.clear()
    _backward(dev, x.to("tpu"), y.to("tpu"))  # each .grad exists: autograd adds into it
    # one program summed all six gradients
    (key,) = eager._accumulators
    assert len(key) == len(list(dev.parameters()))
    for q in dev.parameters():
        payload = getattr(q.grad.untyped_storage(), PAYLOAD_ATTR)
        assert type(payload) is not LazyArray or payload.array is not None
    assert eager._accumulating[0] is None


def test_a_gradient_read_during_the_backward_is_its_sum():
    # a post-accumulate hook reads the parameter's .grad (optimizer-in-backward does), and a
    # later parameter's hook reads an earlier one's: each sees the accumulated value
    seen = {"cpu": [], "tpu": []}
    cpu, dev = _pair()
    for name, m in (("cpu", cpu), ("tpu", dev)):
        params = list(m.parameters())
        for p in params:
            p.register_post_accumulate_grad_hook(
                lambda p, out=seen[name], first=params[-1]: out.append((p.grad.sum().item(), first.grad.clone().cpu()))
            )
    for x, y in _batches(2):
        _backward(cpu, x, y)
        _backward(dev, x.to("tpu"), y.to("tpu"))
    assert len(seen["tpu"]) == len(seen["cpu"]) == 2 * len(list(cpu.parameters()))
    for (s_cpu, g_cpu), (s_tpu, g_tpu) in zip(seen["cpu"], seen["tpu"]):
        assert s_tpu == pytest.approx(s_cpu, rel=1e-5, abs=1e-5)
        torch.testing.assert_close(g_tpu, g_cpu, **TOL)


def test_a_gradient_written_while_its_sum_is_pending():
    # a post-accumulate hook that scales and clips its own .grad in place
    def scale_and_clip(p):
        p.grad.mul_(0.5).clamp_(-0.05, 0.05)

    cpu, dev = _pair()
    for m in (cpu, dev):
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(scale_and_clip)
    for x, y in _batches():
        _backward(cpu, x, y)
        _backward(dev, x.to("tpu"), y.to("tpu"))
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL)


def test_optimizer_steps_on_accumulated_gradients_equal_cpu():
    cpu, dev = _pair()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
    batches = _batches(4)
    for i, (x, y) in enumerate(batches):
        _backward(cpu, x, y)
        _backward(dev, x.to("tpu"), y.to("tpu"))
        if i % 2:  # two micro-batches a step: the second backward adds into .grad
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=False)  # .grad stays: every backward adds into it
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)


def test_a_views_gradient_and_half_precision_accumulate_as_cpu():
    # bfloat16 parameters, and a parameter whose .grad is a view of a larger buffer (a
    # flat gradient buffer): the first takes the deferred sum, the second the op's own path
    torch.manual_seed(2)
    w = torch.randn(4, 6, dtype=torch.bfloat16)
    b = torch.randn(6)
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    flat = torch.zeros(12)
    grads = {}
    for dev in ("cpu", "tpu"):
        wp = nn.Parameter(w.to(dev))
        bp = nn.Parameter(b.to(dev))
        buf = flat.clone().to(dev)  # (.to("cpu") of a CPU tensor is the tensor itself)
        bp.grad = buf[6:]  # .grad a view into the buffer at an offset
        for _ in range(2):
            ((x.to(dev) @ wp).float() + bp).square().sum().backward()
        grads[dev] = (wp.grad.cpu(), bp.grad.cpu(), buf.cpu())
    for a, b_ in zip(grads["tpu"], grads["cpu"]):
        # bfloat16: the product's rounding differs between the two matmul kernels by an ulp
        torch.testing.assert_close(a, b_, rtol=1e-2, atol=1e-2)


def test_a_small_bound_runs_sums_early_with_the_same_values(monkeypatch):
    monkeypatch.setattr(eager, "ACCUMULATION_BYTES", 64)  # a sum of every 16 float32 values
    _accumulate_both_and_compare()


def test_a_listening_tracer_sees_each_accumulation_as_an_op():
    _, dev = _pair()
    (x, y), = _batches(1)
    xd, yd = x.to("tpu"), y.to("tpu")
    _backward(dev, xd, yd)
    count = _Count()
    probes.subscribe(count)
    try:
        _backward(dev, xd, yd)
    finally:
        probes.unsubscribe(count)
    assert count.runs.count("add_.Tensor") == len(list(dev.parameters()))


# -- in-place ops donating the buffers they write ---------------------------------------------


def _donors(op):
    return [d for d in eager.plan_for(op).donors.values() if d is not False]


def test_optimizer_steps_with_donated_buffers_equal_cpu():
    """SGD with momentum and AdamW rewrite every parameter and state tensor each step: from an
    executable's third call on, in place in the old buffers; four steps equal CPU's."""
    for make in (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                 lambda ps: torch.optim.AdamW(ps, lr=1e-2)):
        cpu, dev = _pair()
        opts = make(cpu.parameters()), make(dev.parameters())
        for x, y in _batches(4):
            for model, opt, (a, b) in ((cpu, opts[0], (x, y)), (dev, opts[1], (x.to("tpu"), y.to("tpu")))):
                opt.zero_grad()
                _backward(model, a, b)
                opt.step()
        for p, q in zip(cpu.parameters(), dev.parameters()):
            torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    assert _donors(torch.ops.aten._foreach_add_.List)


def test_a_payload_another_tensor_holds_is_not_donated():
    """A compiled graph's output may hold an input's buffer (an input passed through): an
    in-place op on the input must leave that tensor's value alone."""
    from tpu_debug.runtime.tensor import from_jax, to_jax

    x = torch.arange(6.0).to("tpu")
    for _ in range(3):  # the signature's donor exists from the third call on
        x.mul_(2.0)
    alias = from_jax(to_jax(x), x.dtype)  # a second storage holding the same array
    x.mul_(2.0)
    x.add_(1.0)
    torch.testing.assert_close(alias.cpu(), torch.arange(6.0) * 8)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) * 16 + 1)
    assert _donors(torch.ops.aten.mul_.Tensor)  # (a Python number: a wrapped 0-d tensor)


def test_a_view_written_in_place_is_not_donated():
    """A view reads and writes part of its storage's payload: the old buffer stays."""
    base = torch.arange(8.0).to("tpu")
    view = base[2:6]
    for _ in range(4):
        view.mul_(2.0)
    expected = torch.arange(8.0)
    expected[2:6] *= 16
    torch.testing.assert_close(base.cpu(), expected)


def test_a_backward_fed_a_reshaped_gradient_takes_the_static_call(monkeypatch):
    """A language model's loss reads its logits reshaped (``logits.reshape(-1, vocab)``): the
    compiled backward's incoming gradient is then a whole payload of another shape. The
    static call reads it reshaped; the gradients equal CPU's."""
    from tpu_debug.runtime import compiled

    torch._dynamo.reset()
    results = []
    static = compiled.CompiledGraph._call_static

    def counted(self, *args):
        out = static(self, *args)
        results.append((self.kind, out is not None))
        return out

    monkeypatch.setattr(compiled.CompiledGraph, "_call_static", counted)
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 11))
    dev = copy.deepcopy(cpu).to("tpu")
    fwd = torch.compile(dev, backend="tpu_debug")
    tokens = torch.randint(0, 11, (2, 5))

    def loss(logits):
        return F.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1).to(logits.device))

    loss(cpu(tokens)).backward()
    for _ in range(3):
        for p in dev.parameters():
            p.grad = None
        loss(fwd(tokens.to("tpu"))).backward()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL)
    assert ("backward", True) in results and ("backward", False) not in results
    torch._dynamo.reset()
