from __future__ import annotations

import os
import signal

import pytest
from fault_injection import Timeline

REPORT_VARIABLE = "TPU_DEBUG_FAULTS_REPORT"


@pytest.fixture(scope="session", autouse=True)
def sigint_not_ignored():
    """Children start with SIGINT at its default even when this process was started with it
    ignored (a background job of a shell without job control): an ignored signal stays ignored
    across exec, and trace() leaves a signal the program ignores alone."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # exec'd children get SIG_DFL
    yield
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="session")
def timeline(tmp_path_factory) -> Timeline:
    """How long each phase of the training script lasts here, from one undisturbed run."""
    return Timeline.measure(tmp_path_factory.mktemp("timeline"))


@pytest.fixture(scope="session")
def fault_report():
    """``record(result)``: one JSON line per point into $TPU_DEBUG_FAULTS_REPORT, when it is set."""
    path = os.environ.get(REPORT_VARIABLE)

    def record(result) -> None:
        if path:
            # one write per line, appended: points from parallel test processes do not interleave
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (result.as_json() + "\n").encode())
            finally:
                os.close(fd)

    return record
