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
# Scripts run twice with one persistent compile cache, cold then warm, in the default run: the
# second run reads every program back instead of compiling it, and must get the same findings.
# One per way a program is compiled (lazy fused graphs, a dynamo graph, eager ops), each with
# shapes that change, the findings a cache could hide; test_the_cache_changes_no_finding (slow)
# runs every script so.
CACHED = ("p_lazy_unpadded_sentences.py", "p_compiled_changing_batch.py", "p_variable_length_batches.py")


def _check(path, findings, error) -> None:
    result = score.score(path, findings, error)
    assert result.error is None, result.error
    assert not result.false, f"findings nobody expected: {result.false}"
    assert not result.missed, f"planted problems not found at their line: {result.missed} (found: " + \
        ", ".join(f"{f.severity} {f.kind}@{score._line(f, path) or score._elsewhere(f)}" for f in findings) + ")"


@pytest.mark.parametrize("path", score.scripts(), ids=lambda p: p.stem)
def test_corpus_script(path, tmp_path, request):
    if path.name in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[path.name], strict=True))
    cache = tmp_path / "cache" if path.name in CACHED else None
    findings, error = score.run(path, tmp_path / "cold", cache=cache)
    _check(path, findings, error)
    if cache is not None:
        warm, error = score.run(path, tmp_path / "warm", cache=cache)
        _check(path, warm, error)
        assert score.identity(path, warm) == score.identity(path, findings), "a warm compile cache changed the findings"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in score.scripts() if p.name not in CACHED], ids=lambda p: p.stem)
def test_the_cache_changes_no_finding(path, tmp_path):
    cold, error = score.run(path, tmp_path / "cold", cache=tmp_path / "cache")
    assert error is None, error
    warm, error = score.run(path, tmp_path / "warm", cache=tmp_path / "cache")
    assert error is None, error
    assert score.identity(path, warm) == score.identity(path, cold)


def test_the_corpus_is_as_large_as_promised():
    expected = [score.expected(p) for p in score.scripts()]
    assert len(expected) >= 30
    assert sum(1 for e in expected if e.correct) >= 12
