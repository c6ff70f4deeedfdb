"""PyTorch's ModuleInfo database (``module_db``) on `tpu`, checked against PyTorch on CPU.

For every ``torch.nn`` module of ``module_db`` that runs in float32, and for each of its
module inputs (constructor and forward arguments), in training and in evaluation mode:
the module is built on CPU from a fixed seed and built again the same way for `tpu`
(constructor tensors moved there, then ``.to("tpu")``), so both hold the same weights. Each
runs the forward on its copy of the inputs, then the backward of the sum of its floating
outputs. What is compared with ``torch.testing.assert_close``: the outputs, the buffers
after the step (BatchNorm's running statistics), and the gradients of every parameter and
of every input. An error CPU raises (forward or backward) must be an error on `tpu` too.

Tolerances: float32 at assert_close's defaults (rtol 1.3e-6, atol 1e-5), and where a value
is outside them it still passes when it is as close to the exact result as CPU's own, the
criterion of the OpInfo harness (``as_accurate_as_cpu``): the module run on CPU in float64
from the same weights and inputs stands for the exact value, and the `tpu` value may be off
it by twice CPU's error plus the usual tolerance. A module sums over many products (a
convolution, an LSTM's gates through time, a loss's mean), and XLA and PyTorch order those
sums differently, so results differ in their last bits by an amount that grows with the
length of the sum; a wrong result is off by far more.

Randomness: ``module_db`` gives each random module its samples (FractionalMaxPool's
``_random_samples``) and builds the transformer layers with ``dropout=0.0``, so the forward
draws nothing and the values can be compared. Both modules are built after the same
``torch.manual_seed``, on CPU, so random initial weights are equal. If a CPU forward draws
random numbers all the same (its generator's state moved), its values cannot equal a `tpu`
draw: that input is checked for shapes, dtypes and the same non-finite positions only.

Modes: "eager" (op by op), "lazy" (``DEFER_AND_FUSE``: the forward and the backward are
recorded and run as fused programs) and "compiled" (the module through ``torch.compile``
with the tpu_debug backend; the backward runs the AOTAutograd backward program).

One test id per (module, train|eval, mode). The CI tier checks the first module input of
every module eagerly (training mode, and evaluation mode where they differ) and of every
``COMPILED_CI_STRIDE``-th module lazily and compiled; the full sweep runs every input in
both modes of every module, in all three modes, counting every input (a failure does not
stop the test; its first failure is the reason given). Expected failures live in
``moduleinfo_expectations.py``, each with its reason; xfails are strict.

Commands::

    # CI tier
    python -m pytest tests/runtime/test_moduleinfo.py -n 2 -q
    # full sweep: every module input
    TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_moduleinfo.py -n 2 -q
    # record outcomes (JSON lines) for docs/op_coverage.md
    TPU_DEBUG_MODULEINFO_RESULTS=modules.jsonl python -m pytest tests/runtime/test_moduleinfo.py -n 2 -q
    python scripts/op_coverage.py --module-results modules.jsonl
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
import traceback
from collections.abc import Callable

import pytest
import torch
from moduleinfo_expectations import EXPECTATIONS, TOLERANCES, expectation, tolerance
from test_opinfo import (
    _as_accurate_as_cpu,
    _bound_executable_cache,
    _close_summary,
    _first_line,
    _GraphCount,
    _guard_latency_unmeasured,
    _tensors,
    _upcast,
)
from torch.nn.utils.rnn import PackedSequence
from torch.testing._internal.common_modules import module_db

import tpu_debug  # noqa: F401 - registers the tpu device

# module inputs hit deprecated arguments (size_average, ...) on CPU as on tpu
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FULL = os.environ.get("TPU_DEBUG_OPINFO_FULL", "") not in ("", "0")
RESULTS = os.environ.get("TPU_DEBUG_MODULEINFO_RESULTS") or None
SEED = 1234

# The CI tier runs lazy and compiled mode on every COMPILED_CI_STRIDE-th module's first input:
# what those modes add to eager (pending values, the fused forward and backward programs;
# dynamo's capture, AOTAutograd's joint graph) is the same machinery for every module, and the
# module math under it is the eager lowerings', which the eager tier checks on every module.
COMPILED_CI_STRIDE = 6


# ---- the parameter space -------------------------------------------------------------


def _float32(info) -> bool:
    return torch.float32 in info.supported_dtypes("cpu")


def cases():
    """Every (ModuleInfo, training, mode) the harness runs, in module_db order."""
    infos = [m for m in module_db if _float32(m)]
    for i, info in enumerate(infos):
        for training in (True, False):
            for mode in MODES:
                if not FULL:
                    if training is False and not info.train_and_eval_differ:
                        continue
                    if mode != "eager" and i % COMPILED_CI_STRIDE:
                        continue
                yield info, training, mode


def _train_name(training: bool) -> str:
    return "train" if training else "eval"


def _params():
    params = []
    for info, training, mode in cases():
        marks = ()
        exp = expectation(info.name, _train_name(training), mode, full=FULL)
        if exp is not None:
            kind, reason = exp
            marks = (pytest.mark.skip(reason=reason),) if kind == "skip" else (
                pytest.mark.xfail(reason=reason, strict=kind != "flaky"),)
        params.append(pytest.param(info, training, mode, id=f"{info.name}-{_train_name(training)}-{mode}",
                                   marks=marks))
    return params


# ---- moving module inputs ---------------------------------------------------------------


def _leaf(t: torch.Tensor, device: str) -> torch.Tensor:
    """A copy of ``t`` on ``device`` as a leaf that keeps ``requires_grad``: its ``.grad`` is read."""
    out = t.detach().to(device) if device != "cpu" else t.detach().clone()
    return out.requires_grad_(t.requires_grad)


def _move(v, device: str):
    """Module arguments on ``device``; tensors become leaves (a PackedSequence's data too, its
    ``batch_sizes`` stays on CPU, where PyTorch keeps it on every device)."""
    if isinstance(v, PackedSequence):
        idx = (None if i is None else i.to(device) for i in (v.sorted_indices, v.unsorted_indices))
        return PackedSequence(_leaf(v.data, device), v.batch_sizes, *idx)
    if isinstance(v, torch.Tensor):
        return _leaf(v, device)
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_move(x, device) for x in v)
    if isinstance(v, dict):
        return {k: _move(x, device) for k, x in v.items()}
    return v


def _to_double(v):
    if isinstance(v, PackedSequence):
        return PackedSequence(_upcast(v.data).detach().requires_grad_(v.data.requires_grad), v.batch_sizes,
                              v.sorted_indices, v.unsorted_indices)
    if isinstance(v, torch.Tensor):
        return _upcast(v).detach().requires_grad_(v.requires_grad)
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_to_double(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_double(x) for k, x in v.items()}
    return v


# ---- one run of one module input ----------------------------------------------------------


def _build(info, ctor, device: str) -> torch.nn.Module:
    """The module, its random initial weights drawn on CPU after the same seed on every device."""
    args, kwargs = _move((ctor.args, ctor.kwargs), device)
    torch.manual_seed(SEED)
    module = info.module_cls(*args, **kwargs)
    return module if device == "cpu" else module.to(device)


def _eager(module, device):
    return module


def _lazy_mode():
    return torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)


def _compiled(module, device):
    if device == "cpu":
        return module
    torch._dynamo.reset()
    return torch.compile(module, backend=_GraphCount.backend, dynamic=False)


# mode -> how the tpu module is called (the CPU reference always runs eagerly)
MODES: dict[str, Callable] = {"eager": _eager, "lazy": _eager, "compiled": _compiled}


class Outcome:
    """What one run produced: (label, value) pairs in a fixed order, or the error it raised."""

    def __init__(self) -> None:
        self.values: list[tuple[str, torch.Tensor | None]] = []
        self.error: BaseException | None = None
        self.stage = "forward"
        self.drew_random = False
        self.initial: dict | None = None  # a lazy module's materialized state, shared with the others


def _floating_outputs(out) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]


def _run(info, module_input, training: bool, device: str, mode: str, *, double: bool = False,
         initial: dict | None = None) -> Outcome:
    """Build, forward, backward of the outputs' sum; everything compared is collected."""
    res = Outcome()
    module = _build(info, module_input.constructor_input, device)
    args, kwargs = _move((module_input.forward_input.args, module_input.forward_input.kwargs), device)
    if info.is_lazy:
        # a lazy module draws its weights when its first forward gives it shapes, on its own
        # device: materialize (module_db's lazy modules are convolutions, whose forward moves no
        # buffer), then load the CPU module's weights
        with torch.no_grad():
            module(*args, **kwargs)
        if initial is not None:
            module.load_state_dict(initial)
        res.initial = copy.deepcopy(module.state_dict())
    if double:
        module = module.double()
        args, kwargs = _to_double((args, kwargs))
    module.train(training)
    call = MODES[mode](module, device)
    lazy = mode == "lazy" and device != "cpu"
    compiled = mode == "compiled" and device != "cpu"
    torch.manual_seed(SEED)
    state = torch.get_rng_state()
    try:
        with _lazy_mode() if lazy else contextlib.nullcontext(), \
                _guard_latency_unmeasured() if compiled else contextlib.nullcontext():
            out = call(*args, **kwargs)
            res.drew_random = device == "cpu" and not torch.equal(state, torch.get_rng_state())
            res.values += [(f"output {i}", t) for i, t in enumerate(_tensors(out))]
            res.stage = "backward"
            grads = _floating_outputs(out)
            if grads:
                sum(t.sum() for t in grads).backward()
    except Exception as exc:  # noqa: BLE001 - compared with what the other device does
        res.error = exc
        return res
    res.values += [(f"buffer {n}", b) for n, b in module.named_buffers()]
    if grads:
        res.values += [(f"grad of parameter {n}", p.grad) for n, p in module.named_parameters()]
        res.values += [(f"grad of input {i}", t.grad) for i, t in enumerate(_tensors((args, kwargs)))
                       if t.requires_grad]
    return res


# ---- comparison ---------------------------------------------------------------------------------


class Mismatch(AssertionError):
    """The first line is the one-line reason; details follow."""


def _compare_one(label, actual, expected, exact, *, random: bool, tol: dict):
    if (actual is None) != (expected is None):
        raise Mismatch(f"{label}: {'None' if actual is None else 'a tensor'}, CPU gives "
                       f"{'None' if expected is None else 'a tensor'}")
    if actual is None:
        return
    if actual.device.type != "tpu":
        raise Mismatch(f"{label}: a {actual.device.type} tensor, expected a tpu tensor")
    actual = actual.detach().cpu()
    expected = expected.detach()
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise Mismatch(f"{label}: {str(actual.dtype)[6:]}{list(actual.shape)}, "
                       f"CPU gives {str(expected.dtype)[6:]}{list(expected.shape)}")
    if random:
        if not torch.equal(actual.isfinite(), expected.isfinite()):
            raise Mismatch(f"{label}: non-finite values where CPU has finite ones (a random forward)")
        return
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
    except AssertionError as exc:
        ref = exact() if exact is not None else None
        if ref is not None and ref.shape == expected.shape and _as_accurate_as_cpu(actual, expected, ref, tol or None):
            return
        raise Mismatch(f"{label}: {_close_summary(str(exc))}\n{exc}") from None


def check_input(info, module_input, training: bool, mode: str) -> None:
    """One module input: CPU and tpu runs agree (values, or both raise)."""
    expected = _run(info, module_input, training, "cpu", "eager")
    actual = _run(info, module_input, training, "tpu", mode, initial=expected.initial)
    if expected.error is not None:
        if actual.error is None:
            raise Mismatch(f"{expected.stage}: CPU raises {_first_line(expected.error)}; tpu returns a result")
        return
    if actual.error is not None:
        raise actual.error
    exact_values: list | None = None

    def exact(i):
        nonlocal exact_values
        if exact_values is None:
            ref = _run(info, module_input, training, "cpu", "eager", double=True, initial=expected.initial)
            exact_values = [v for _, v in ref.values] if ref.error is None else []
        return exact_values[i] if i < len(exact_values) else None

    labels = [lbl for lbl, _ in expected.values]
    if labels != [lbl for lbl, _ in actual.values]:
        raise Mismatch(f"results {[lbl for lbl, _ in actual.values]}, CPU gives {labels}")
    for i, ((label, a), (_, e)) in enumerate(zip(actual.values, expected.values)):
        _compare_one(label, a, e, lambda i=i: exact(i), random=expected.drew_random, tol=tolerance(info.name))


# ---- results file ----------------------------------------------------------------------------


def _record(info, training, mode, *, start, cpu_start, inputs, failures):
    if RESULTS is None:
        return
    row = {
        "module": info.name, "training": training, "mode": mode, "tier": "full" if FULL else "ci",
        "outcome": "failed" if failures else "passed", "inputs": inputs, "failed_inputs": len(failures),
        "error": failures[0][1] if failures else None, "failed_input": failures[0][0] if failures else None,
        "seconds": round(time.perf_counter() - start, 3),
        # the process's CPU time (XLA's compile threads included): on a shared machine it
        # says what the test costs better than the wall time
        "cpu_seconds": round(time.process_time() - cpu_start, 3),
    }
    if mode == "compiled":
        row["graphs"] = _GraphCount.graphs
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


# ---- the test --------------------------------------------------------------------------------


@pytest.mark.parametrize(("info", "training", "mode"), _params())
def test_moduleinfo(info, training, mode):
    start, cpu_start = time.perf_counter(), time.process_time()
    _GraphCount.graphs = 0
    torch.manual_seed(SEED)  # module inputs are drawn at random: the same ones in every run
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                     training=training)
    if not FULL:
        inputs = inputs[:1]
    failures: list[tuple[int, str, BaseException]] = []
    for i, module_input in enumerate(inputs):
        try:
            check_input(info, module_input, training, mode)
        except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
            failures.append((i, _first_line(exc).removeprefix("Mismatch: "), exc))
        _bound_executable_cache()
    if mode == "compiled":
        torch._dynamo.reset()
    _record(info, training, mode, start=start, cpu_start=cpu_start, inputs=len(inputs), failures=failures)
    if failures:
        i, reason, exc = failures[0]
        details = "".join(traceback.format_exception(exc, limit=-12))
        pytest.fail(f"{len(failures)} of {len(inputs)} inputs fail; input {i}: {reason}\n\n{details}",
                    pytrace=False)


def test_expectation_keys_name_real_cases():
    """Every entry in moduleinfo_expectations.py names a (module, train|eval, mode) of the full sweep."""
    names = {m.name for m in module_db if _float32(m)}
    stale = [key for key in EXPECTATIONS if key[0] not in names or key[1] not in ("train", "eval", "*")
             or key[2] not in (*MODES, "*")]
    stale += [name for name in TOLERANCES if name not in names]
    assert not stale, f"expectations for cases the harness does not run: {stale}"
