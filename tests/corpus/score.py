"""Score the advisor on the findings corpus: realistic scripts, each with its expected findings.

A script under ``scripts/`` is run as a user runs it (``tpu-debug run``, in its own
process) and its findings are compared with what the script says it should get:

- ``# corpus: correct`` in its header: a correct program; any warning or error is a false
  positive.
- ``# EXPECT: kind[, kind]`` at the end of a line: a planted problem, found when a warning
  or an error of that kind is located at that line (several lines marked with one kind are
  alternatives: the finding may point at any of them; an ``info`` finding is not counted,
  either way). Two causes of one kind in a script are told apart by a name after the kind
  (``# EXPECT: h2d_every_step/noise``): each is a planted problem of its own. Any other warning or error is a false positive. One planted problem is one
  cause, so it must be found once: a second warning or error of its kind at its lines is a
  cause split into several findings, and fails the script.
- ``# corpus-options: ...``: options for ``tpu-debug run`` (``--divergence``, ...).

The expectations were written from what a TPU engineer would flag in each script, never
from what the tool printed. ``python tests/corpus/score.py`` prints every script's result
and the totals; ``tests/corpus/test_corpus.py`` asserts them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: warm_python
import warm_python

SCRIPTS = Path(__file__).parent / "scripts"
_EXPECT = re.compile(r"#\s*EXPECT:\s*([\w,/ ]+)")
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
    split: list[str] = dataclasses.field(default_factory=list)  # "kind@lines: n findings", one cause found n times

    @property
    def ok(self) -> bool:
        return self.error is None and not self.missed and not self.false and not self.split


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


class Recorded(NamedTuple):
    """A script's run: its findings, the run's error (None when it ran), and its step verdict
    (the bound of its steady steps, ``"host-bound"``...; None without one)."""

    findings: list
    error: str | None
    bound: str | None = None


def run(path: Path, logdir: Path, timeout: float = 240.0, cache: Path | None = None) -> Recorded:
    """The script's findings under ``tpu-debug run``, the run's error if it failed, and its
    step verdict; ``cache``: run with the persistent compile cache in that directory (else as
    the environment says; the test suite turns the cache off)."""
    exp = expected(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    if cache is not None:
        env.update(TPU_DEBUG_COMPILE_CACHE="1", TPU_DEBUG_COMPILE_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(logdir), *exp.options, str(path.resolve())]
    proc = warm_python.run(cmd, timeout=timeout, env=env, cwd=path.resolve().parent)
    runs = sorted(logdir.glob("*/run.db"))
    if proc.returncode != 0 or not runs:
        return Recorded([], f"exit {proc.returncode}: {proc.stderr[-1500:]}")
    import tpu_debug
    from tpu_debug.tracers.reading.step_phases import step_phases
    from tpu_debug.tracers.reading.step_time import verdict

    run_ = tpu_debug.open_run(runs[-1].parent)
    try:
        steps = run_.steps()
        v = verdict(steps, step_phases(steps))
        return Recorded(list(run_.findings()), None, v.bound if v is not None else None)
    finally:
        getattr(run_, "close", lambda: None)()


def score(path: Path, findings: list, error: str | None = None) -> Result:
    exp = expected(path)
    result = Result(path.name, exp.correct, [], [], [], error)
    used: set[int] = set()
    for planted, lines in sorted(exp.kinds.items()):
        kind = planted.split("/")[0]
        hit = next((i for i, f in enumerate(findings)
                    if f.kind == kind and f.severity in _SERIOUS and _line(f, path) in lines), None)
        if hit is None:
            result.missed.append(f"{kind}@{','.join(map(str, sorted(lines)))}")
        else:
            used.add(hit)
            result.found.append(f"{kind}@{_line(findings[hit], path)}")
        # one planted problem is one cause: found once, not split into findings of its kind
        same = [f for f in findings if f.kind == kind and f.severity in _SERIOUS and _line(f, path) in lines]
        if len(same) > 1:
            result.split.append(f"{kind}@{','.join(map(str, sorted(lines)))}: {len(same)} findings")
    for i, f in enumerate(findings):
        if i in used or f.severity not in _SERIOUS:
            continue
        if any(p.split("/")[0] == f.kind and _line(f, path) in lines for p, lines in exp.kinds.items()):
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


def identity(path: Path, findings: list, bound: str | None = None) -> list[tuple]:
    """What two runs of a script must agree on: each finding's kind, severity, line and subject
    (not its figures: a compile read back from the cache takes another time than one compiled),
    and, when the step verdict's bound is given, whether the steps are compile-bound: the part
    of the step a warm cache changes. Which of the other parts leads (dispatch or the host's
    other work) is this machine's timing, which the load of other processes moves between any
    two runs of a tiny model, cold or warm alike."""
    out = sorted((f.kind, f.severity, _line(f, path) or _elsewhere(f), f.subject) for f in findings)
    if bound is None:
        return out
    return out + [("verdict", bound if bound == "compile-bound" else "not compile-bound")]


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
        "causes split into several findings": sum(len(r.split) for r in results),
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "failed runs": sum(1 for r in results if r.error is not None),
    }


def _one(path: Path, cached: bool) -> tuple[Result, str | None]:
    """A script's result, and the line saying how a warm cache changed it (None: it did not)."""
    with tempfile.TemporaryDirectory() as tmp:
        cold = run(path, Path(tmp) / "cold", cache=Path(tmp) / "cache" if cached else None)
        note = None
        if cached and cold.error is None:
            warm = run(path, Path(tmp) / "warm", cache=Path(tmp) / "cache")
            was, now = identity(path, cold.findings, cold.bound), identity(path, warm.findings, warm.bound)
            if warm.error is not None or now != was:
                note = (f"CACHE {path.name}: cold {was} warm "
                        f"{now if warm.error is None else warm.error[-300:]}")
    return score(path, cold.findings, cold.error), note


def main() -> int:
    """``score.py``: every script's result and the totals. ``score.py --cache``: each script run
    twice with one new persistent compile cache, cold then warm; a script whose findings or step
    verdict differ between the two is listed (and the totals are the cold run's).
    ``score.py NAME...``: only the scripts whose file name holds one of the NAMEs.
    ``--jobs N``: N scripts at a time (each is its own process; 1 by default)."""
    args = sys.argv[1:]
    cached = "--cache" in args
    jobs = 1
    if "--jobs" in args:
        i = args.index("--jobs")
        jobs = int(args[i + 1])
        del args[i:i + 2]
    only = [a for a in args if not a.startswith("--")]
    paths = [p for p in scripts() if not only or any(name in p.name for name in only)]
    results, changed = [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for path, (r, note) in zip(paths, pool.map(lambda p: _one(p, cached), paths)):
            if note is not None:
                changed.append(path.name)
                print(note, flush=True)
            results.append(r)
            mark = "ok " if r.ok else "BAD"
            print(f"{mark} {r.script:34} found {r.found} missed {r.missed} false {r.false}"
                  + (f" split {r.split}" if r.split else "")
                  + (f" ERROR {r.error[-300:]}" if r.error else ""), flush=True)
    for name, value in totals(results).items():
        print(f"{name:34} {value:.3f}" if isinstance(value, float) else f"{name:34} {value}")
    if cached:
        print(f"{'findings changed by a warm cache':34} {len(changed)} {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
