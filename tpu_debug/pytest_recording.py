"""What the pytest plugin does for a recorded test: the trace around its call, and the checks
of the ``tpu_debug_no_recompiles`` and ``tpu_debug_no_implicit_syncs`` fixtures, read from the
run once it is written.

The plugin's hooks and fixtures are in :mod:`tpu_debug.pytest_plugin` (the ``pytest11``
entry point), which imports this module only for a test that is recorded: importing it
registers the ``tpu`` device, as ``import tpu_debug`` does.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

import tpu_debug
from tpu_debug.core.options import default_logdir
from tpu_debug.report import advice_of
from tpu_debug.tracers.reading.recompile_analysis import explain
from tpu_debug.tracers.reading.step_phases import STEADY, StepIndex, phase_of, step_phases
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT, call_sites
from tpu_debug.tracers.reading.view import RunView

__all__ = ["SHOWN", "implicit_sync_failures", "record_call", "steady_compile_failures"]

# compiles or call sites a failure message lists; the run holds every one
SHOWN = 8

# advisor findings about compiles, whose fix the failure of tpu_debug_no_recompiles repeats
_RECOMPILE_KINDS = ("recompile", "dynamic_shape", "recompile_limit")


_NO_STEPS = (
    "tpu_debug_no_recompiles: the test ran no steps (no optimizer.step() on tpu parameters, no "
    "tpu_debug.step(), no loop of three iterations or more), so none of its compiles is in steady "
    "state; end each step with tpu_debug.step() to have its recompiles checked"
)
_RECOMPILE_FIX = (
    "fix: make the changing input the same at every step (pad or bucket shapes, pass Python scalars "
    "as tensors), or compile it before the steps"
)


def _logdir(item: pytest.Item, checks: Sequence[str]) -> Path:
    value = item.config.getoption("tpu_debug")
    if value is None:  # recorded for a check only: the fixture's temporary directory
        return Path(item.funcargs[checks[0]])  # type: ignore[attr-defined]
    path = Path(value) if value else default_logdir()
    # relative to where pytest was started, not to a directory a test changed into
    return path if path.is_absolute() else item.config.invocation_params.dir / path


def record_call(item: pytest.Item, checks: Sequence[str]) -> Generator[None, Any, Any]:
    """The body of the plugin's ``pytest_runtest_call`` wrapper: the test's call inside a
    trace, then the checks its fixtures ask for (a failed test keeps its own failure)."""
    with tpu_debug.trace(logdir=_logdir(item, checks), name=item.nodeid) as session:
        result = yield
    failures = []
    if "tpu_debug_no_recompiles" in checks:
        failures += steady_compile_failures(session, item)
    if "tpu_debug_no_implicit_syncs" in checks:
        failures += implicit_sync_failures(session)
    if failures:
        pytest.fail("\n\n".join(failures) + f"\n\n(the run: {session.run_dir})", pytrace=False)
    return result


def steady_compile_failures(session: RunView, item: pytest.Item | None = None) -> list[str]:
    """The failure of ``tpu_debug_no_recompiles`` (empty: none): the compiles of steady-state
    steps, each with its line and key diff, and the advisor's fix.

    A test without steps has no steady state; when it recompiled something, ``item`` gets a
    warning that says how to mark its steps.
    """
    steps = session.steps()
    compiles = session.compiles()
    if not steps:
        if item is not None and any(c.diffs for c in compiles):
            item.warn(pytest.PytestWarning(_NO_STEPS))
        return []
    phases = dict(zip((s.index for s in steps), step_phases(steps)))
    index = StepIndex(steps)
    steady = [c for c in compiles if phase_of(index, phases, c.ts) == STEADY]
    if not steady:
        return []
    warmup = [i for i, p in phases.items() if p != STEADY]
    in_steps = _ranges(sorted({index.step_of(c.ts) for c in steady}))
    head = (
        f"tpu_debug_no_recompiles: {len(steady)} compile(s) in steady state, in step(s) {in_steps} "
        f"of {len(steps)} (warm-up: {_ranges(warmup) if warmup else 'none'}):"
    )
    lines = [head]
    for c in steady[:SHOWN]:
        what = c.identity or c.name
        if c.diffs:
            text = explain(what, c.diffs, location=c.location)
        else:
            where = f" at {c.location}" if c.location is not None else ""
            text = f"{what} compiled{where}: no earlier key of it in this run"
        lines += [f"  {line}" for line in text.splitlines()]
    if len(steady) > SHOWN:
        lines.append(f"  ... and {len(steady) - SHOWN} more")
    fixes = dict.fromkeys(f.fix for f in advice_of(session).findings if f.kind in _RECOMPILE_KINDS)
    lines += [f"fix: {fix}" for fix in fixes] or [_RECOMPILE_FIX]
    return ["\n".join(lines)]


def implicit_sync_failures(session: RunView) -> list[str]:
    """The failure of ``tpu_debug_no_implicit_syncs`` (empty: none): each line that made the
    host wait for the device without asking for a copy, with its cause and count."""
    syncs = [t for t in session.transfers(direction="d2h") if t.implicit]
    if not syncs:
        return []
    sites = call_sites(syncs)
    lines = [f"tpu_debug_no_implicit_syncs: {len(syncs)} implicit device-to-host sync(s):"]
    for s in sites[:SHOWN]:
        where = str(s.location) if s.location is not None else "(no line of the test's code)"
        cause = CAUSE_TEXT.get(s.cause, s.cause)
        lines.append(f"  {where}: {cause}, {s.calls or s.count} time(s), {s.nbytes} bytes")
    if len(sites) > SHOWN:
        lines.append(f"  ... and {len(sites) - SHOWN} more line(s)")
    lines.append(
        "fix: keep values on the device (accumulate tensors, compare with torch.where), and read a result "
        "once with .cpu() where the test checks it"
    )
    return ["\n".join(lines)]


def _ranges(indexes: Sequence[int]) -> str:
    out: list[list[int]] = []
    for i in indexes:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)
