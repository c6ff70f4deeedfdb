"""PyTorch's OpInfo ``error_inputs`` on `tpu`: every call CPU refuses is refused the same way.

Each OpInfo of ``op_db`` with an ``error_inputs_func`` lists calls the op must refuse,
each with the exception type (or types) and a regular expression its message must
match (``ErrorInput``; PyTorch's own ``test_errors`` in test/test_ops.py runs them per
device). Here the inputs are made on CPU, as for PyTorch's CPU run, so the checks CPU
makes and a GPU skips (an index out of range) are among them. Each call runs on CPU
first: a call CPU does not refuse with that type and message is not a case (skipped,
saying what CPU did). Its tensors then move to `tpu` (a tensor PyTorch puts on ``meta``
on purpose stays there; tensors sharing storage share it on `tpu` too, as views of one
base, so an ``out=`` that overlaps an input still does), and the same call must raise
the same type with a message matching the same expression, at the call: results are
not read, so an error that would surface only when a value is read does not count.

Modes: "eager" (op by op, with the runtime's default checks: an eager op checks the
values PyTorch checks, such as an index in range) and "lazy" (``DEFER_AND_FUSE`` with
``data_checks`` on, the switch that makes a deferred op check what it reads; without
it a lazy op reads nothing on the host, see docs/op_coverage.md).

One test id per (op[.variant], index of the error input, mode). Calls that still differ
are strict xfails in ``opinfo_expectations.ERROR_INPUTS``, each with its reason.

Commands::

    python -m pytest tests/runtime/test_opinfo_errors.py -n 2 -q
    # one line per call (the table in docs/op_coverage.md counts these)
    TPU_DEBUG_OPINFO_RESULTS=errors.jsonl python -m pytest tests/runtime/test_opinfo_errors.py -n 2 -q
"""

from __future__ import annotations

import json
import os
import re
import warnings

import pytest
import torch
from opinfo_expectations import ERROR_INPUTS
from test_opinfo import _tensors
from torch.testing._internal.common_methods_invocations import op_db
from tpu_debug.runtime.config import config

import tpu_debug  # noqa: F401 - registers the tpu device

RESULTS = os.environ.get("TPU_DEBUG_OPINFO_RESULTS") or None

MODES = ("eager", "lazy")


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


_made: dict[tuple[int, str], list] = {}


def _error_inputs(op, use: str) -> list:
    """The op's error inputs made on CPU, from a fixed seed, once per use (the CPU call and each
    mode's tpu call get inputs of their own: a call may write its arguments). Through
    ``error_inputs_func``: ``op.error_inputs`` looks for a unittest test function on the stack
    for each input (``inspect.stack()``), seconds per op under pytest."""
    key = (id(op), use)
    if key not in _made:
        with warnings.catch_warnings(), torch.random.fork_rng():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            _made[key] = list(op.error_inputs_func(op, "cpu"))
    return _made[key]


def _params():
    params = []
    for op in op_db:
        if op.error_inputs_func is None:
            continue
        for index in range(len(_error_inputs(op, MODES[0]))):
            for mode in MODES:
                marks = ()
                reason = ERROR_INPUTS.get((op_id(op), index, mode)) or ERROR_INPUTS.get((op_id(op), index, "*"))
                if reason is not None:
                    marks = (pytest.mark.xfail(reason=reason, strict=True),)
                params.append(pytest.param(op, index, mode, id=f"{op_id(op)}-{index}-{mode}", marks=marks))
    return params


# ---- moving a call to tpu, sharing preserved ----------------------------------------


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _on_tpu(call):
    """``call`` (input, args, kwargs) with its CPU tensors on tpu: a tensor alone in its
    storage moves as it is, tensors sharing one storage become views of one tpu copy of it
    (same sizes, strides and offsets), a tensor passed twice is one tpu tensor, ``meta``
    tensors stay, a ``cpu`` device becomes tpu."""
    counts: dict[int, int] = {}
    for t in _tensors(call):
        if t.device.type == "cpu" and t.layout == torch.strided:
            counts[_storage_key(t)] = counts.get(_storage_key(t), 0) + 1
    bases: dict[int, torch.Tensor] = {}
    moved_once: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in moved_once:
            moved_once[id(t)] = _moved(t)
        return moved_once[id(t)]

    def _moved(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            return t
        if t.layout != torch.strided:
            return t.to("tpu")
        key = _storage_key(t)
        compact = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes
        if counts[key] == 1 and compact:
            moved = t.detach().to("tpu")
        else:
            base = bases.get(key)
            if base is None:
                n = t.untyped_storage().nbytes() // t.element_size()
                flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
                base = bases[key] = flat.detach().to("tpu")
            moved = base.as_strided(t.size(), t.stride(), t.storage_offset())
        return moved.requires_grad_() if t.requires_grad else moved

    def walk(v):
        if isinstance(v, torch.Tensor):
            return move(v)
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device("tpu")
        if isinstance(v, str) and v == "cpu":
            return "tpu"
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return type(v)(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(call)


# ---- the test ----------------------------------------------------------------------------


def _refused(exc: BaseException, error) -> bool:
    return isinstance(exc, error.error_type) and re.search(error.error_regex, str(exc)) is not None


def cpu_refused() -> list[tuple[str, int]]:
    """Every (op[.variant], index) whose error input CPU refuses as the ErrorInput says: the
    cases of this harness (scripts/op_coverage.py counts them)."""
    cases = []
    for op in op_db:
        if op.error_inputs_func is None:
            continue
        for index, error in enumerate(_error_inputs(op, "cpu")):
            sample = error.sample_input
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    op(sample.input, *sample.args, **sample.kwargs)
                except Exception as exc:  # noqa: BLE001 - what CPU raises decides the case
                    if _refused(exc, error):
                        cases.append((op_id(op), index))
    return cases


def _line(exc: BaseException | None) -> str:
    if exc is None:
        return "returns a value"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _record(op, index, mode, outcome, error=None) -> None:
    if RESULTS is None:
        return
    row = {"op": op_id(op), "index": index, "mode": mode, "outcome": outcome, "error": error}
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _run(op, call, mode):
    inp, args, kwargs = call
    if mode == "eager":
        return op(inp, *args, **kwargs)
    saved = config.data_checks
    config.data_checks = True
    try:
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            return op(inp, *args, **kwargs)
    finally:
        config.data_checks = saved


@pytest.mark.parametrize(("op", "index", "mode"), _params())
def test_error_input(op, index, mode):
    error = _error_inputs(op, f"cpu-{mode}")[index]
    sample = error.sample_input
    cpu_call = (sample.input, sample.args, sample.kwargs)
    same = _error_inputs(op, mode)[index].sample_input
    try:
        tpu_call, moving = _on_tpu((same.input, same.args, same.kwargs)), None
    except Exception as exc:  # noqa: BLE001 - a tensor the device cannot hold: the call cannot be made
        tpu_call, moving = None, exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            op(*cpu_call[:1], *cpu_call[1], **cpu_call[2])
        except Exception as exc:  # noqa: BLE001 - whatever CPU raises decides the case
            if not _refused(exc, error):
                pytest.skip(f"CPU raises {_line(exc)}, not {error.error_type} matching {error.error_regex!r}")
        else:
            pytest.skip("CPU accepts this call (an error input for another device)")
        got = moving
        try:
            if moving is None:
                _run(op, tpu_call, mode)
        except Exception as exc:  # noqa: BLE001 - compared with what PyTorch expects below
            got = exc
    if moving is not None:
        _record(op, index, mode, "differs", _line(moving))
        pytest.fail(f"its tensors cannot move to tpu: {_line(moving)}", pytrace=False)
    if got is not None and _refused(got, error):
        _record(op, index, mode, "refused")
        return
    outcome = "returns" if got is None else "differs"
    _record(op, index, mode, outcome, _line(got))
    pytest.fail(f"CPU raises {error.error_type} matching {error.error_regex!r}; tpu {_line(got)}", pytrace=False)
