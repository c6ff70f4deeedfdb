"""Signals delivered to ``tpu-debug run`` at seeded points of a training script, and what the run kept.

A point is (signal, seed). The seed picks a phase of the traced process's life and a
moment inside it, from a :class:`Timeline` measured on an undisturbed run of the same
script on this machine:

- ``import``: from the process start to the run directory appearing (Python, torch, jax
  and tpu_debug being imported; no run exists yet);
- ``enter``: from the run directory appearing to the script's first line (``trace()``
  setting up: the run database, the writer thread, the probes);
- ``first step``: the script building its model and running its first step, which
  compiles every op;
- ``steps``: the training loop, a marker event every step;
- ``close``: from the script's last line to ``tpu-debug run`` saying where the run is
  saved (the trace stopping its tracers and writing the rest of the run).

Each phase is entered by watching the child (its output, its run directory), so the
moment lands in the phase whatever this machine's speed; the phase it actually landed
in is read back from the child's own timestamps. :func:`run_point` returns a
:class:`PointResult` with what was measured and every expectation that did not hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("train_steps.py")
TRAIN_SECONDS = 2.0
PHASES = ("import", "enter", "first step", "steps", "close")
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
STATUS = {"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupted"}
EXIT_TIMEOUT = 180.0  # seconds a child may take to end after its signal (a hang fails the point)

# How much of the end of a run SIGKILL may take away. The writer commits what was recorded
# at least every commit_interval (0.25 s), so at any moment everything older than 0.25 s
# plus the time one batch takes to write is on disk. The batch write, and the writer
# thread waiting for the GIL and for a CPU, get another 0.25 s. When the traced program
# itself went without a step for a while just before the signal (no CPU for the process,
# on a machine whose 2 cores other test processes share), its writer could not commit
# either: that stall is added (see PointResult.stall).
COMMIT_INTERVAL = 0.25
LOSS_BOUND = COMMIT_INTERVAL + 0.25


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    env["PYTHONUNBUFFERED"] = "1"
    # XLA on CPU, as every test runs, even where a libtpu wheel is installed: jax would load
    # it, and its failure handler aborts the process (SIGABRT, "terminate called without an
    # active exception") when a Ctrl-C lands in the backward pass, with or without a trace
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


class Child:
    """``python -m tpu_debug run`` on the training script, its output stamped as it arrives."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.logdir = workdir / "tpu_debug_runs"
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpu_debug",
                "run",
                "--no-report",
                "--op-events",
                str(SCRIPT),
                str(TRAIN_SECONDS),
            ],
            cwd=workdir,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[tuple[float, str]] = []
        self.stderr: list[tuple[float, str]] = []
        self.run_dir_seen: float | None = None
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True),
            threading.Thread(target=self._watch_logdir, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, stream, into: list) -> None:
        for line in stream:
            with self._changed:
                into.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _watch_logdir(self) -> None:
        while self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if any(self.logdir.iterdir()):
                    with self._changed:
                        self.run_dir_seen = time.monotonic()
                        self._changed.notify_all()
                    return
            time.sleep(0.002)

    def wait_for(self, condition, timeout: float = 600.0) -> float | None:
        """The time ``condition()`` first held (None: the child ended or the wait timed out)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                seen = condition()
                if seen is not None:
                    return seen
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return None
                self._changed.wait(0.05)

    def line(self, prefix: str) -> float | None:
        """When a stdout line starting with ``prefix`` arrived (None: not yet)."""
        return next((t for t, text in self.stdout if text.startswith(prefix)), None)

    def stamps(self) -> dict[str, Any]:
        """The child's own clock at its milestones: start, each step marker, done."""
        out: dict[str, Any] = {"start": None, "steps": {}, "done": None}
        for _, text in self.stdout:
            words = text.split()
            if words[:1] == ["start"]:
                out["start"] = float(words[1])
            elif words[:1] == ["step"]:
                out["steps"][int(words[1])] = float(words[2])
            elif words[:1] == ["done"]:
                out["done"] = float(words[1])
        return out

    def saved(self) -> float | None:
        """When ``tpu-debug run`` said where the run is saved (the trace had closed it)."""
        return next((t for t, text in self.stderr if text.startswith("run saved in")), None)

    def finish(self, timeout: float) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        for thread in self._threads:
            thread.join(30)
        return code


@dataclasses.dataclass(frozen=True)
class Timeline:
    """How long each phase lasted in an undisturbed run on this machine (seconds)."""

    phases: dict[str, float]

    @classmethod
    def measure(cls, workdir: Path) -> Timeline:
        child = Child(workdir)
        code = child.finish(EXIT_TIMEOUT + 600)
        stamps = child.stamps()
        problems = []
        if code != 0:
            problems.append(f"exit status {code}")
        if (
            stamps["done"] is None
            or not stamps["steps"]
            or child.run_dir_seen is None
            or child.saved() is None
        ):
            problems.append("missing milestones")
        if problems:
            err = "\n".join(text for _, text in child.stderr[-30:])
            raise AssertionError(f"the undisturbed training run went wrong ({', '.join(problems)}):\n{err}")
        phases = {
            "import": child.run_dir_seen - child.started,
            "enter": stamps["start"] - child.run_dir_seen,
            "first step": stamps["steps"][1] - stamps["start"],
            "steps": stamps["done"] - stamps["steps"][1],
            "close": child.saved() - stamps["done"],
        }
        return cls({k: max(v, 0.001) for k, v in phases.items()})


@dataclasses.dataclass
class PointResult:
    signal: str
    seed: int
    target_phase: str
    phase: str = ""
    delay: float = 0.0  # seconds after the phase began that the signal was sent
    returncode: int | None = None
    run: bool = False
    opened: bool = False
    status: str | None = None
    markers_printed: int = 0
    markers_recorded: int | None = None
    # the signal's time (or the script's end, if sooner) minus the newest event's time
    gap: float | None = None
    # the longest time between two step markers in the second before the signal: how long the
    # traced process went without a CPU (or held up otherwise) just then
    stall: float | None = None
    # a SIGINT that Python dropped in jax's gc callback before tpu_debug's handler was in place
    dropped: bool = False
    # the process aborted in C++ ("terminate called without an active exception") as the
    # KeyboardInterrupt unwound the backward pass: a crash of the runtime, not of the run's
    # lifecycle (it happens without a trace too); the run must then read 'killed' and lose no
    # more than SIGKILL may
    aborted: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def _anchor(child: Child, phase: str) -> float | None:
    """When ``phase`` began in this child (waits for it)."""
    if phase == "import":
        return child.started
    if phase == "enter":
        return child.wait_for(lambda: child.run_dir_seen)
    if phase == "first step":
        return child.wait_for(lambda: child.line("start"))
    if phase == "steps":
        return child.wait_for(lambda: child.line("step 1 "))
    return child.wait_for(lambda: child.line("done"))


def _phase_of(moment: float, child: Child, stamps: dict[str, Any]) -> str:
    """The phase ``moment`` fell in, from the child's own timestamps."""
    first = stamps["steps"].get(1)
    saved = child.saved()
    for phase, ended in (
        ("import", child.run_dir_seen),
        ("enter", stamps["start"]),
        ("first step", first),
        ("steps", stamps["done"]),
        ("close", saved),
    ):
        if ended is None or moment < ended:
            return phase
    return "exit"


def run_point(workdir: Path, signame: str, seed: int, timeline: Timeline) -> PointResult:
    """Run the script, send ``signame`` at the moment ``seed`` picks, and check the run."""
    rng = random.Random(f"{signame}/{seed}")
    target = PHASES[seed % len(PHASES)]
    fraction = rng.random()
    result = PointResult(signame, seed, target)
    child = Child(workdir)
    try:
        anchor = _anchor(child, target)
        if anchor is None:
            result.problems.append(f"the child ended before the {target!r} phase began")
            anchor = time.monotonic()
        moment = anchor + fraction * timeline.phases[target]
        time.sleep(max(0.0, moment - time.monotonic()))
        sent = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.proc.pid, SIGNALS[signame])
    finally:
        result.returncode = child.finish(EXIT_TIMEOUT)
    result.delay = sent - anchor
    stamps = child.stamps()
    result.phase = _phase_of(sent, child, stamps)
    result.markers_printed = len(stamps["steps"])
    if result.returncode is None:
        result.problems.append(f"the child did not end within {EXIT_TIMEOUT:.0f} s of {signame}")
    _check_run(result, child, stamps, sent)
    if result.problems:
        tail = "\n".join(text for _, text in child.stderr[-15:])
        result.problems.append(f"(child stderr, last lines)\n{tail}")
    return result


def _check_run(result: PointResult, child: Child, stamps: dict[str, Any], sent: float) -> None:
    signame = result.signal
    sig = SIGNALS[signame]
    runs = sorted(p for p in child.logdir.glob("*/run.db")) if child.logdir.is_dir() else []
    if len(runs) > 1:
        result.problems.append(f"{len(runs)} runs recorded, expected one: {runs}")
    if not runs:
        # acceptable only if the signal came before trace() had made the run
        if stamps["start"] is not None:
            result.problems.append("no run recorded, although the script had started")
        if signame == "SIGKILL" and result.returncode != -sig:
            result.problems.append(f"exit status {result.returncode}, expected {-sig}")
        return
    result.run = True
    db = runs[0]
    status = _open_and_read(result, db)
    if status is None:
        return
    result.status = status
    # 'finished' is right only for a signal sent once the script had run its last line, or
    # for a Ctrl-C that Python itself dropped before tpu_debug was in charge (see _dropped)
    ended = stamps["done"] is not None and sent >= stamps["done"]
    result.dropped = status == "finished" and signame == "SIGINT" and _dropped(child)
    result.aborted = (
        signame == "SIGINT"
        and result.returncode == -signal.SIGABRT
        and any("terminate called without an active exception" in line for _, line in child.stderr)
    )
    expected = "killed" if result.aborted else STATUS[signame]
    if status != expected and not (status == "finished" and (ended or result.dropped)):
        result.problems.append(
            f"status {status!r}, expected {STATUS[signame]!r}"
            + (" (or 'finished': the script had ended)" if ended else "")
        )
    expected_codes = {-sig} if signame == "SIGKILL" else {128 + sig}
    if result.aborted:
        expected_codes = {-signal.SIGABRT}
    if signame == "SIGINT":
        # death by SIGINT, which a shell shows as 130 too: seen twice in about 100 points, after
        # tpu-debug run had saved the run, before re-sent signals were limited to while
        # tpu_debug's handlers are in place; not seen since (docs/reliability.md)
        expected_codes.add(-sig)
    if status == "finished" and signame != "SIGKILL":
        expected_codes |= {0, -sig}  # the script had ended; the signal came during or after the close
    if result.returncode not in expected_codes:
        result.problems.append(f"exit status {result.returncode}, expected one of {sorted(expected_codes)}")
    _check_loss(result, db, stamps, sent)


def _dropped(child: Child) -> bool:
    """Whether Python's own SIGINT handler raised KeyboardInterrupt inside jax's gc callback,
    where Python drops it ("Exception ignored in: <function _xla_gc_callback ...>"). That
    happens to any program importing jax, before ``trace()`` puts in a handler that sends the
    signal again (tpu_debug/tracing.py, ``_unraisable``); a drop inside a trace would show
    that handler's frame."""
    text = "\n".join(line for _, line in child.stderr)
    for block in text.split("Exception ignored in: ")[1:]:
        block = block.split("\n\n")[0]
        if block.startswith("<function _xla_gc_callback") and "KeyboardInterrupt" in block:
            return "tpu_debug" not in block
    return False


def _open_and_read(result: PointResult, db: Path) -> str | None:
    """Open the run as ``tpu-debug report`` and the TUI do; returns its status."""
    from tpu_debug.tui.screens.overview import finding_lines, overview_data

    import tpu_debug
    from tpu_debug.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["report", "--plain", str(db.parent)])
    except BaseException as exc:  # noqa: BLE001 - recorded as the point's failure
        result.problems.append(f"tpu-debug report raised {type(exc).__name__}: {exc}")
        return None
    if code != 0 or "Traceback" in out.getvalue() + err.getvalue():
        result.problems.append(f"tpu-debug report exited {code}: {err.getvalue().strip()}")
        return None
    try:
        session = tpu_debug.open_run(db.parent)
        try:
            meta = session.metadata()
            data = overview_data(session, meta.cwd)
            finding_lines(session, meta.cwd)
            session.ops()
            session.compiles()
            session.events(limit=100)
        finally:
            session.close()
    except BaseException as exc:  # noqa: BLE001
        result.problems.append(f"reading the run as the TUI does raised {type(exc).__name__}: {exc}")
        return None
    result.opened = True
    status_line = next((line for line in out.getvalue().splitlines() if line.startswith("status")), "")
    if meta.status not in status_line or data.metadata.status != meta.status:
        result.problems.append(f"the report's status line {status_line!r} is not {meta.status!r}")
    return meta.status


def _check_loss(result: PointResult, db: Path, stamps: dict[str, Any], sent: float) -> None:
    """Markers printed but not recorded, and how old the newest recorded event was at the signal."""
    import sqlite3

    from tpu_debug.tracers.store import connect

    conn = connect(db)
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        origin = json.loads(meta["clock_origin"]) if "clock_origin" in meta else None
        recorded = conn.execute(
            "SELECT count(*) FROM events e JOIN transfers t ON t.event_id = e.id "
            "WHERE e.kind = 'transfer' AND e.name = 'item'"
        ).fetchone()[0]
        newest = max(
            (
                row[0]
                for row in conn.execute("SELECT max(ts) FROM events UNION ALL SELECT max(ts) FROM executions")
                if row[0] is not None
            ),
            default=None,
        )
    except sqlite3.DatabaseError as exc:
        result.problems.append(f"reading the run's markers: {exc}")
        return
    finally:
        conn.close()
    result.markers_recorded = recorded
    if result.signal != "SIGKILL" and not result.aborted and recorded < result.markers_printed:
        result.problems.append(
            f"{result.markers_printed} step markers printed but {recorded} recorded: "
            f"{result.signal} must lose nothing"
        )
    if result.phase not in ("steps", "close"):
        return  # before the training loop nothing is recorded steadily: no loss to measure
    if origin is None or newest is None:
        result.problems.append("the run has no clock_origin or no event to measure the loss with")
        return
    # events came every few microseconds until the signal, or until the script's last line
    ended = sent if result.phase == "steps" else min(sent, stamps["done"])
    result.gap = ended - (origin + newest)
    times = sorted(t for t in stamps["steps"].values() if ended - 1.0 <= t <= ended) + [ended]
    result.stall = max((b - a for a, b in itertools.pairwise(times)), default=None)
    # a process that got no CPU for a while could not commit meanwhile either
    bound = LOSS_BOUND + (result.stall or 0.0)
    if result.gap > bound:
        result.problems.append(
            f"the newest event recorded is {result.gap:.3f} s older than the {result.signal} or the "
            f"script's end (at most {LOSS_BOUND} s may be lost, plus the {result.stall:.3f} s the "
            "script went without a step just then)"
        )


def summarize(results: list[dict]) -> str:
    """The markdown table of docs/reliability.md from the JSON lines the suite wrote."""
    lines = [
        (
            "| signal | points (seeds) | phases hit | runs made | runs that opened | status right "
            "| events lost, max / median (s) | exit status |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for signame in SIGNALS:
        rows = [r for r in results if r["signal"] == signame]
        if not rows:
            continue
        seeds = len({r["seed"] for r in rows})
        phases: dict[str, int] = {}
        for r in rows:
            phases[r["phase"]] = phases.get(r["phase"], 0) + 1
        made = [r for r in rows if r["run"]]
        opened = sum(r["opened"] for r in made)
        right = sum(
            1
            for r in made
            if not r.get("dropped")
            and not r.get("aborted")
            and not any(p.startswith("status ") for p in r["problems"])
        )
        statuses: dict[str, int] = {}
        for r in made:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        gaps = [max(r["gap"], 0.0) for r in rows if r["gap"] is not None]
        lost = (
            f"{max(gaps):.3f} / {statistics.median(gaps):.3f} ({len(gaps)} points in the loop or close)"
            if gaps
            else "-"
        )
        codes: dict[Any, int] = {}
        for r in rows:
            codes[r["returncode"]] = codes.get(r["returncode"], 0) + 1
        lines.append(
            f"| {signame} | {len(rows)} ({seeds}) | "
            + ", ".join(f"{p} {n}" for p, n in sorted(phases.items(), key=lambda kv: _order(kv[0])))
            + f" | {len(made)} | {opened} | {right} ("
            + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))
            + f") | {lost} | "
            + ", ".join(f"{c} ×{n}" for c, n in sorted(codes.items(), key=lambda kv: str(kv[0])))
            + " |"
        )
    aborted = sum(r.get("aborted", False) for r in results)
    if aborted:
        lines.append("")
        lines.append(
            f'{aborted} SIGINT point(s) in the training loop: the process aborted in C++ ("terminate '
            'called without an active exception") as the KeyboardInterrupt unwound the backward pass, '
            "a runtime crash that happens without a trace too; the run opened and read 'killed'."
        )
    dropped = sum(r.get("dropped", False) for r in results)
    if dropped:
        lines.append("")
        lines.append(
            f"{dropped} SIGINT point(s) in the import phase: Python dropped the KeyboardInterrupt in jax's "
            "gc callback before tpu_debug's handler was in place, and the script ran to its end "
            "(status finished)."
        )
    return "\n".join(lines)


def _order(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


if __name__ == "__main__":
    # python tests/faults/fault_injection.py REPORT.jsonl: the table of docs/reliability.md
    with open(sys.argv[1]) as f:
        print(summarize([json.loads(line) for line in f if line.strip()]))
