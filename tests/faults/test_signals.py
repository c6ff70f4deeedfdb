"""SIGKILL, SIGTERM and SIGINT at seeded points of a traced training script (``tpu-debug run``).

Every point checks that the run opens with ``tpu-debug report`` and with the TUI's
loaders, that its status names what ended it (``killed``, ``terminated``,
``interrupted``; ``finished`` when the script had ended before the signal), that
``tpu-debug run`` exits as Python would, and that at most the last
:data:`~fault_injection.LOSS_BOUND` seconds of events were lost (nothing at all for
SIGTERM and SIGINT). See ``fault_injection`` for how a seed picks its moment, and
docs/reliability.md for the figures. ``TPU_DEBUG_FAULTS_REPORT=path.jsonl`` appends
each point's measurements to that file.
"""

from __future__ import annotations

import sys

import pytest
from fault_injection import SIGNALS, run_point

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals and a shared CLOCK_MONOTONIC")

DEFAULT_SEEDS = (3, 4)  # the training loop and the close: the phases where a run has the most to lose
SLOW_SEEDS = range(20)  # every phase, 4 points each


def _check(tmp_path, timeline, fault_report, signame: str, seed: int) -> None:
    result = run_point(tmp_path, signame, seed, timeline)
    fault_report(result)
    assert not result.problems, (
        f"{signame} seed {seed} in the {result.phase!r} phase ({result.delay:.3f} s in):\n"
        + "\n".join(result.problems)
    )


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
@pytest.mark.parametrize("signame", list(SIGNALS))
def test_signal(tmp_path, timeline, fault_report, signame, seed):
    _check(tmp_path, timeline, fault_report, signame, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [s for s in SLOW_SEEDS if s not in DEFAULT_SEEDS])
@pytest.mark.parametrize("signame", list(SIGNALS))
def test_signal_seeded(tmp_path, timeline, fault_report, signame, seed):
    _check(tmp_path, timeline, fault_report, signame, seed)
