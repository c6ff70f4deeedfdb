"""Conventions of CONTRIBUTING.md that a reader relies on, checked on the source.

- every ``pytest.raises`` names the message it expects (``match=``): a test that accepts any
  error of a type passes on the wrong error;
- code, tests, scripts and docs say why, not which issue asked for something (git keeps that).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("tpu_debug", "fit", "runtime", "tracers", "tui", "tests", "scripts", "benchmarks", "examples", "docs")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+\b")


def _files(*suffixes: str) -> list[Path]:
    found = [p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*") if p.suffix in suffixes]
    found += [p for p in ROOT.glob("*") if p.suffix in suffixes]
    return sorted(found)


def raises_without_match(source: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "pytest.raises"
        and not any(keyword.arg == "match" for keyword in node.keywords)
    ]


def test_the_checks_see_what_they_look_for():
    assert raises_without_match("with pytest.raises(ValueError):\n    pass\n") == [1]
    assert raises_without_match("with pytest.raises(ValueError, match='x'):\n    pass\n") == []
    # built from parts, so that this file does not hold what it forbids
    assert ISSUE_NUMBER.search("fixed for issue " + "7") and ISSUE_NUMBER.search("(issue #" + "12)")
    assert not ISSUE_NUMBER.search("an issue with 3 ranks")


@pytest.mark.quick
def test_every_pytest_raises_names_its_message():
    missing = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in (ROOT / "tests").rglob("*.py")
        for line in raises_without_match(path.read_text())
    ]
    assert not missing, "pytest.raises without match=:\n" + "\n".join(sorted(missing))


def test_no_issue_numbers_in_code_tests_or_docs():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files(".py", ".md")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "issue numbers (say why instead):\n" + "\n".join(found)
