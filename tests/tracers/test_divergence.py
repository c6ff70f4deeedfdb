"""Divergence against PyTorch on CPU and TPU numerics."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime import eager
from tpu_debug.runtime.config import RuntimeConfig
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.ops import registry
from tpu_debug.tracers.recording.divergence import compare, format_tolerances, parse_tolerances

import tpu_debug
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.models import tiny_llama

aten = torch.ops.aten
CFG = tiny_llama.LlamaConfig(layers=1, hidden=32, intermediate=64, vocab=64, max_seq=16)


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


SILU_LINE = _line_of(tiny_llama.MLP.forward, "F.silu(")


@contextlib.contextmanager
def wrong_lowering(op, make_wrong):
    """Register a deliberately wrong lowering for ``op`` (and drop what was built from the right one)."""
    right = registry._LOWERINGS[op]

    def forget():
        eager._plans.pop(op, None)
        for key in [k for k in eager._cache if k[0] is op]:
            del eager._cache[key]

    registry._LOWERINGS[op] = dataclasses.replace(right, fn=make_wrong(right.fn))
    forget()
    try:
        yield
    finally:
        registry._LOWERINGS[op] = right
        forget()


def _off_by_one_percent(fn):
    return lambda *args, **kwargs: fn(*args, **kwargs) * 1.01


def _block_step(model):
    tokens = torch.arange(16).reshape(2, 8).remainder(CFG.vocab).to("tpu")
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, CFG.vocab), tokens.reshape(-1))
    loss.backward()
    return loss


def _model():
    torch.manual_seed(0)
    return tiny_llama.TinyLlama(CFG).to("tpu")


# -- measures and tolerances ----------------------------------------------------------


def test_compare_measures():
    m = compare(np.float32([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0]), 1.3e-6, 1e-5)
    assert (m.exact, m.max_abs, m.max_rel, m.mismatched, m.numel) == (False, 0.5, 0.2, 1, 3)
    assert m.ulp == 2**21  # 2.0 and 2.5 are 2**21 float32 steps apart
    assert m.ratio == pytest.approx(0.5 / (1e-5 + 1.3e-6 * 2.5))
    assert compare(np.float32([1, 2]), torch.tensor([1.0, 2.0]), 1.3e-6, 1e-5).exact
    within = compare(np.float32([1.0]), torch.tensor([1.0 + 2**-23]), 1.3e-6, 1e-5)
    assert not within.exact and not within.over


def test_compare_nonfinite_dtype_and_off():
    m = compare(np.float32([np.nan, np.inf, 1.0]), torch.tensor([1.0, np.inf, 1.0]), 1.3e-6, 1e-5)
    assert (m.device_nonfinite, m.cpu_nonfinite, m.mismatched, m.max_abs) == (1, 0, 1, math.inf)
    assert m.device_has_nonfinite
    assert compare(np.float64([1.0]), torch.tensor([1.0]), 1e-7, 1e-7).dtype_mismatch
    off = compare(np.float32([5.0, np.nan]), torch.tensor([1.0, 1.0]), math.inf, math.inf)
    assert off.mismatched == 0 and off.device_nonfinite == 1
    # tolerances off: the allowed error is infinite everywhere, also where the CPU value is 0
    # (atol + rtol * |cpu| would be inf + inf * 0, NaN, which the run store cannot hold)
    zero = compare(np.float32([np.nan, 0.0]), torch.tensor([1.0, 0.0]), math.inf, math.inf)
    assert (zero.allowed, zero.ratio, zero.mismatched) == (math.inf, math.inf, 0)
    ints = compare(np.int64([1, 2]), torch.tensor([1, 3]), 0.0, 0.0)
    assert (ints.mismatched, ints.ulp) == (1, None)


def test_tolerances_parse_and_errors():
    table = parse_tolerances("float32=1e-4:1e-6, bfloat16=0.05")
    assert table[torch.float32] == (1e-4, 1e-6) and table[torch.bfloat16] == (0.05, 0.05)
    assert table[torch.float64] == (1e-7, 1e-7)
    assert parse_tolerances({"float16": (1e-2, 1e-3)})[torch.float16] == (1e-2, 1e-3)
    assert format_tolerances(parse_tolerances("off")) == "off"
    assert format_tolerances(parse_tolerances("float32=1e-4:1e-6")) == "float32=0.0001:1e-06"
    with pytest.raises(ValueError, match=r"tolerance for 'int8': not a floating dtype; use one of float64"):
        parse_tolerances("int8=1")
    with pytest.raises(ValueError, match=r"tolerance 'float32' is not dtype=rtol\[:atol\]"):
        parse_tolerances("float32")
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TOLERANCES='float32=x': tolerance for float32: 'x' is not rtol"):
        TraceConfig.from_env({"TPU_DEBUG_TOLERANCES": "float32=x"})
    with pytest.raises(
        ConfigError, match=r"^TPU_DEBUG_NUMERICS='gpu' is not a numerics mode; use one of cpu, tpu$"
    ):
        TraceConfig.from_env({"TPU_DEBUG_NUMERICS": "gpu"})
    cfg = TraceConfig.from_env(
        {"TPU_DEBUG_DIVERGENCE": "1", "TPU_DEBUG_NUMERICS": "tpu", "TPU_DEBUG_DIVERGENCE_SAMPLE": "3"}
    )
    assert (cfg.divergence, cfg.numerics, cfg.divergence_sample) == (True, "tpu", 3)


# -- eager ------------------------------------------------------------------------------


@pytest.mark.quick
def test_wrong_lowering_is_named_first_eager(logdir):
    model = _model()
    with (
        wrong_lowering(aten.silu.default, _off_by_one_percent),
        tpu_debug.trace(logdir=logdir, divergence=True) as session,
    ):
        _block_step(model)
    first = session.divergences.first()
    assert (first.name, first.measure, first.phase, first.mode) == ("silu", "local", "forward", "eager")
    assert first.location.file == tiny_llama.__file__ and first.location.line == SILU_LINE
    assert first.max_rel == pytest.approx(0.01, rel=1e-3) and first.mismatched > 0 and first.first
    local = session.divergences(measure="local", over=True)
    assert [e.name for e in local] == ["silu"]  # nothing else introduces error, forward or backward
    drift = session.divergences(measure="drift")
    assert drift and all(e.id >= first.id for e in drift)  # drift starts at silu and spreads
    summary = session.divergences.summary()
    assert summary.ops_compared > 100 and summary.over_local == 1
    assert not session.internal_errors()
    report = session.summary()
    assert ">> silu" in report and f"tiny_llama.py:{SILU_LINE}" in report


def test_backward_op_carries_its_forward_line(logdir):
    model = _model()
    with (
        wrong_lowering(aten.silu_backward.default, _off_by_one_percent),
        tpu_debug.trace(logdir=logdir, divergence=True) as session,
    ):
        _block_step(model)
    first = session.divergences.first()
    assert (first.name, first.phase, first.autograd_node) == ("silu_backward", "backward", "SiluBackward0")
    assert first.location is not None and first.location.line == SILU_LINE


def test_random_and_loaded_values_are_copied_not_compared(logdir):
    x = torch.randn(64, 64).to("tpu")
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        noise = torch.randn(64, 64, device="tpu")
        dropped = F.dropout(x, p=0.5, training=True)
        y = (dropped + noise).exp().sum()
        loaded = torch.ones(3).to("tpu") * 2
    assert torch.isfinite(y.cpu()) and loaded.cpu().tolist() == [2.0, 2.0, 2.0]
    summary = session.divergences.summary()
    assert summary.ops_copied >= 3  # randn, dropout, the host copy
    assert session.divergences(over=True) == []


def test_drift_follows_views_and_inplace_writes(logdir):
    base = torch.linspace(0.5, 2.0, 12).reshape(3, 4).to("tpu")
    with (
        wrong_lowering(aten.exp.default, _off_by_one_percent),
        tpu_debug.trace(logdir=logdir, divergence=True) as session,
    ):
        y = base.exp()  # 1 % off: the origin
        y[:, 1:].mul_(3.0)  # an in-place write through a view: exact locally, drifted
        z = y.t().sum(0)  # a view, then a reduction: still drifted
    events = session.divergences(over=True)
    local = [e.name for e in events if e.measure == "local"]
    drift = {e.name for e in events if e.measure == "drift"}
    assert local == ["exp"]
    assert {"exp", "mul.Tensor", "sum.dim_IntList"} <= drift or {
        "exp",
        "mul_.Tensor",
        "sum.dim_IntList",
    } <= drift
    assert z.shape == (3,)


def test_nan_origin_even_with_tolerances_off(logdir):
    x = torch.tensor([1.0, -1.0, 4.0]).to("tpu")
    with tpu_debug.trace(logdir=logdir, divergence=True, tolerances="off") as session:
        y = torch.sqrt(x - 0.5)  # NaN made here, from finite inputs
        z = y * 2  # propagates NaN: not an origin
        mask = torch.full((2,), float("-inf"), device="tpu")  # -inf on purpose: not an origin
    origin = session.divergences.nan_origin()
    assert (origin.name, origin.device_nonfinite, origin.nan_origin) == ("sqrt", 0, True)
    assert [e.name for e in session.divergences() if e.nan_origin] == ["sqrt"]
    assert session.divergences.first() is None  # nothing is over tolerance with tolerances off
    assert z.shape == mask.shape[:0] + (3,)


def test_nan_origin_with_a_zero_result_is_recorded_with_tolerances_off(logdir):
    x = torch.tensor([1.0, -1.0, 4.0]).to("tpu")
    with tpu_debug.trace(logdir=logdir, divergence=True, tolerances="off") as session:
        torch.log(x)  # NaN from log(-1), and log(1) == 0 exactly on both sides
    (origin,) = session.divergences()
    assert (origin.name, origin.nan_origin, origin.tolerance) == ("log", True, math.inf)
    assert session.divergences.summary().nan_origins == 1  # the run's summary was written
    assert not session.internal_errors()


def test_a_tracer_failure_does_not_break_the_program(logdir, monkeypatch):
    from tpu_debug.tracers.recording.divergence import op_checker as eager

    def broken(*args, **kwargs):
        raise RuntimeError("comparison exploded")

    monkeypatch.setattr(eager, "measure", broken)
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        y = (torch.ones(4).to("tpu") * 3).sum()
    assert y.item() == 12.0
    errors = session.internal_errors()
    assert errors and errors[0].where == "DivergenceTracer.on_op"
    assert errors[0].message == "RuntimeError: comparison exploded"


# -- compiled ---------------------------------------------------------------------------


def test_wrong_lowering_is_named_first_compiled(logdir):
    torch._dynamo.reset()
    model = tpu_debug.compile(_model())
    with (
        wrong_lowering(aten.silu.default, _off_by_one_percent),
        wrong_lowering(aten.silu_backward.default, _off_by_one_percent),
        tpu_debug.trace(logdir=logdir, divergence=True) as session,
    ):
        _block_step(model)
    torch._dynamo.reset()
    first = session.divergences.first()
    assert (first.mode, first.target, first.phase) == ("compiled", "silu", "forward")
    assert first.graph.endswith("/forward") and first.name.startswith("silu")
    assert first.location.file == tiny_llama.__file__ and first.location.line == SILU_LINE
    local = session.divergences(measure="local", over=True)
    assert [(e.target, e.phase, e.first) for e in local] == [
        ("silu", "forward", True),
        ("silu_backward", "backward", True),
    ]
    assert local[1].graph.endswith("/backward") and local[1].location.line == SILU_LINE
    summary = session.divergences.summary()
    assert summary.graphs_compared == 2 and summary.nodes_compared > 100  # forward and backward
    assert not session.internal_errors()


# -- TPU numerics -------------------------------------------------------------------------


def test_precision_mapping(monkeypatch):
    cfg = RuntimeConfig()
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert (cfg.effective_precision(), cfg.product_passes(), cfg.numerics_key()) == ("highest", 0, ())
    cfg.numerics = "tpu"  # PyTorch's default means a TPU's default: one bfloat16 pass
    assert (cfg.effective_precision(), cfg.product_passes(), cfg.numerics_key()) == (
        "medium",
        1,
        ("tpu", "medium"),
    )
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert (cfg.effective_precision(), cfg.product_passes()) == ("high", 3)
    cfg.matmul_precision = "highest"  # explicit (torch.tpu.precision.set) wins
    assert (cfg.effective_precision(), cfg.product_passes()) == ("highest", 0)
    with pytest.raises(ValueError, match=r"^TPU_DEBUG_NUMERICS='x' is not a numerics mode; use one of cpu, tpu$"):
        RuntimeConfig.from_env({"TPU_DEBUG_NUMERICS": "x"})
    assert RuntimeConfig.from_env({"TPU_DEBUG_MATMUL_PRECISION": "High"}).matmul_precision == "high"


def test_tpu_precision_sets_an_explicit_choice():
    saved = (runtime_config.matmul_precision, torch.get_float32_matmul_precision())
    try:
        torch.tpu.precision.set("high")
        assert runtime_config.matmul_precision == "high" and torch.tpu.precision.get() == "high"
        with pytest.raises(ValueError, match=r"precision 'low' is not one of highest, high, medium"):
            torch.tpu.precision.set("low")
    finally:
        runtime_config.matmul_precision = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def test_tpu_numerics_round_products_and_recompile(logdir):
    torch.manual_seed(0)
    a, b = torch.randn(32, 128), torch.randn(128, 16)
    exact = a.double() @ b.double()
    bf16 = a.bfloat16().double() @ b.bfloat16().double()
    da, db = a.to("tpu"), b.to("tpu")
    before = (da @ db).cpu()
    with tpu_debug.trace(logdir=logdir, divergence=True, numerics="tpu") as session:
        assert runtime_config.numerics == "tpu"
        tpu = (da @ db).cpu()
        runtime_config.matmul_precision = "high"
        three = (da @ db).cpu()
        runtime_config.matmul_precision = None
        # a product of values at an offset 1000 times their variation: bfloat16 keeps none of it
        ((da + 1000) @ db).cpu()
    assert runtime_config.numerics == "cpu"  # restored when the trace ends
    after = (da @ db).cpu()
    torch.testing.assert_close(before.double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # the cpu-numerics executable again
    torch.testing.assert_close(tpu.double(), bf16, rtol=1e-5, atol=1e-4)  # one bf16 pass, f32 sums

    def err(t):
        return float((t.double() - exact).abs().max())

    assert err(tpu) > 100 * err(three) > 0 and err(three) > err(before)
    # the first two products differ from CPU as the precision they emulate does: no divergence;
    # the third lost its rows' variation to bfloat16, which precision "highest" keeps
    (first,) = session.divergences(measure="local", over=True)
    assert (first.name, first.first, first.highest) == ("mm", True, True)
    assert session.divergences.summary().numerics == "tpu"


def test_tpu_numerics_convolution_backward_rounds_operands():
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    grad = torch.randn(2, 4, 6, 6)
    dx, dw = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    saved = runtime_config.numerics
    runtime_config.numerics = "tpu"
    try:
        F.conv2d(dx, dw).backward(grad.to("tpu"))
    finally:
        runtime_config.numerics = saved
    rx, rw = x.bfloat16().double().requires_grad_(), w.bfloat16().double().requires_grad_()
    F.conv2d(rx, rw).backward(grad.bfloat16().double())  # a TPU's backward: bf16 operands, f32 sums
    torch.testing.assert_close(dx.grad.cpu().double(), rx.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dw.grad.cpu().double(), rw.grad, rtol=1e-5, atol=1e-4)


# -- the pitfall example through the CLI ---------------------------------------------------


def test_bf16_drift_example_names_the_first_op_and_highest(tmp_path, capsys):
    from tpu_debug.cli import main

    script = ROOT / "examples" / "pitfalls" / "bf16_drift.py"
    code = main(["run", "--logdir", str(tmp_path / "runs"), "--divergence", "--numerics", "tpu", str(script)])
    out, err = capsys.readouterr()
    assert code == 0
    assert "relative difference" in out
    line = next(
        n
        for n, text in enumerate(script.read_text().splitlines(), 1)
        if text.strip() == "hidden = self.inp(x)"
    )
    assert f"first       addmm at {script}:{line} in Regressor.forward" in err
    assert ">> addmm" in err and "vanishes" in err
    with tpu_debug.open_run(logdir=tmp_path / "runs") as session:
        first = session.divergences.first()
        assert (first.name, first.location.line, first.highest) == ("addmm", line, True)
        assert session.metadata().options["numerics"] == "tpu"
    assert runtime_config.numerics == "cpu"
