from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def fit_target_cache(tmp_path_factory):
    """The directory of the fit tests' shared target-compile cache (one per test process)."""
    return tmp_path_factory.getbasetemp() / "fit-target-cache"


@pytest.fixture(autouse=True)
def _shared_target_cache(fit_target_cache, monkeypatch):
    """One target-compile cache for this process's fit tests: many of them ask for the same
    program (the tiny Llama's FSDP step on a v5e-8, a fix and the plain fit of that change), and
    a program is compiled once. What a read-back gives equals the compile it stored
    (tests/runtime/test_target_compile.py checks the cache); each test's figures still come
    from the compiler, through it. A module-scoped fixture that compiles is set up before this
    one and sets the same directory itself."""
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(fit_target_cache))
