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


@pytest.fixture
def forget_graphs():
    """Graphs compiled in a test are not replayed into the runs of later tests."""
    import torch
    from tpu_debug.runtime import compiled

    before = list(compiled._graphs)
    yield
    with compiled._lock:
        compiled._graphs[:] = before
    torch._dynamo.reset()
