"""Every docstring example (``>>>``) in the package runs and shows what it says.

An example that needs a model, a TPU compiler or a recorded run is written as a ``::`` code
block instead, which doctest leaves alone. The modules are found as the wheel holds them
(``pyproject.toml``'s ``[tool.setuptools.package-dir]``), one test per module that has examples.
"""

from __future__ import annotations

import doctest
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# not run: __main__ runs the CLI when imported
SKIPPED = frozenset({"tpu_debug.__main__"})


def _modules_with_examples() -> list[str]:
    """Module names whose source holds a ``>>>`` prompt (read, not imported, at collection)."""
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = []
    for package, folder in roots.items():
        for source in sorted((ROOT / folder).rglob("*.py")):
            parts = [*package.split("."), *source.relative_to(ROOT / folder).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in SKIPPED and ">>>" in source.read_text():
                found.append(name)
    return sorted(found)


@pytest.fixture
def registries():
    """Examples may register an event kind or an advisor rule: each module's run leaves the
    registries as it found them."""
    from tpu_debug.tracers import events
    from tpu_debug.tracers.advisor import registry

    saved = dict(events.EVENT_TYPES), dict(registry.RULES)
    try:
        yield
    finally:
        for live, before in zip((events.EVENT_TYPES, registry.RULES), saved):
            live.clear()
            live.update(before)


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run(name, registries, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' in its source but no example doctest finds"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    failed, attempted = runner.summarize(verbose=False)
    assert not failed, f"{failed} of {attempted} examples failed in {name}:\n" + "".join(report)


def test_the_examples_are_found():
    assert {"tpu_debug.tracers.recording.step_tracker", "tpu_debug.core.options"} <= set(_modules_with_examples())
