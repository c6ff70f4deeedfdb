"""Compiled mode against PyTorch on CPU: forward, gradients, optimizer steps."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tpu_debug
from tpu_debug.runtime import compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


# Where AdamW's parameters may be compared tightly. Its update is lr * m / (sqrt(v) + eps):
# for a gradient near zero (|g| ~ 1e-9) a float32 rounding difference of ~1e-9 between
# the device and CPU flips the sign of m / sqrt(v), so the step moves by up to +-lr. That
# is not a runtime error, and how often it happens depends on the machine (XLA:CPU's
# thread partitioning changes summation order). An element is compared tightly when each
# step's gradient was either exactly zero on both sides (an embedding row not looked up:
# AdamW's update is then identical) or at least this large. There the update's relative
# error is the gradient's (rounding: ~1e-7 relative to the largest gradient entries), so
# the parameters stay well inside rtol=1e-3/atol=1e-4 after a few steps at lr=1e-2.
_ADAM_GRAD_FLOOR = 1e-4


def _no_fragile_elements(model):
    return {name: torch.zeros_like(p, dtype=torch.bool) for name, p in model.named_parameters()}


def _note_near_zero_grads(fragile, cpu_model, dev_model):
    """Mark the elements whose gradient this step makes AdamW's update sensitive to rounding."""
    for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
        g_cpu, g_dev = p_cpu.grad.abs(), p_dev.grad.cpu().abs()
        fragile[name] |= ((g_cpu > 0) & (g_cpu < _ADAM_GRAD_FLOOR)) | ((g_cpu == 0) != (g_dev == 0))


def _assert_adam_params_close(cpu_model, dev_model, fragile, *, lr, steps, rtol, atol):
    """Parameters after AdamW steps agree where no gradient was near zero; elsewhere they are
    within what +-lr per step can move them."""
    for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
        p_dev, p_cpu = p_dev.detach().cpu(), p_cpu.detach()
        steady = ~fragile[name]
        torch.testing.assert_close(p_dev[steady], p_cpu[steady], rtol=rtol, atol=atol, msg=name)
        # AdamW's step is lr * m / sqrt(v) (|m / sqrt(v)| <= 1 with bias correction for
        # constant-sign gradients, a few times that at worst), plus lr * weight decay * |p|
        assert (p_dev - p_cpu).abs().max() <= 2 * 4 * lr * steps, name


def _same_grads(cpu_model, dev_model, loss_of):
    """Gradients computed on CPU, given to both models: an optimizer-step test then compares the
    step itself, not AdamW's amplification of rounding in near-zero gradients (see
    ``_ADAM_GRAD_FLOOR``)."""
    cpu_model.zero_grad()
    loss_of(cpu_model).backward()
    for p_cpu, p_dev in zip(cpu_model.parameters(), dev_model.parameters()):
        p_dev.grad = p_cpu.grad.to("tpu")


def _train_compare(make_model, make_batch, loss_fn, steps=5, opt="adamw", **compile_kw):
    """Train a CPU model and its `tpu` copy side by side; losses, gradients, parameters and
    buffers must agree (parameters under AdamW only where no step's gradient was near zero,
    see ``_ADAM_GRAD_FLOOR``; the rest must still be within the optimizer's +-lr per step)."""
    cpu_model = make_model()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    step_dev = tpu_debug.compile(dev_model, **compile_kw)
    opts = []
    for m in (cpu_model, dev_model):
        if opt == "sgd":
            opts.append(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
        else:
            opts.append(torch.optim.AdamW(m.parameters(), lr=1e-2))
    lr = opts[0].param_groups[0]["lr"]
    fragile = _no_fragile_elements(cpu_model)
    for step in range(steps):
        x, y = make_batch(step)
        losses = []
        for model, fwd, o, dev in ((cpu_model, cpu_model, opts[0], "cpu"), (dev_model, step_dev, opts[1], "tpu")):
            o.zero_grad()
            loss = loss_fn(fwd(x.to(dev)), y.to(dev))
            loss.backward()
            losses.append(loss)
            o.step()
        torch.testing.assert_close(losses[1].cpu(), losses[0], **TOL)
        for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-3, atol=1e-4, msg=f"{name} step {step}")
        _note_near_zero_grads(fragile, cpu_model, dev_model)
    if opt == "sgd":
        for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
            torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-3, atol=1e-4, msg=name)
    else:
        _assert_adam_params_close(cpu_model, dev_model, fragile, lr=lr, steps=steps, rtol=1e-3, atol=1e-4)
    for (name, b_cpu), b_dev in zip(cpu_model.named_buffers(), dev_model.buffers()):
        torch.testing.assert_close(b_dev.cpu(), b_cpu, rtol=1e-3, atol=1e-4, msg=name)
    return cpu_model, dev_model


@pytest.mark.quick
def test_mlp_forward_backward_and_adamw_steps():
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(5)]
    _train_compare(_mlp, lambda i: batches[i], F.cross_entropy)


def test_cnn_with_batchnorm_train_mode_sgd():
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(5)]

    def make():
        torch.manual_seed(0)
        return SmallCNN()

    _train_compare(make, lambda i: batches[i], F.cross_entropy, opt="sgd")


def test_cnn_eval_mode_forward():
    torch.manual_seed(0)
    model = SmallCNN()
    model.train()
    with torch.no_grad():
        model(torch.randn(8, 3, 16, 16))  # non-trivial running stats
    model.eval()
    dev = copy.deepcopy(model).to("tpu")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = tpu_debug.compile(dev)(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), model(x), **TOL)


def test_tiny_llama_forward_and_training():
    cfg = LlamaConfig()
    g = torch.Generator().manual_seed(3)
    tokens = [torch.randint(0, cfg.vocab, (1, 33), generator=g) for _ in range(5)]

    def make():
        torch.manual_seed(0)
        return TinyLlama(cfg)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), target.reshape(-1))

    _train_compare(make, lambda i: (tokens[i][:, :-1], tokens[i][:, 1:]), loss_fn, steps=5)


def test_weights_change_does_not_recompile_new_shape_does():
    model = _mlp().to("tpu")
    fwd = tpu_debug.compile(model)
    before = len(compiled.graph_stats())
    with torch.no_grad():
        fwd(torch.randn(4, 8).to("tpu"))
        for p in model.parameters():
            p.add_(0.1)
        fwd(torch.randn(4, 8).to("tpu"))
    stats = compiled.graph_stats()[before:]
    assert sum(s["compiles"] for s in stats) == 1
    with torch.no_grad():
        fwd(torch.randn(6, 8).to("tpu"))
    stats = compiled.graph_stats()[before:]
    # one more program for the new batch size (dynamo may mark the dim dynamic: still one compile)
    assert sum(s["compiles"] for s in stats) == 2


def test_dropout_is_fresh_each_call_and_seeded():
    def f(x):
        return F.dropout(x, p=0.5, training=True)

    cf = tpu_debug.compile(f)
    x = torch.ones(10000, device="tpu")
    torch.manual_seed(0)
    a, b = cf(x).cpu(), cf(x).cpu()
    torch.manual_seed(0)
    a2 = cf(x).cpu()
    assert not torch.equal(a, b)
    torch.testing.assert_close(a, a2)
    assert abs((a != 0).float().mean().item() - 0.5) < 0.03
    torch.testing.assert_close(a[a != 0], torch.full_like(a[a != 0], 2.0))


def test_graph_break_runs_python_between_graphs():
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # data-dependent: a graph break
            return y + 1
        return y - 1

    x = torch.randn(5)
    out = tpu_debug.compile(f)(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))


def test_inplace_and_buffer_mutation_in_graph():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x):
            self.count.add_(x.sum(0))
            y = x.clone()
            y.mul_(3)
            return y

    cpu = M()
    dev = M().to("tpu")
    f = tpu_debug.compile(dev)
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(f(x.to("tpu")).cpu(), cpu(x))
    torch.testing.assert_close(dev.count.cpu(), cpu.count)


def test_default_backend_picks_tpu_debug_for_tpu_inputs():
    before = len(compiled.graph_stats())
    out = torch.compile(lambda x: x.sin() + 1)(torch.ones(3, device="tpu"))
    torch.testing.assert_close(out.cpu(), torch.ones(3).sin() + 1)
    assert len(compiled.graph_stats()) > before


def test_backend_by_name():
    for name in ("tpu_debug", "tpu"):
        torch._dynamo.reset()
        out = torch.compile(lambda x: x * 3, backend=name)(torch.ones(2, device="tpu"))
        torch.testing.assert_close(out.cpu(), torch.full((2,), 3.0))


def test_optimizer_step_inside_compiled_function():
    torch.manual_seed(0)
    cpu_model = nn.Linear(4, 2)
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)

    def step(model, opt, x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    cstep = tpu_debug.compile(step)
    for _ in range(3):
        x = torch.randn(3, 4)
        step(cpu_model, cpu_opt, x)
        cstep(dev_model, dev_opt, x.to("tpu"))
    torch.testing.assert_close(dev_model.weight.cpu(), cpu_model.weight, **TOL)


@pytest.mark.parametrize("capturable", [False, True])
def test_compiled_adamw_step_writes_params_and_state(capturable):
    """``torch.compile(opt.step)``: one program updates parameters and optimizer state,
    written back into the inputs from the graph's outputs (in-graph input mutations)."""
    torch.manual_seed(0)
    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2, capturable=capturable)
    dev_step = tpu_debug.compile(dev_opt.step)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        _same_grads(cpu_model, dev_model, lambda m: F.cross_entropy(m(x), y))
        cpu_opt.step()
        dev_step()
    for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(dev_opt.state[p_dev][key].cpu(), cpu_opt.state[p_cpu][key], rtol=1e-4, atol=1e-6)
    assert [g["compiles"] for g in compiled.graph_stats() if g["calls"] >= 4], "the step program is reused"


def _programs(fn):
    """Run ``fn`` with a probe subscribed; the compiled programs it compiled (CompileInfo)."""
    from tpu_debug.runtime import probes

    seen = []

    class P:
        def on_compile(self, info):
            if info.mode == "compiled":
                seen.append(info)

    p = P()
    probes.subscribe(p)
    try:
        fn()
    finally:
        probes.unsubscribe(p)
    return seen


def test_graph_program_records_fx_scopes():
    seen = _programs(lambda: tpu_debug.compile(lambda x: torch.relu(x) * 2)(torch.randn(4, device="tpu")))
    info = seen[-1]
    nodes = info.graph.nodes
    assert any(n.target == "aten.relu.default" for n in nodes)
    hlo = info.hlo()
    relu = next(n for n in nodes if n.target == "aten.relu.default")
    assert relu.scope in hlo  # optimized HLO metadata names the FX node
    assert relu.stack_trace and "test_compiled.py" in relu.stack_trace


def test_backward_in_the_compiled_function_is_one_program_with_the_forward():
    """``loss.backward()`` inside a function given to tpu_debug.compile: forward and
    backward compile to one program, the gradients land in ``.grad`` as PyTorch's do,
    and AdamW steps from them train like PyTorch on CPU."""
    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2, capturable=True)

    def fwd_bwd(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    step = tpu_debug.compile(fwd_bwd)
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(4)]
    fragile = _no_fragile_elements(cpu_model)
    infos = []
    for i, (x, y) in enumerate(batches):
        cpu_opt.zero_grad()
        dev_opt.zero_grad()
        want = fwd_bwd(cpu_model, x, y)
        out = []
        compiled_now = _programs(lambda: out.append(step(dev_model, x.to("tpu"), y.to("tpu"))))
        infos += compiled_now
        got = out[0]
        torch.testing.assert_close(got.cpu(), want, **TOL)
        assert not got.requires_grad
        for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-6, msg=name)
        _note_near_zero_grads(fragile, cpu_model, dev_model)
        cpu_opt.step()
        dev_opt.step()
    _assert_adam_params_close(cpu_model, dev_model, fragile, lr=1e-2, steps=len(batches), rtol=1e-4, atol=1e-5)
    # one program computed loss and gradients, compiled once: no separate backward graph
    assert [i.graph.kind for i in infos] == ["inference"]
    ops = {n.target for n in infos[0].graph.nodes}
    assert "aten.threshold_backward.default" in ops or "aten.gelu_backward.default" in ops


def test_backward_in_graph_off_keeps_pytorchs_default():
    """``backward_in_graph=False``: dynamo's default, the backward call breaks the graph
    and autograd runs AOTAutograd's backward program."""
    model = _mlp().to("tpu")

    def fwd_bwd(x):
        loss = model(x).sum()
        loss.backward()
        return loss.detach()

    infos = _programs(lambda: tpu_debug.compile(fwd_bwd, backward_in_graph=False)(torch.randn(3, 8, device="tpu")))
    kinds = [i.graph.kind for i in infos]
    assert "forward" in kinds and "backward" in kinds  # (and the resumed ``detach``'s graph)
    assert model[0].weight.grad is not None


def test_outputs_that_are_inputs_or_repeats_are_not_copied_by_the_program():
    """A graph output that is an input (AOTAutograd saves inputs for backward) or a value
    already returned (``relu`` and ``detach(relu)``) comes from that array, not from a
    program output XLA would have to copy; each is still a tensor of its own."""

    def f(x, w):
        h = torch.relu(x @ w)
        return h, h.detach(), x.detach(), h * 2

    x = torch.randn(4, 3)
    w = torch.randn(3, 5)
    xd, wd = x.to("tpu"), w.to("tpu")
    outs = []
    infos = _programs(lambda: outs.extend(tpu_debug.compile(f)(xd, wd)))
    for got, want in zip(outs, f(x, w)):
        torch.testing.assert_close(got.cpu(), want, **TOL)
    # the program returns h and h * 2 only
    (info,) = infos
    assert len(info.lowered.out_info) == 2
    # outputs alias what they alias in PyTorch: ``h.detach()`` is a view of the output
    # ``h`` (the runtime returns it as one), ``x.detach()`` of the input ``x`` (AOTAutograd
    # regenerates it): in-place writes reach the other tensor as they do on CPU
    x_cpu = x.clone()
    want = list(f(x_cpu, w))
    for outputs in (outs, want):
        outputs[1].add_(100.0)
        outputs[2].mul_(3.0)
    for got, expected in zip(outs, want):
        torch.testing.assert_close(got.cpu(), expected, **TOL)
    torch.testing.assert_close(xd.cpu(), x_cpu)


def test_repeated_calls_of_a_training_graph_return_its_saved_values_and_gradients():
    """From its second call a static graph makes its outputs from a plan kept from the first:
    a forward's saved values (program outputs, inputs passed through, a value returned twice)
    and a backward's gradients, None for an input that needs none, are what PyTorch has."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model = copy.deepcopy(cpu).to("tpu")
    x, target = torch.randn(5, 6), torch.randint(0, 3, (5,))
    xd, td = x.to("tpu"), target.to("tpu")
    step = torch.compile(lambda x, t: F.cross_entropy(model(x), t), backend="tpu_debug")
    for _ in range(3):
        for p in (*model.parameters(), *cpu.parameters()):
            p.grad = None
        loss = step(xd, td)
        loss.backward()
        want = F.cross_entropy(cpu(x), target)
        want.backward()
        torch.testing.assert_close(loss.cpu(), want.detach(), **TOL)
        for p, q in zip(model.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)
    forward = [g for g in compiled._graphs if g.graph_id.endswith("/forward") and g._static_entry is not None
               and g._static_entry.tail]
    # the forward saves weights it was given: outputs that are inputs, made without the walk
    assert any(source == compiled._INPUT for g in forward for source, *_ in g._static_entry.tail)


def test_outputs_viewing_another_output_share_its_storage():
    def f(x):
        h = x * 2
        return h, h.view(-1), h.t(), h[1:, ::2], (h + 1).sum()

    x = torch.randn(4, 6)
    outs = tpu_debug.compile(f)(x.to("tpu"))
    want = list(f(x))
    for outputs in (outs, want):
        outputs[1][:3].fill_(7.0)   # through the flat view
        outputs[3].mul_(-1.0)       # through a strided slice
    for got, expected in zip(outs, want):
        torch.testing.assert_close(got.cpu(), expected, **TOL)
    assert outs[2].stride() == want[2].stride()


def test_backward_runs_on_the_calling_thread():
    """The autograd engine runs `tpu` backward nodes on the thread that called
    ``backward()`` (no device worker thread), for compiled graphs and eager ops."""
    import threading

    model = _mlp().to("tpu")
    compiled_model = tpu_debug.compile(model)
    threads = []
    for fwd in (model, compiled_model):
        x = torch.randn(3, 8, device="tpu", requires_grad=True)
        out = fwd(x)
        out.register_hook(lambda g: threads.append(threading.get_ident()) or g)
        out.sum().backward()
    assert threads == [threading.get_ident()] * 2


def test_overwritten_inputs_donate_their_buffers_unless_shared():
    """A graph that overwrites an input (an optimizer step) donates that input's buffer
    to the program, so XLA updates it in place; when the array is also held elsewhere
    (a clone that shares it, a saved tensor) the call runs a copy-out variant instead and
    the other holder keeps its value."""

    def update(p, g):
        p.add_(g * 2)

    p_cpu = torch.randn(64)
    g = torch.randn(64)
    p = p_cpu.to("tpu")
    gd = g.to("tpu")
    step = tpu_debug.compile(update)
    infos = _programs(lambda: step(p, gd))
    (info,) = infos
    assert "input_output_alias" in info.compiled.as_text()  # the program takes p's buffer
    p_cpu.add_(g * 2)
    torch.testing.assert_close(p.cpu(), p_cpu)
    for _ in range(2):  # donating calls
        step(p, gd)
        p_cpu.add_(g * 2)
    torch.testing.assert_close(p.cpu(), p_cpu)
    # a saved tensor shares p's array (the forward saved its input p for backward, no
    # copy): the update between forward and backward must not take that buffer
    x = torch.randn(64, device="tpu", requires_grad=True)
    loss = tpu_debug.compile(lambda x, w: (x * w).sum())(x, p)
    p_before = p_cpu.clone()
    step(p, gd)
    p_cpu.add_(g * 2)
    loss.backward()
    torch.testing.assert_close(x.grad.cpu(), p_before)  # d(sum(x * w))/dx: w as it was saved
    torch.testing.assert_close(p.cpu(), p_cpu)
    step(p, gd)  # and after, donation again
    p_cpu.add_(g * 2)
    torch.testing.assert_close(p.cpu(), p_cpu)


def test_a_graph_called_with_dense_inputs_then_rows_of_a_bigger_tensor_reads_and_writes_each():
    """A graph whose inputs have static shapes takes its inputs straight from their
    storages while each is a whole, dense payload; a row of a bigger tensor (its storage
    holds the other rows too, which dynamo's guards do not look at) passes the same
    guards and must be read and written through its view: each call against the same
    arithmetic on CPU."""

    def update(p, g):
        p.add_(g * 2)
        return p.sum()

    step = tpu_debug.compile(update)
    rows_cpu, g_cpu = torch.randn(3, 16), torch.randn(16)
    rows, g = rows_cpu.to("tpu"), g_cpu.to("tpu")
    dense_cpu = torch.randn(16)
    dense = dense_cpu.to("tpu")
    for target, target_cpu in ((dense, dense_cpu), (dense, dense_cpu), (rows[1], rows_cpu[1]),
                               (dense, dense_cpu), (rows[2], rows_cpu[2])):
        total = step(target, g)
        expected = target_cpu.add_(g_cpu * 2).sum()
        torch.testing.assert_close(total.cpu(), expected)
    torch.testing.assert_close(rows.cpu(), rows_cpu)  # rows 0 untouched, 1 and 2 updated once
    torch.testing.assert_close(dense.cpu(), dense_cpu)


@pytest.mark.parametrize("op", ["addcmul_", "addcdiv_"])
def test_compiled_inplace_addcmul_addcdiv(op):
    """In-place ``addcmul_``/``addcdiv_`` decompose to ``prims.fma`` in a graph (Adam's
    single-tensor path runs ``exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)``)."""
    g = torch.Generator().manual_seed(6)
    x, a, b = (torch.randn(4, 5, generator=g) for _ in range(3))
    b = b.abs() + 0.5
    xd = x.to("tpu")
    tpu_debug.compile(lambda x, a, b: getattr(x, op)(a, b, value=0.3))(xd, a.to("tpu"), b.to("tpu"))
    getattr(x, op)(a, b, value=0.3)
    torch.testing.assert_close(xd.cpu(), x, **TOL)


def test_compiled_single_tensor_adam_step():
    """``torch.optim.Adam(foreach=False)`` compiled: the per-parameter path (addcmul_)."""
    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=1e-2, foreach=False)
    dev_opt = torch.optim.Adam(dev_model.parameters(), lr=1e-2, foreach=False, capturable=True)
    step = tpu_debug.compile(dev_opt.step)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        _same_grads(cpu_model, dev_model, lambda m: F.cross_entropy(m(x), y))
        cpu_opt.step()
        step()
    for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_prims_div_truncates_integers_and_divides_floats(dtype):
    """``prims.div`` (what decompositions of a truncating division leave, Mixtral's routing):
    C's integer division, toward zero, for negative operands too; true division of floats.
    The reference is ``torch.ops.prims.div`` on CPU."""
    import jax.numpy as jnp
    import numpy as np

    from tpu_debug.runtime.ops import prims
    from tpu_debug.runtime.ops.registry import lookup

    prims.register()
    a = torch.tensor([7, -7, 7, -7, 0, 9], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 4], dtype=dtype)
    low = lookup(torch.ops.prims.div.default)
    got = np.asarray(low.fn(jnp.asarray(a.numpy()), jnp.asarray(b.numpy())))
    # integer results are exact; float32 division is correctly rounded on both sides
    np.testing.assert_array_equal(got, torch.ops.prims.div.default(a, b).numpy())


def test_python_float_argument_that_changes_is_a_graph_input():
    """A Python float that differs between calls becomes a float64 0-d graph input on dynamo's
    recompile, cast to the other operand's dtype by ``prims.convert_element_type`` (Hugging Face
    attention's ``scaling`` when two models of different head sizes share a forward)."""
    fn = tpu_debug.compile(lambda x, s: (x * s).sum(-1))
    x = torch.randn(3, 5, dtype=torch.float32)
    for s in (0.125, 0.0883883, 0.3):
        out = fn(x.to("tpu"), s)
        assert out.dtype == torch.float32
        # one float32 multiply by the float32-rounded scale, then a 5-term sum: PyTorch on CPU does the same
        torch.testing.assert_close(out.cpu(), (x * s).sum(-1), rtol=1.3e-6, atol=1e-6)


def test_device_assertions_in_a_graph_are_checked():
    """``F.one_hot`` decomposes to ``_assert_async`` checks of its class values (Mixtral's
    router): in range the graph runs and matches CPU, out of range the call raises."""
    from tpu_debug.core.errors import DeviceAssertError

    fn = tpu_debug.compile(lambda idx: F.one_hot(idx, num_classes=5).sum(0))
    idx = torch.tensor([[0, 4], [2, 2], [1, 3]])
    torch.testing.assert_close(fn(idx.to("tpu")).cpu(), F.one_hot(idx, num_classes=5).sum(0))
    with pytest.raises(DeviceAssertError, match=r"device assertion failed: one_hot: Class values must be smaller"):
        fn(torch.tensor([[0, 5], [2, 2], [1, 3]]).to("tpu"))
    with pytest.raises(DeviceAssertError, match=r"one_hot: Class values must be non-negative"):
        fn(torch.tensor([[0, -1], [2, 2], [1, 3]]).to("tpu"))


class _Executions:
    """A probe recording each executable run: (mode, name)."""

    def __init__(self):
        self.runs = []

    def on_execute(self, mode, name, key, seconds):
        self.runs.append((mode, name))


def _make_optimizer(kind, params, device):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    # capturable on the device: the step counts stay there, in the program
    return torch.optim.AdamW(params, lr=1e-2, **({"capturable": True} if device == "tpu" else {}))


def _state_tensors(opt, params):
    return [(key, opt.state[p][key]) for p in params for key in sorted(opt.state[p])]


@pytest.mark.parametrize("zero_grad_inside", [True, False], ids=["zero_grad-inside", "zero_grad-outside"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_whole_training_step_is_one_program_with_params_and_state_donated(kind, zero_grad_inside):
    """Forward, ``loss.backward()`` and ``opt.step()`` (and ``zero_grad``) in one compiled
    function: each step runs one XLA program and nothing else, the program takes the
    parameters' and optimizer state's buffers (donated) and updates them in place, and
    parameters, gradients and optimizer state track PyTorch's on CPU."""
    from tpu_debug.runtime import probes
    from torch._dynamo.variables.constant import ConstantVariable

    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = _make_optimizer(kind, cpu_model.parameters(), "cpu")
    dev_opt = _make_optimizer(kind, dev_model.parameters(), "tpu")

    def train_step(model, opt, x, y):
        if zero_grad_inside:
            opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    g = torch.Generator().manual_seed(6)
    fragile = _no_fragile_elements(cpu_model)
    runs = []
    for i in range(6):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        xd, yd = x.to("tpu"), y.to("tpu")
        if not zero_grad_inside:
            cpu_opt.zero_grad()
            dev_opt.zero_grad()
        want = train_step(cpu_model, cpu_opt, x, y)
        probe = _Executions()
        probes.subscribe(probe)
        try:
            got = step(dev_model, dev_opt, xd, yd)
        finally:
            probes.unsubscribe(probe)
        runs.append(probe.runs)
        torch.testing.assert_close(got.cpu(), want, **TOL)
        for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-6, msg=f"{name} step {i}")
        _note_near_zero_grads(fragile, cpu_model, dev_model)
    # the first two steps compile (optimizer state created, then .grad no longer None);
    # from then on one program per step, nothing else
    for i, r in enumerate(runs[2:], 2):
        assert len(r) == 1 and r[0][0] == "compiled", f"step {i} ran {r}"
    assert "train_step" in runs[-1][0][1]
    params = list(dev_model.parameters())
    if kind == "sgd":  # SGD's update has no division: rounding stays rounding
        for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), params):
            torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)
    else:
        _assert_adam_params_close(cpu_model, dev_model, fragile, lr=1e-2, steps=len(runs), rtol=1e-4, atol=1e-5)
    cpu_state = _state_tensors(cpu_opt, list(cpu_model.parameters()))
    dev_state = _state_tensors(dev_opt, params)
    assert [k for k, _ in dev_state] == [k for k, _ in cpu_state]
    for (key, s_cpu), (_, s_dev) in zip(cpu_state, dev_state):
        assert s_dev.device.type == "tpu", key
        # moments: the gradients' rounding (~1e-7 relative), averaged; step counts exact
        torch.testing.assert_close(s_dev.cpu(), s_cpu.to(s_dev.dtype), rtol=1e-4, atol=1e-6, msg=key)
    # the program donates every parameter and state tensor, and its calls do donate them
    # (a buffer the previous step's outputs shared, SGD's first momentum, cannot be once)
    graph = next(g for g in compiled._graphs if g.graph_id == runs[-1][0][1])
    (entry,) = [e for e in graph.cache.values() if e.calls >= 4]
    assert len(entry.donated) == len(params) + len(dev_state)
    # the last steps' outputs and new state came through the static call's direct tail
    # (checked against PyTorch above)
    assert entry.tail
    undonated = entry.undonated
    for _ in range(2):
        if not zero_grad_inside:
            dev_opt.zero_grad()
        step(dev_model, dev_opt, xd, yd)
    assert entry.calls >= 6 and entry.undonated == undonated
    # tracing a p.grad = None left dynamo's shared None constant as it was
    assert ConstantVariable.create(None).source is None


def test_whole_training_step_on_the_tiny_llama_matches_pytorch():
    """The tiny Llama's step (embedding, RMSNorm, attention, AdamW) as one program: its
    loss and parameters after three steps as PyTorch's on CPU."""
    cfg = LlamaConfig()
    torch.manual_seed(0)
    cpu_model = TinyLlama(cfg)
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-3)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-3, capturable=True)

    def train_step(model, opt, tokens):
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    earlier = {g["graph_id"] for g in compiled.graph_stats()}  # other tests' programs stay cached
    g = torch.Generator().manual_seed(7)
    fragile = _no_fragile_elements(cpu_model)
    for _ in range(3):
        tokens = torch.randint(0, cfg.vocab, (1, 17), generator=g)
        want = train_step(cpu_model, cpu_opt, tokens)
        got = step(dev_model, dev_opt, tokens.to("tpu"))
        torch.testing.assert_close(got.cpu(), want, **TOL)
        _note_near_zero_grads(fragile, cpu_model, dev_model)
    _assert_adam_params_close(cpu_model, dev_model, fragile, lr=1e-3, steps=3, rtol=1e-4, atol=1e-5)
    kinds = {g["graph_id"].rsplit("/", 1)[-1] for g in compiled.graph_stats() if g["graph_id"] not in earlier}
    assert kinds == {"train_step"}  # no separate forward, backward or optimizer program


def test_global_optimizer_step_hooks_run_after_the_one_program():
    """A global optimizer-step post hook dynamo does not trace (a tracer's step counter)
    neither splits the compiled step nor goes unheard: it runs once per step, with the
    optimizer, after the step's single program."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from tpu_debug.runtime import probes

    model = _mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    heard = []
    handle = register_optimizer_step_post_hook(probes.hidden_from_dynamo(lambda o, args, kwargs: heard.append(o)))

    def train_step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    x, y = torch.randn(16, 8, device="tpu"), torch.randint(0, 4, (16,), device="tpu")
    try:
        for _ in range(3):
            step(x, y)
        probe = _Executions()
        probes.subscribe(probe)
        try:
            step(x, y)
        finally:
            probes.unsubscribe(probe)
    finally:
        handle.remove()
    assert len(probe.runs) == 1 and "train_step" in probe.runs[0][1], probe.runs
    assert len(heard) == 4 and all(o is opt for o in heard)
