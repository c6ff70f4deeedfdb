"""The advisor on the findings corpus (see score.py): zero warnings on every correct program, and
every planted problem found at the user's line.

Each script runs under ``tpu-debug run`` in its own process, as a user runs it. A script the
tool does not yet get right is listed in KNOWN with the reason; it is expected to fail
(strictly: a fix that makes it pass turns the test red until it is taken off the list).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import score  # noqa: E402

# script -> why the tool does not get it right yet
KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("path", score.scripts(), ids=lambda p: p.stem)
def test_corpus_script(path, tmp_path, request):
    if path.name in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[path.name], strict=True))
    findings, error = score.run(path, tmp_path)
    result = score.score(path, findings, error)
    assert result.error is None, result.error
    assert not result.false, f"findings nobody expected: {result.false}"
    assert not result.missed, f"planted problems not found at their line: {result.missed} (found: " + \
        ", ".join(f"{f.kind}@{score._line(f, path) or score._elsewhere(f)}" for f in findings) + ")"


def test_the_corpus_is_as_large_as_promised():
    expected = [score.expected(p) for p in score.scripts()]
    assert len(expected) >= 30
    assert sum(1 for e in expected if e.correct) >= 12
