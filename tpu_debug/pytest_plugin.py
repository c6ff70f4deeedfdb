"""The pytest plugin of tpu_debug (the ``pytest11`` entry point): ``--tpu-debug[=DIR]`` and two fixtures.

- ``pytest --tpu-debug=DIR`` records one run per test into DIR (a trace around
  the test's call; the run is named after the test); ``--tpu-debug`` alone
  records into ``$TPU_DEBUG_LOGDIR`` or ``./tpu_debug_runs``. Open a run with
  ``tpu-debug report`` as any other.
- A test that asks for ``tpu_debug_no_recompiles`` fails when anything
  compiles in steady state (after the warm-up steps), with each compile's line
  and key diff; ``tpu_debug_no_implicit_syncs`` fails on a device-to-host sync
  nobody asked for (``.item()``, ``print``, ``if t:``, a CPU fallback), with the
  line and the cause. Such a test is recorded with or without ``--tpu-debug``
  (into a temporary directory without it).

One trace records at a time, so a recorded test that starts its own
``tpu_debug.trace()`` fails with ``TraceActiveError``: record it without the
plugin.

pytest loads an installed plugin in every run of every project, so this module imports
neither torch nor jax (nor does ``import tpu_debug``); the recording and the checks
(:mod:`tpu_debug.pytest_recording`, which import torch and jax) are imported for the first
test that is recorded.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "CHECKS",
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_call",
    "tpu_debug_no_implicit_syncs",
    "tpu_debug_no_recompiles",
]

#: the fixtures that make a test checked (and recorded)
CHECKS = ("tpu_debug_no_recompiles", "tpu_debug_no_implicit_syncs")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tpu_debug", "tpu_debug: record what PyTorch does on the tpu device")
    group.addoption(
        "--tpu-debug",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        dest="tpu_debug",
        help="record one tpu_debug run per test into DIR (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs); "
        "write --tpu-debug=DIR, since a separate word after --tpu-debug is taken as DIR",
    )


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("tpu_debug")
    # "--tpu-debug tests/test_x.py" gives the test path to --tpu-debug as its DIR
    if value and (value.endswith(".py") or "::" in value or Path(value).is_file()):
        raise pytest.UsageError(
            f"--tpu-debug took {value!r} as the directory for the runs: write --tpu-debug=DIR, "
            "or put --tpu-debug after the test paths"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    checks = tuple(name for name in CHECKS if name in getattr(item, "fixturenames", ()))
    if item.config.getoption("tpu_debug") is None and not checks:
        return (yield)
    from tpu_debug.pytest_recording import record_call  # deferred: entry: a test records only when asked

    return (yield from record_call(item, checks))


@pytest.fixture
def tpu_debug_no_recompiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fail the test when anything compiles in steady state: after the warm-up steps (the
    first ones, until the programs run repeat), with each compile's line and what changed
    in its key. Steps are ``optimizer.step()`` calls, ``tpu_debug.step()`` calls, or the
    iterations of the loop the test ran. The test is recorded; the value is the directory
    its run goes to without ``--tpu-debug``."""
    return tmp_path_factory.mktemp("tpu_debug_runs")


@pytest.fixture
def tpu_debug_no_implicit_syncs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fail the test on a device-to-host sync nobody asked for (``.item()``, ``print``,
    ``if t:``, ``float(t)``, a CPU fallback), with its line and cause; ``.cpu()`` and
    ``.to("cpu")`` are explicit and allowed. The test is recorded; the value is the directory
    its run goes to without ``--tpu-debug``."""
    return tmp_path_factory.mktemp("tpu_debug_runs")
