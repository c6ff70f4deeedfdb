"""Score the advisor on the findings corpus: realistic scripts, each with its expected findings.

A script under ``scripts/`` is run as a user runs it (``tpu-debug run``, in its own
process) and its findings are compared with what the script says it should get:

- ``# corpus: correct`` in its header: a correct program; any warning or error is a false
  positive.
- ``# EXPECT: kind[, kind]`` at the end of a line: a planted problem, found when a warning
  or an error of that kind is located at that line (several lines marked with one kind are
  alternatives: the finding may point at any of them; an ``info`` finding is not counted,
  either way). Any other warning or error is a false positive.
- ``# corpus-options: ...``: options for ``tpu-debug run`` (``--divergence``, ...).

The expectations were written from what a TPU engineer would flag in each script, never
from what the tool printed. ``python tests/corpus/score.py`` prints every script's result
and the totals; ``tests/corpus/test_corpus.py`` asserts them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: warm_python
import warm_python

SCRIPTS = Path(__file__).parent / "scripts"
_EXPECT = re.compile(r"#\s*EXPECT:\s*([\w, ]+)")
_OPTIONS = re.compile(r"#\s*corpus-options:\s*(.+)")
_SERIOUS = ("warning", "error")


@dataclasses.dataclass
class Expected:
    """What a script should get: ``kinds`` -> the lines any one of which may carry it."""

    correct: bool
    kinds: dict[str, set[int]]
    options: list[str]


@dataclasses.dataclass
class Result:
    script: str
    correct: bool
    found: list[str]  # "kind@line", expected and found
    missed: list[str]  # "kind@lines", expected and not found
    false: list[str]  # "kind@line: title", serious findings nobody expected
    error: str | None = None  # the run itself failed

    @property
    def ok(self) -> bool:
        return self.error is None and not self.missed and not self.false


def expected(path: Path) -> Expected:
    text = path.read_text()
    kinds: dict[str, set[int]] = {}
    options: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            for kind in (k.strip() for k in m.group(1).split(",")):
                if kind:
                    kinds.setdefault(kind, set()).add(number)
        m = _OPTIONS.search(line)
        if m:
            options += shlex.split(m.group(1))
    correct = "# corpus: correct" in text
    if correct == bool(kinds):
        raise ValueError(f"{path.name}: a script is either '# corpus: correct' or has '# EXPECT:' lines")
    return Expected(correct, kinds, options)


def run(path: Path, logdir: Path, timeout: float = 240.0, cache: Path | None = None) -> tuple[list, str | None]:
    """The script's findings under ``tpu-debug run`` (and the run's error, if it failed);
    ``cache``: run with the persistent compile cache in that directory (else as the
    environment says; the test suite turns the cache off)."""
    exp = expected(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    if cache is not None:
        env.update(TPU_DEBUG_COMPILE_CACHE="1", TPU_DEBUG_COMPILE_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(logdir), *exp.options, str(path.resolve())]
    proc = warm_python.run(cmd, timeout=timeout, env=env, cwd=path.resolve().parent)
    runs = sorted(logdir.glob("*/run.db"))
    if proc.returncode != 0 or not runs:
        return [], f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    import tpu_debug

    run_ = tpu_debug.open_run(runs[-1].parent)
    try:
        return list(run_.findings()), None
    finally:
        getattr(run_, "close", lambda: None)()


def score(path: Path, findings: list, error: str | None = None) -> Result:
    exp = expected(path)
    result = Result(path.name, exp.correct, [], [], [], error)
    used: set[int] = set()
    for kind, lines in sorted(exp.kinds.items()):
        hit = next((i for i, f in enumerate(findings)
                    if f.kind == kind and f.severity in _SERIOUS and _line(f, path) in lines), None)
        if hit is None:
            result.missed.append(f"{kind}@{','.join(map(str, sorted(lines)))}")
        else:
            used.add(hit)
            result.found.append(f"{kind}@{_line(findings[hit], path)}")
    for i, f in enumerate(findings):
        if i in used or f.severity not in _SERIOUS:
            continue
        if f.kind in exp.kinds and _line(f, path) in exp.kinds[f.kind]:
            continue  # a second finding of an expected kind at an expected line
        where = _line(f, path) if _line(f, path) is not None else _elsewhere(f)
        result.false.append(f"{f.kind}@{where}: {f.title[:120]}")
    return result


def _line(finding, path: Path) -> int | None:
    loc = finding.evidence.location
    if loc is None or os.path.realpath(loc.file) != os.path.realpath(path):
        return None
    return loc.line


def _elsewhere(finding) -> str:
    loc = finding.evidence.location
    return "nowhere" if loc is None else f"{os.path.basename(loc.file)}:{loc.line}"


def identity(path: Path, findings: list) -> list[tuple]:
    """What two runs of a script must agree on: each finding's kind, severity, line and subject
    (not its figures: a compile read back from the cache takes another time than one compiled)."""
    return sorted((f.kind, f.severity, _line(f, path) or _elsewhere(f), f.subject) for f in findings)


def scripts() -> list[Path]:
    return sorted(SCRIPTS.glob("*.py"))


def totals(results: list[Result]) -> dict[str, float]:
    tp = sum(len(r.found) for r in results)
    fn = sum(len(r.missed) for r in results)
    fp = sum(len(r.false) for r in results)
    correct = [r for r in results if r.correct]
    return {
        "scripts": len(results),
        "correct programs": len(correct),
        "correct programs with no warning": sum(1 for r in correct if not r.false and r.error is None),
        "planted problems": tp + fn,
        "found at the user's line": tp,
        "false positives": fp,
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "failed runs": sum(1 for r in results if r.error is not None),
    }


def main() -> int:
    """``score.py``: every script's result and the totals. ``score.py --cache``: each script run
    twice with one new persistent compile cache, cold then warm; a script whose findings differ
    between the two is listed (and the totals are the cold run's)."""
    cached = "--cache" in sys.argv[1:]
    results, changed = [], []
    for path in scripts():
        with tempfile.TemporaryDirectory() as tmp:
            findings, error = run(path, Path(tmp) / "cold", cache=Path(tmp) / "cache" if cached else None)
            if cached and error is None:
                warm, warm_error = run(path, Path(tmp) / "warm", cache=Path(tmp) / "cache")
                if warm_error is not None or identity(path, warm) != identity(path, findings):
                    changed.append(path.name)
                    print(f"CACHE {path.name}: cold {identity(path, findings)} warm "
                          f"{identity(path, warm) if warm_error is None else warm_error[-300:]}", flush=True)
        r = score(path, findings, error)
        results.append(r)
        mark = "ok " if r.ok else "BAD"
        print(f"{mark} {r.script:34} found {r.found} missed {r.missed} false {r.false}"
              + (f" ERROR {r.error[-300:]}" if r.error else ""), flush=True)
    for name, value in totals(results).items():
        print(f"{name:34} {value:.3f}" if isinstance(value, float) else f"{name:34} {value}")
    if cached:
        print(f"{'findings changed by a warm cache':34} {len(changed)} {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
