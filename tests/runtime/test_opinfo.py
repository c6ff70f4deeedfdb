"""PyTorch's OpInfo database (``op_db``) on `tpu`, checked against PyTorch on CPU.

For every OpInfo and dtype (float32, int64, bool, bfloat16) the op supports on
CPU, each sample input runs on CPU and, moved to `tpu`, through the eager
runtime; results come back and are compared with ``torch.testing.assert_close``
(values, strict dtypes, NaNs equal). A floating result outside those tolerances
still passes when it is as close to the exact result as CPU's own: the op run
on CPU in float64 (floating inputs upcast) stands for the exact value, and the
`tpu` result may be off it by CPU's largest error there, twice, plus the usual
tolerance. Both are roundings of the same value (XLA and PyTorch accumulate in
different orders, and the order depends on the machine: SIMD width, thread
partitioning), so this is a criterion from the numerics, not from one machine's
figures; a wrong result is off by far more than rounding. The in-place variant (also applied through
a view, so a write that misses the base is caught) and ``out=`` are checked the
same way, and so is every argument after the call: what an op mutates must
match CPU. Random ops are checked for shape, dtype and range only.

Modes: "eager" (op by op, every dtype above) and "compiled" (each call through
``torch.compile`` with the tpu_debug backend, float32): the same checks
on whole-graph programs, with a count of the graphs dynamo handed to the backend.

One test id per (op[.variant], dtype, mode). Expected failures and per-op
tolerance widenings live in ``opinfo_expectations.py``, each with its reason;
xfails are strict, so an op that starts passing is noticed.

Commands::

    # CI tier: the first 2 samples of each (op, float32) eagerly, the first one of the other
    # dtypes and compiled (in-place forms compiled on every 4th op); in-place through a view
    # on the first
    python -m pytest tests/runtime/test_opinfo.py -n 2 -q
    # full sweep: every sample
    TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_opinfo.py -n 2 -q
    # record outcomes (JSON lines) for docs/op_coverage.md and the expectations table
    TPU_DEBUG_OPINFO_RESULTS=opinfo.jsonl python -m pytest tests/runtime/test_opinfo.py -n 2 -q
    python scripts/op_coverage.py --results opinfo.jsonl
    python tests/runtime/make_opinfo_expectations.py opinfo.jsonl
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import sys
import time
import traceback
import unittest
from collections.abc import Callable

import jax
import pytest
import torch
from opinfo_expectations import EXPECTATIONS, TOLERANCES, ci_samples, expectation, tolerance
from torch.testing._internal import common_utils
from torch.testing._internal.opinfo import core as opinfo_core
from torch.testing._internal.common_methods_invocations import op_db
from tpu_debug.runtime import cache_counts, eager

import tpu_debug  # noqa: F401 - registers the tpu device
from torch._dynamo.backends.registry import lookup_backend



def _test_fn_on_stack() -> Callable | None:
    """``common_utils.extract_test_fn`` without ``inspect.stack()``: the same walk for a unittest
    test method's function (here there is none: these are pytest functions, so None), frame by
    frame. ``inspect.stack()`` reads the source around every frame of the stack, and
    ``op.sample_inputs`` asks twice per call: half of this module's CPU went there."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, unittest.TestCase):
            *_, cls_name, test_name = owner.id().rsplit(".", 2)
            if cls_name == type(owner).__name__ and test_name.startswith("test"):
                return getattr(owner, test_name).__func__
        frame = frame.f_back
    return None


common_utils.extract_test_fn = opinfo_core.extract_test_fn = _test_fn_on_stack

# samples deliberately hit deprecated paths (resized out=, ...) on CPU as on tpu
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FULL = os.environ.get("TPU_DEBUG_OPINFO_FULL", "") not in ("", "0")
RESULTS = os.environ.get("TPU_DEBUG_OPINFO_RESULTS") or None

DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16)


def _eager(fn: Callable) -> Callable:
    return fn


class _GraphCount:
    """How many graphs dynamo handed to the tpu_debug backend during one test:
    a compiled-mode case that passes with none ran eagerly after dynamo gave up on it."""

    graphs = 0

    @classmethod
    def backend(cls, gm, example_inputs, **kwargs):
        cls.graphs += 1
        return lookup_backend("tpu_debug")(gm, example_inputs, **kwargs)


def _compiled(fn: Callable) -> Callable:
    """``fn`` through ``torch.compile`` with the tpu_debug backend, from a clean dynamo state.

    Each call gets a fresh dynamo cache: samples differ in shapes and arguments, and
    dynamo's per-function recompile limit would otherwise send later samples to eager.
    """
    fn = getattr(fn, "op", fn)  # an OpInfo: its callable, not OpInfo.__call__

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    torch._dynamo.reset()
    compiled = torch.compile(call, backend=_GraphCount.backend, dynamic=False)

    def run(*args, **kwargs):
        with _seeding_dynamo_can_trace(), _guard_latency_unmeasured():
            return compiled(*args, **kwargs)

    return run


def _no_latency(*args) -> float:
    return 0.0


@contextlib.contextmanager
def _guard_latency_unmeasured():
    """Dynamo times each new guard set once for its logs (``profile_guard_manager``: a CPU-cache
    flush, then one evaluation), about 25 ms of CPU per compile, once per sample here since
    each call starts from a clean dynamo state. The figure goes to a debug log and a metric
    nothing here reads; the guards are still built and checked on the frame they were made for
    (dynamo's ``guard_manager.check`` before the profiling), so the check is unchanged."""
    from torch._dynamo import guards

    saved = guards.profile_guard_manager
    guards.profile_guard_manager = _no_latency
    try:
        yield
    finally:
        guards.profile_guard_manager = saved


def _seeded(op, *args, **kwargs):
    torch.manual_seed(42)
    return op(*args, **kwargs)


_seed_wrapping_modules: tuple[int, list] = (-1, [])


def _modules_with_wrapper_set_seed() -> list:
    """The ``torch.testing._internal`` modules holding a ``wrapper_set_seed``, found again only
    when a module was imported since the last search (a walk of every module, per sample)."""
    global _seed_wrapping_modules
    count, modules = _seed_wrapping_modules
    if count != len(sys.modules):
        modules = [m for name, m in list(sys.modules.items())
                   if name.startswith("torch.testing._internal") and getattr(m, "wrapper_set_seed", None) is not None]
        _seed_wrapping_modules = (len(sys.modules), modules)
    return modules


@contextlib.contextmanager
def _seeding_dynamo_can_trace():
    """OpInfo wraps random ops in ``wrapper_set_seed``, whose ``freeze_rng_state`` saves
    the RNG states under ``no_dispatch()``: dynamo gives up on the whole call and runs it
    eagerly. Compiled, the op is seeded without the freeze (values are range-checked)."""
    modules = _modules_with_wrapper_set_seed()
    saved = [(m, m.wrapper_set_seed) for m in modules]
    for m in modules:
        m.wrapper_set_seed = _seeded
    try:
        yield
    finally:
        for m, original in saved:
            m.wrapper_set_seed = original


def _lazy(fn: Callable) -> Callable:
    """``fn`` in lazy fused eager mode (``DEFER_AND_FUSE``): its ops are recorded, and run as
    one fused program when the call returns (leaving the mode materializes what is pending)."""

    def run(*args, **kwargs):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            return fn(*args, **kwargs)

    return run


# mode -> how the op is called on tpu tensors; one test id per (op, dtype, mode)
MODES: dict[str, Callable[[Callable], Callable]] = {"eager": _eager, "compiled": _compiled, "lazy": _lazy}

# mode -> the dtypes it runs. Compiled mode checks the graph path (AOTAutograd, decompositions,
# one XLA program, outputs and mutations written back) on float32; the op math under it is the
# eager lowerings', which the eager pass checks in every dtype.
MODE_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "eager": (torch.float32, torch.int64, torch.bool, torch.bfloat16),
    "compiled": (torch.float32,),
    # lazy mode records the eager lowerings and runs them fused: what it adds is the graph
    # (pending values, views and writes as graph steps, one program), checked on a
    # floating and an integer dtype
    "lazy": (torch.float32, torch.int64),
}


# ---- random ops: shape, dtype and range only -------------------------------------


def _arg(sample, i, name, default):
    if name in sample.kwargs:
        return sample.kwargs[name]
    return sample.args[i] if len(sample.args) > i else default


def _in(lo, hi):
    return lambda sample, out: (lo, hi)


def _dropout_range(sample, out):
    x = sample.input
    p = _arg(sample, 0, "p", 0.5)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    if not _arg(sample, 1, "training", True):
        scale = 1.0  # evaluation mode: the input itself
    lo, hi = (x.min().item(), x.max().item()) if x.numel() else (0.0, 0.0)
    return min(0.0, lo * scale), max(0.0, hi * scale)


def _rrelu_range(sample, out):
    x = sample.input
    lower = _arg(sample, 0, "lower", 1 / 8)
    if not x.numel():
        return None
    lo, hi = x.min().item(), x.max().item()
    return min(lo, lo * lower), max(hi, 0.0)


def _multinomial_range(sample, out):
    return 0, sample.input.shape[-1] - 1


def _randint_range(sample, out):
    # randint_like(x, high) / randint_like(x, low, high); randint(high, size) / randint(low, high, size)
    nums = [a for a in (sample.input, *sample.args) if isinstance(a, int) and not isinstance(a, bool)]
    if len(nums) == 1:
        return 0, nums[0] - 1
    return nums[0], nums[1] - 1


# op name (variant) -> None (shape and dtype only) or f(sample, cpu_result) -> (lo, hi)
RANDOM_OPS: dict[str, Callable | None] = {
    "bernoulli": _in(0, 1),
    "cauchy": None,
    "exponential": _in(0, math.inf),
    "geometric": _in(1, math.inf),
    "log_normal": _in(0, math.inf),
    "multinomial": _multinomial_range,
    "normal": None,
    "normal.in_place": None,
    "normal.number_mean": None,
    "rand_like": None,  # op_db's rand_like OpInfo calls torch.randn_like
    "randint": _randint_range,
    "randint_like": _randint_range,
    "randn": None,
    "randn_like": None,
    "uniform": lambda s, out: (_arg(s, 0, "from", 0.0), _arg(s, 1, "to", 1.0)),
    "nn.functional.dropout": _dropout_range,
    "nn.functional.dropout2d": _dropout_range,
    "nn.functional.dropout3d": _dropout_range,
    "nn.functional.alpha_dropout": None,
    "nn.functional.feature_alpha_dropout.with_train": None,
    "nn.functional.rrelu": _rrelu_range,
    # pooling regions drawn at random: each output is one of the input's values
    "nn.functional.fractional_max_pool2d": lambda s, out: _input_range(s, out),
    "nn.functional.fractional_max_pool3d": lambda s, out: _input_range(s, out),
}


def _input_range(sample, out):
    if not out.is_floating_point() or not sample.input.numel():
        return None  # indices
    return sample.input.min().item(), sample.input.max().item()


# op name -> whether one sample is random (attention with dropout): those samples are
# checked for shape, dtype and finiteness only, the op's other samples for values
RANDOM_SAMPLES: dict[str, Callable] = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    "nn.functional.multi_head_attention_forward": lambda s: s.kwargs.get("training", True)
    and any(isinstance(a, float) and a > 0 for a in s.args),
}


def _never(sample) -> bool:
    return False


# ---- outputs that are unique only up to sign ----------------------------------------


def _sign_fixed(m: torch.Tensor, vec_dim: int) -> torch.Tensor:
    """Each vector along ``vec_dim`` flipped so its largest-magnitude entry is positive."""
    if m.numel() == 0:
        return m
    idx = m.abs().argmax(dim=vec_dim, keepdim=True)
    sign = torch.gather(m, vec_dim, idx).sign()
    return m * torch.where(sign == 0, torch.ones_like(sign), sign)


def _svd_canonical(out, *, vh: bool):
    # singular vectors: each up to sign; beyond k = len(S) (full_matrices) any orthonormal basis
    u, s, v = out
    k = s.shape[-1]
    v = _sign_fixed(v[..., :k, :], -1) if vh else _sign_fixed(v[..., :, :k], -2)
    return _sign_fixed(u[..., :, :k], -2), s, v


# op name (variant) -> the output in a canonical form; CPU and tpu results are compared in it
CANONICAL_OUTPUTS: dict[str, Callable] = {
    "svd": lambda out: _svd_canonical(out, vh=False),
    "svd_lowrank": lambda out: _svd_canonical(out, vh=False),
    "pca_lowrank": lambda out: _svd_canonical(out, vh=False),
    "linalg.svd": lambda out: _svd_canonical(out, vh=True),
    "linalg.eigh": lambda out: (out[0], _sign_fixed(out[1], -2)),
}


# ---- the parameter space -------------------------------------------------------------


def op_id(op) -> str:
    """``name`` or ``name.variant``: the op part of a test id and of expectation keys."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# The CI tier runs lazy mode on float32 for every LAZY_CI_STRIDE-th op of op_db. Lazy mode
# records the eager lowerings the eager pass checks in every dtype; what it adds (pending
# values, views and in-place writes as graph steps, one fused program per check) is the same
# machinery for every op, so a spread of ops exercises it within the CI time budget. The
# full tier runs every op in both of MODE_DTYPES["lazy"].
LAZY_CI_STRIDE = 4
# The CI tier compiles every op's call and its out= form, and its in-place forms on every
# INPLACE_COMPILED_CI_STRIDE-th op: what a compiled in-place call adds to the eager check of
# the same in-place form (an input mutation written back after the graph, through a view
# too) is the same machinery for every op, while the call itself may reach other lowerings
# (AOTAutograd's decompositions). The full tier compiles every form of every op.
INPLACE_COMPILED_CI_STRIDE = 4
_OP_INDEX = {id(op): i for i, op in enumerate(op_db)}


def cases():
    """Every (op, dtype, mode) the harness runs, in op_db order."""
    for i, op in enumerate(op_db):
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype in supported:
                for mode in MODES:
                    if dtype not in MODE_DTYPES[mode]:
                        continue
                    if mode == "lazy" and not FULL and (dtype != torch.float32 or i % LAZY_CI_STRIDE):
                        continue
                    yield op, dtype, mode


def _params():
    params = []
    for op, dtype, mode in cases():
        marks = ()
        exp = expectation(op.name, op.variant_test_name, dtype_name(dtype), mode, full=FULL)
        if exp is not None:
            kind, reason = exp
            if kind == "skip":
                marks = (pytest.mark.skip(reason=reason),)
            else:  # "flaky": fails in some processes, passes in others (see opinfo_expectations)
                marks = (pytest.mark.xfail(reason=reason, strict=kind != "flaky"),)
        params.append(pytest.param(op, dtype, mode, id=f"{op_id(op)}-{dtype_name(dtype)}-{mode}", marks=marks))
    return params


# ---- moving values between devices -------------------------------------------------

def _compact(t: torch.Tensor) -> bool:
    if t.layout != torch.strided:
        return True
    return t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes


def _same_layout(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t`` on ``device`` as a view of a copy of its whole storage: same strides and offset.

    A few samples are views into larger storage (``as_strided`` partial views,
    non-contiguous inputs); ``.to()`` would compact them and test something else.
    """
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    flat = flat.detach().clone() if device == "cpu" else flat.detach().to(device)
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


def _to_tpu(v):
    """Tensors to tpu (same layout); a ``cpu`` device argument (factories, ``to``) becomes ``tpu``."""
    if isinstance(v, torch.Tensor):
        return v.detach().to("tpu") if _compact(v) else _same_layout(v.detach(), "tpu")
    if isinstance(v, torch.device) and v.type == "cpu":
        return torch.device("tpu")
    if isinstance(v, str) and v == "cpu":
        return "tpu"
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_to_tpu(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_tpu(x) for k, x in v.items()}
    return v


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone() if _compact(v) else _same_layout(v.detach(), "cpu")
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_clone(x) for x in v)
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


class _OnCpu(Exception):
    pass


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        return v.detach().to("meta")
    if (isinstance(v, torch.device) and v.type == "tpu") or (isinstance(v, str) and v == "tpu"):
        return "meta"
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_meta(x) for k, x in v.items()}
    return v


def _cpu_result_expected(fn, dev_args) -> bool:
    """Whether PyTorch itself puts a result on CPU for these arguments (``linspace`` of 0-d
    tensors without ``device=``, say): the same call on meta tensors returns a CPU tensor."""
    try:
        out = _call(fn, *_to_meta(dev_args))
    except Exception:  # noqa: BLE001 - no meta kernel: keep expecting tpu
        return False
    return any(t.device.type == "cpu" for t in _tensors(out))


def _to_host(v):
    """A tpu result back on CPU; a tensor result left on CPU is an error (the op escaped tpu)."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "tpu":
            raise _OnCpu(f"returned a {v.device.type} tensor, expected a tpu tensor")
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return tuple(_to_host(x) for x in v) if hasattr(v, "_fields") else type(v)(_to_host(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_host(x) for k, x in v.items()}
    return v


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


# ---- comparison ----------------------------------------------------------------------


class Mismatch(AssertionError):
    """The first line is the one-line reason; details follow."""


def _root_cause(exc: BaseException) -> BaseException:
    """The error under dynamo's wrappers: BackendCompilerFailed carries the backend's
    exception, TorchRuntimeError ("when making fake tensor call") the op's."""
    inner = getattr(exc, "inner_exception", None)
    if inner is not None:
        return _root_cause(inner)
    if type(exc).__name__ == "TorchRuntimeError":
        if exc.__cause__ is not None:
            return _root_cause(exc.__cause__)
        got = re.search(r"got (\w+)\((.*)\)$", str(exc), re.MULTILINE)
        if got:  # "Dynamo failed to run FX node with fake tensors: ... got RuntimeError('...')"
            return RuntimeError(f"with fake tensors: {got.group(1)}: {got.group(2).strip(chr(39))}")
    return exc


def _first_line(exc: BaseException) -> str:
    exc = _root_cause(exc)
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}".rstrip(": ")


def _close_summary(msg: str) -> str:
    """assert_close's message as one line: what differs and by how much."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    head = lines[0] if lines else "values differ"
    if head.startswith(("Tensor-likes are not", "Scalars are not")):
        mism = next((ln for ln in lines if ln.startswith("Mismatched elements")), "")
        absd = next((ln for ln in lines if ln.startswith("Greatest absolute difference")), "")
        reld = next((ln for ln in lines if ln.startswith("Greatest relative difference")), "")
        parts = ["values differ from CPU"]
        if mism:
            parts.append(mism.removeprefix("Mismatched elements: ").split(" (")[0] + " elements")
        for label, line in (("max abs diff", absd), ("max rel diff", reld)):
            m = re.search(r"difference: (\S+)", line)
            if m:
                parts.append(f"{label} {m.group(1)}")
        expected_got = next((ln for ln in lines if ln.startswith("Expected ") and " but got " in ln), "")
        if expected_got:  # a scalar: "Expected 1 but got 2."
            parts.append(expected_got.rstrip(".").replace("Expected ", "CPU ", 1).replace(" but got ", ", tpu "))
        return ", ".join(parts)
    return head


_WIDER = {torch.float32: torch.float64, torch.bfloat16: torch.float64, torch.float16: torch.float64,
          torch.complex64: torch.complex128}


def _upcast(v):
    """Floating and complex tensors in double precision (for the exact reference)."""
    if isinstance(v, torch.Tensor):
        wide = _WIDER.get(v.dtype)
        return v.to(wide) if wide is not None else v
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return type(v)(_upcast(x) for x in v)
    if isinstance(v, dict):
        return {k: _upcast(x) for k, x in v.items()}
    return v


class _Reference:
    """The op's functional result on CPU in double precision, computed once per sample when a
    comparison needs it (None when the op does not run in double precision)."""

    def __init__(self, op, sample):
        self._op, self._sample, self._done, self._value = op, sample, False, None

    def __call__(self):
        if not self._done:
            self._done = True
            inp, args, kwargs = _upcast(_clone((self._sample.input, self._sample.args, self._sample.kwargs)))
            try:
                self._value = list(_tensors(self._op(inp, *args, **kwargs)))
            except Exception:  # noqa: BLE001 - no double-precision kernel: no reference
                self._value = None
        return self._value


def _as_accurate_as_cpu(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor, tol) -> bool:
    """``actual`` (tpu) is within rounding of ``exact`` as ``expected`` (CPU) is (module docstring)."""
    if actual.shape != exact.shape or not (expected.is_floating_point() or expected.is_complex()):
        return False
    rtol, atol = (tol["rtol"], tol["atol"]) if tol else torch.testing._comparison.default_tolerances(expected)
    wide = torch.complex128 if expected.is_complex() else torch.float64
    a, e, r = (t.detach().to(wide) for t in (actual, expected, exact))
    finite = torch.isfinite(r) & torch.isfinite(e)
    # where CPU or the exact value is NaN/Inf, the tpu must give what CPU gives
    a_nf, e_nf = a[~finite], e[~finite]
    if not ((a_nf == e_nf) | (torch.isnan(a_nf) & torch.isnan(e_nf))).all():
        return False
    if not finite.any():
        return True
    cpu_error = (e - r).abs()[finite].max()
    budget = atol + rtol * r.abs() + 2 * cpu_error
    return bool(((a - r).abs()[finite] <= budget[finite]).all())


def _rounding_only(actual, expected, exact, tol) -> bool:
    """Every tensor of a result that differs from CPU's is as accurate as CPU's."""
    outs, refs = list(_tensors(actual)), list(_tensors(expected))
    if exact is None or len(outs) != len(refs):
        return False
    for a, e in zip(outs, refs):
        if a.dtype != e.dtype:
            return False
        try:
            torch.testing.assert_close(a, e, equal_nan=True, **tol)
            continue
        except AssertionError:
            pass
        # the exact tensor for this one: a result tensor of the same shape (an argument mutated
        # in place or an out= tensor holds a result too)
        candidates = [x for x in exact if x.shape == e.shape]
        if not any(_as_accurate_as_cpu(a, e, x, tol) for x in candidates):
            return False
    return True


def _compare(actual, expected, *, tol, what: str, on_tpu: bool = True, reference=None):
    try:
        actual = _to_host(actual) if on_tpu else actual
    except _OnCpu as exc:
        raise Mismatch(f"{what}: {exc}") from None
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        if actual.dtype != expected.dtype:
            raise Mismatch(f"{what}: dtype {dtype_name(actual.dtype)}, CPU gives {dtype_name(expected.dtype)}")
        if actual.shape != expected.shape:
            raise Mismatch(f"{what}: shape {tuple(actual.shape)}, CPU gives {tuple(expected.shape)}")
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_dtype=True, **tol)
    except AssertionError as exc:
        if reference is not None and _rounding_only(actual, expected, reference(), tol):
            return
        raise Mismatch(f"{what}: {_close_summary(str(exc))}\n{exc}") from None
    except (TypeError, ValueError) as exc:
        # assert_close cannot compare this kind of value (torch.Size, str, ...)
        if actual != expected:
            raise Mismatch(f"{what}: {actual!r}, CPU gives {expected!r}") from exc


def _check_random(actual, expected, sample, rng_range, *, what: str, on_tpu: bool = True):
    try:
        actual = _to_host(actual) if on_tpu else actual
    except _OnCpu as exc:
        raise Mismatch(f"{what}: {exc}") from None
    outs, refs = list(_tensors(actual)), list(_tensors(expected))
    if len(outs) != len(refs):
        raise Mismatch(f"{what}: {len(outs)} tensors returned, CPU gives {len(refs)}")
    for a, e in zip(outs, refs):
        if a.dtype != e.dtype or a.shape != e.shape:
            raise Mismatch(f"{what}: {dtype_name(a.dtype)}{list(a.shape)}, CPU gives {dtype_name(e.dtype)}{list(e.shape)}")
        bounds = rng_range(sample, e) if rng_range is not None else None
        if bounds is None or not a.numel():
            continue
        lo, hi = bounds
        v = a.double()
        if v.isnan().any() and not e.double().isnan().any():
            raise Mismatch(f"{what}: NaN in a random result (CPU has none)")
        v = v[~v.isnan()]
        if v.numel() and (v.min().item() < lo or v.max().item() > hi):
            raise Mismatch(f"{what}: random values in [{v.min().item()}, {v.max().item()}], expected within [{lo}, {hi}]")


# ---- one variant of one sample -------------------------------------------------------


def _call(fn, inp, args, kwargs):
    return fn(inp, *args, **kwargs)


def _check_call(what, *args, **kwargs):
    """Run one check (``what``: "op", "in-place", ...); its failure is tagged with ``what``."""
    try:
        return _check_one(what, *args, **kwargs)
    except Exception as exc:
        if not hasattr(exc, "opinfo_check"):
            exc.opinfo_check = what
        raise


def _check_one(what, fn, sample, run, *, tol, rng_range, random: bool, prepare=None, canonical=None,
               reference=None):
    """Run ``fn`` on a CPU copy and a tpu copy of ``sample``; results and arguments must match.
    Returns CPU's result (``_CPU_RAISES`` when CPU raised, and tpu did too)."""
    cpu = _clone((sample.input, sample.args, sample.kwargs))
    dev = _to_tpu(cpu)
    if prepare is not None:
        cpu, dev = prepare(cpu, "cpu"), prepare(dev, "tpu")
    try:
        expected = _call(fn, *cpu)
    except Exception as cpu_exc:  # noqa: BLE001 - any CPU error must be an error on tpu too
        try:
            _call(run(fn), *dev)
        except Exception:  # noqa: BLE001
            return _CPU_RAISES
        raise Mismatch(f"{what}: CPU raises {_first_line(cpu_exc)}; tpu returns a result") from None
    cpu_result = expected
    actual = _call(run(fn), *dev)
    on_tpu = not any(t.device.type == "cpu" for t in _tensors(actual)) or not _cpu_result_expected(fn, dev)
    if random:
        _check_random(actual, expected, sample, rng_range, what=what, on_tpu=on_tpu)
        return cpu_result
    if canonical is not None:
        try:
            actual = _to_host(actual) if on_tpu else actual
        except _OnCpu as exc:
            raise Mismatch(f"{what}: {exc}") from None
        actual, expected, on_tpu = canonical(actual), canonical(expected), False
        # out= tensors are the (canonicalized) results; compare the other arguments as they are
        cpu, dev = _without_out(cpu), _without_out(dev)
    if canonical is not None:
        reference = None  # the exact result is not canonicalized the same way
    _compare(actual, expected, tol=tol, what=what, on_tpu=on_tpu, reference=reference)
    # every argument after the call: what the op mutates (in-place, out=) must match CPU
    after = [t.cpu() for t in _tensors(dev)]
    _compare(after, list(_tensors(cpu)), tol=tol, what=f"{what}, arguments after the call", on_tpu=False,
             reference=reference)
    return cpu_result


# what _check_one returns when CPU raised (and tpu did too)
_CPU_RAISES = object()


def _without_out(args):
    inp, a, kw = args
    return inp, a, {k: v for k, v in kw.items() if k != "out"}


def _via_view(args, device):
    """The same arguments with the input replaced by a view into a larger base (kept as ``__base__``)."""
    inp, a, kw = args
    host = inp.cpu()
    # built on CPU and moved whole, so the tpu side tests the write, not ``stack``
    base = torch.stack([torch.zeros_like(host), host]).to(device)
    return base[1], a, {**kw, "__base__": base}


def _strip_base(fn):
    def call(inp, *args, __base__=None, **kwargs):
        return fn(inp, *args, **kwargs)

    return call


def _out_like(expected):
    """A prepare step adding ``out=`` tensors shaped like the CPU result, or None."""
    if isinstance(expected, torch.Tensor):
        single = True
    elif isinstance(expected, (tuple, list)) and expected and all(isinstance(e, torch.Tensor) for e in expected):
        single = False
    else:
        return None

    def prepare(args, device):
        inp, a, kw = args
        if single:
            out = torch.empty(expected.shape, dtype=expected.dtype, device=device)
        else:
            out = tuple(torch.empty(e.shape, dtype=e.dtype, device=device) for e in expected)
        return inp, a, {**kw, "out": out}

    return prepare


def check_sample(op, sample, dtype, mode, *, through_view: bool = True, inplace_forms: bool = True):
    run = MODES[mode]
    name = op_id(op)
    random = name in RANDOM_OPS or op.has_nondeterministic_output or RANDOM_SAMPLES.get(name, _never)(sample)
    rng_range = RANDOM_OPS.get(name)
    tol = tolerance(op.name, op.variant_test_name, dtype_name(dtype)) or {}
    kw = {"tol": tol, "rng_range": rng_range, "random": random,
          "canonical": CANONICAL_OUTPUTS.get(name), "reference": _Reference(op, sample)}

    # the functional call's CPU result: the out= check below shapes its out= tensors like it
    expected = _check_call("op", op, sample, run, **kw)
    inplace = op.inplace_variant if inplace_forms else None
    if inplace is not None:
        _check_call("in-place", inplace, sample, run, **kw)
        if through_view and not random and isinstance(sample.input, torch.Tensor):
            _check_call("in-place through a view", _strip_base(inplace), sample, run, prepare=_via_view, **kw)
    if op.supports_out and not random:
        if expected is _CPU_RAISES:  # the functional check above already compared errors
            return
        prepare = _out_like(expected)
        if prepare is not None:
            _check_call("out=", op.op, sample, run, prepare=prepare, **kw)


# ---- results file ----------------------------------------------------------------------


def _record(op, dtype, mode, outcome, *, start, error=None, sample=None, samples=0, check=None):
    if RESULTS is None:
        return
    row = {
        "op": op.name, "variant": op.variant_test_name, "dtype": dtype_name(dtype), "mode": mode,
        "tier": "full" if FULL else "ci", "outcome": outcome, "samples": samples,
        "failed_sample": sample, "failed_check": check, "error": error, "seconds": round(time.perf_counter() - start, 3),
    }
    if mode == "compiled":  # graphs the tpu_debug backend compiled (0: dynamo ran it all eagerly)
        row["graphs"] = _GraphCount.graphs
    # one short line per test, appended with O_APPEND: safe across xdist workers
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


# ---- the test --------------------------------------------------------------------------

_MAX_CACHED_EXECUTABLES = 2000


def _eager_executables() -> int:
    return next(c.entries for c in cache_counts() if c.name == "eager executables")


def _bound_executable_cache():
    # a full sweep compiles tens of thousands of (op, shape) executables (max_pool2d alone has
    # over a thousand samples): keep a worker's memory bounded; nearby samples still share them
    # (the count from cache_counts(): cache_stats() would build a record per executable, per sample)
    if _eager_executables() > _MAX_CACHED_EXECUTABLES:
        eager.clear_cache()
        jax.clear_caches()


@pytest.mark.parametrize(("op", "dtype", "mode"), _params())
def test_opinfo(op, dtype, mode):
    start = time.perf_counter()
    done = 0
    try:
        _GraphCount.graphs = 0
        samples = op.sample_inputs("cpu", dtype, requires_grad=False)
        if not FULL:
            samples = itertools.islice(samples, ci_samples(mode, dtype_name(dtype)))
        # an op expected to fail in an in-place form keeps them: its expectation is checked
        known = expectation(op.name, op.variant_test_name, dtype_name(dtype), mode, full=FULL)
        inplace_forms = (FULL or mode != "compiled" or _OP_INDEX[id(op)] % INPLACE_COMPILED_CI_STRIDE == 0
                         or (known is not None and known[1].startswith("in-place")))
        for sample in samples:
            # writes through a view are about aliasing, not shapes: the CI tier checks them once
            check_sample(op, sample, dtype, mode, through_view=FULL or done == 0, inplace_forms=inplace_forms)
            done += 1
            _bound_executable_cache()
    except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
        reason = _first_line(exc).removeprefix("Mismatch: ")
        check = getattr(exc, "opinfo_check", None)
        if check is not None and not isinstance(exc, Mismatch):
            reason = f"{check}: {reason}"
        _record(op, dtype, mode, "failed", start=start, error=reason, sample=done, samples=done + 1, check=check)
        # plain text, no pytest traceback: pytest would repr every frame's tpu tensors,
        # and printing a tpu tensor reads it element by element
        details = "".join(traceback.format_exception(exc, limit=-12))
        pytest.fail(f"sample {done}: {reason}\n\n{details}", pytrace=False)
    _record(op, dtype, mode, "passed", start=start, samples=done)
    if mode == "compiled":
        torch._dynamo.reset()  # free this test's graphs and programs


def test_expectation_keys_name_real_cases():
    """Every entry in opinfo_expectations.py names an (op, variant, dtype, mode) the harness runs."""
    real = {(op.name, op.variant_test_name, dtype_name(d), m) for op, d, m in cases()}

    def runs(name, variant, dtype, mode):
        return any(
            (n, v) == (name, variant) and dtype in ("*", d) and mode in ("*", m) for n, v, d, m in real
        )

    stale = [key for key in EXPECTATIONS if not runs(*key)]
    stale += [key for key in TOLERANCES if not runs(*key, "*")]
    assert not stale, f"expectations for cases the harness does not run: {stale}"
