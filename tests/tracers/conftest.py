from __future__ import annotations

import pytest
from tpu_debug.runtime import clear_cache


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "runs"


@pytest.fixture
def cold_cache():
    """Empty the eager executable cache, so ops compile (and report HLO) inside the test."""
    clear_cache()
    yield
