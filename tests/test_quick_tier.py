"""The quick tier (``-m quick``: README's quick test command for contributors) reaches every part of
the suite: each folder of tests/ that holds tests marks at least one of them ``quick``, so a change
to any layer meets one of its tests before the full command runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def marks_quick(source: str) -> bool:
    """Whether a test module uses ``pytest.mark.quick`` (on a test, a ``pytest.param`` or the module)."""
    return any(
        isinstance(node, ast.Attribute) and node.attr == "quick" and ast.unparse(node.value) == "pytest.mark"
        for node in ast.walk(ast.parse(source))
    )


@pytest.mark.quick
def test_the_check_sees_the_mark():
    assert marks_quick("@pytest.mark.quick\ndef test_a():\n    pass\n")
    assert marks_quick("pytest.param(1, marks=pytest.mark.quick)\n")
    assert not marks_quick("@pytest.mark.slow\ndef test_a():\n    pass\n")


@pytest.mark.quick
def test_every_test_folder_has_a_quick_test():
    folders = sorted(d for d in TESTS.iterdir() if d.is_dir() and any(d.rglob("test_*.py")))
    assert len(folders) >= 10, [d.name for d in folders]
    missing = [d.name for d in folders if not any(marks_quick(p.read_text()) for p in d.rglob("test_*.py"))]
    assert not missing, f"mark a test of each of these folders @pytest.mark.quick: {missing}"
