from __future__ import annotations

import os

import pytest
from fault_injection import Timeline

REPORT_VARIABLE = "TPU_DEBUG_FAULTS_REPORT"


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
