from __future__ import annotations

import pytest


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "runs"
