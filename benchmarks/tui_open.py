"""TUI on a big run: time to the first screen and to each view, on a run of 1,000,000 events.

The run is generated straight into a fresh store (the writer creates the
database, then rows go in with bulk SQL): 489,000 op executions, 300,000
transfers, 180,000 divergence records, 20,000 compiles (a 5,000-compile
recompile storm on one op, 15,000 over 99 other ops) with their key diffs,
10,000 CPU fallbacks and 1,000 graph breaks; 300 programs of about 200 HLO
lines. Then, in this process, a headless ``TpuDebugApp`` (Textual's
``run_test`` pilot at 120x36) is opened on it ``--repeat`` times and timed:

- first screen: from ``open_run`` to the overview showing its findings;
- recompiles: key ``2`` until the ranked ops, the storm's first history page
  and the selected recompile's detail (diff, source, HLO) are shown;
- then ops (``3``), transfers (``4``), divergence (``5``) and the HLO viewer
  (``h`` on a compile), each until its data is on screen.

Importing tpu_debug is not part of these times; it is measured apart, in a
fresh interpreter: as ``import tpu_debug`` (torch, jax) and as the ``tpu-debug``
script's reading verbs import it (read-only mode, neither).

``--e2e`` adds what a user sees: the real ``tpu-debug tui RUN`` command started in a
real terminal (a private tmux server, 120x36), timed from the moment the command
starts to the moment ``tmux capture-pane`` shows the overview with its findings,
then after key ``2`` until the recompile storm's history and the selected
recompile's detail and HLO are drawn. Process start, imports, opening the run and
drawing are all in it. Target: open and navigable in < 2 s.

    python benchmarks/tui_open.py [--events 1000000] [--repeat 3] [--keep DIR]
                                  [--e2e] [--e2e-repeat 5] [--cli COMMAND] [--no-pilot]
                                  [--wait-idle SECONDS]

``--keep DIR`` keeps the generated run in DIR and reuses it when it is already there.
``--wait-idle SECONDS`` (for a machine others use too) waits, before each opening and
each start, for a second in which the CPUs are at least 90 % idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tui import TpuDebugApp

import tpu_debug

EVENTS_INSERT = (
    "INSERT INTO events (id, kind, ts, mode, thread, location_id, name, seconds, program_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SHARES = {  # of the events
    "executions": 0.489,
    "transfer": 0.300,
    "divergence": 0.180,
    "compile": 0.020,
    "fallback": 0.010,
    "graph_break": 0.001,
}


def _hlo(name: str, n: int) -> str:
    lines = [
        f"HloModule jit_{name.split('.')[0]}, is_scheduled=true",
        "",
        f"ENTRY %main (p0: f32[{n},128]) -> f32[{n},128] {{",
    ]
    lines.append(f"  %p0 = f32[{n},128]{{1,0}} parameter(0)")
    for i in range(1, 200):
        lines.append(
            f"  %add.{i} = f32[{n},128]{{1,0}} add(%{'p0' if i == 1 else f'add.{i - 1}'}, %p0), "
            f'metadata={{op_name="jit({name})/aten::{name}/add"}}'
        )
    lines.append(f"  ROOT %out = f32[{n},128]{{1,0}} copy(%add.199)")
    lines.append("}")
    return "\n".join(lines)


def generate(run_dir: Path, events: int, seed: int = 0) -> Path:
    """Write a run of ``events`` events into ``run_dir``; returns its run.db."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    db = run_dir / DB_NAME
    meta = {
        "name": "big",
        "platform": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "argv": ["train.py"],
        "cwd": str(run_dir),
        "start_time": "2026-01-31T12:00:00.000+00:00",
    }
    RunWriter(db, meta).close({"status": "finished", "exit_status": 0, "duration": 600.0})
    n = {k: int(events * share) for k, share in SHARES.items()}
    n["executions"] += events - sum(n.values())
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    source = run_dir / "train.py"
    source.write_text("".join(f"x{i} = step({i})\n" for i in range(1, 201)))
    conn.executemany(
        "INSERT INTO locations (id, file, line, function) VALUES (?, ?, ?, ?)",
        [(i, str(source), i * 3, "step") for i in range(1, 51)],
    )
    ops = ["mul.Tensor"] + [f"op{i}.default" for i in range(99)]
    programs = []
    for pid in range(1, 301):
        name = ops[pid % len(ops)]
        programs.append((pid, f"{pid:064x}", "eager", name, f"module @{name}", _hlo(name, 8 + pid), 202))
    conn.executemany(
        "INSERT INTO programs (id, hash, mode, name, stablehlo, hlo, instructions) VALUES (?, ?, ?, ?, ?, ?, ?)",
        programs,
    )
    ids = iter(range(1, events + 10))
    duration = 600.0

    def ts() -> float:
        return rng.random() * duration

    # compiles: the storm first (id order = time order within it), then the rest
    storm = 5000
    compile_rows, compile_detail, diffs = [], [], []
    previous: dict[str, tuple[int, int]] = {}
    for i in range(n["compile"]):
        name = "mul.Tensor" if i < storm else ops[1 + i % 99]
        eid = next(ids)
        length = previous.get(name, (0, 0))[1] + 1
        compile_rows.append(
            (eid, "compile", i * duration / n["compile"], "eager", 1, 1 + i % 50, name, 0.02, 1 + i % 300)
        )
        prev = previous.get(name)
        compile_detail.append(
            (
                eid,
                f"{name}(float32[{length},128])",
                json.dumps([["self", [length, 128], "float32", None]]),
                prev[0] if prev else None,
                name,
            )
        )
        if prev:
            diffs.append((eid, 0, "arg 0 'self'", f"f32[{prev[1]},128]", f"f32[{length},128]"))
        previous[name] = (eid, length)
    conn.executemany(EVENTS_INSERT, compile_rows)
    conn.executemany(
        "INSERT INTO compiles (event_id, signature, args, previous_id, identity) VALUES (?, ?, ?, ?, ?)",
        compile_detail,
    )
    conn.executemany(
        "INSERT INTO key_diffs (event_id, position, field, before, now) VALUES (?, ?, ?, ?, ?)", diffs
    )

    def kind_rows(kind: str, count: int, name_of, seconds: float | None):
        for i in range(count):
            yield (next(ids), kind, ts(), "eager", 1, 1 + i % 50, name_of(i), seconds, None)

    # transfers
    t_ids = []

    def transfer_name(i: int) -> str:
        return ("item", "copy", "bool", "print")[i % 4]

    rows = list(kind_rows("transfer", n["transfer"], transfer_name, 1e-4))
    conn.executemany(EVENTS_INSERT, rows)
    t_ids = [(r[0], r[6]) for r in rows]
    conn.executemany(
        "INSERT INTO transfers (event_id, direction, nbytes, shape, dtype, implicit) VALUES (?, ?, ?, ?, ?, ?)",
        (
            (eid, "h2d" if op == "copy" else "d2h", 4096, "[32,32]", "float32", int(op != "copy"))
            for eid, op in t_ids
        ),
    )
    rows = list(kind_rows("divergence", n["divergence"], lambda i: ops[i % 100], None))
    conn.executemany(EVENTS_INSERT, rows)
    first = rows[len(rows) // 3][0]
    conn.executemany(
        "INSERT INTO divergences (event_id, measure, max_abs, max_rel, ulp, mismatched, nan_origin, tolerance, first, ratio) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (r[0], "local", e, e / 2, 3.0, int(e > 1e-5), 0, 1e-5, int(r[0] == first), e / 1e-5)
            for r in rows
            for e in (rng.random() * 2e-5,)
        ),
    )
    rows = list(kind_rows("fallback", n["fallback"], lambda i: "nonzero", 1e-3))
    conn.executemany(EVENTS_INSERT, rows)
    conn.executemany("INSERT INTO fallbacks (event_id, args) VALUES (?, ?)", ((r[0], "[]") for r in rows))
    rows = list(kind_rows("graph_break", n["graph_break"], lambda i: "forward", None))
    conn.executemany(EVENTS_INSERT, rows)
    conn.executemany(
        "INSERT INTO graph_breaks (event_id, reason) VALUES (?, ?)", ((r[0], "call to .item()") for r in rows)
    )
    # op executions: id order is time order
    base = next(ids)
    count = n["executions"]
    conn.executemany(
        "INSERT INTO executions (id, ts, mode, thread, location_id, name, seconds, program_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (base + i, i * duration / count, "eager", 1, 1 + i % 50, ops[i % 100], 2e-5, 1 + i % 300)
            for i in range(count)
        ),
    )
    conn.executemany(
        "INSERT INTO op_stats (id, mode, name, signature, program_id, count, seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            (pid, "eager", name, f"{name}(...)", pid, count // 300, count / 300 * 2e-5)
            for pid, _, _, name, *_ in programs
        ),
    )
    conn.execute("COMMIT")
    total = conn.execute(
        "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM executions)"
    ).fetchone()[0]
    conn.close()
    assert total == events, total
    return db


async def _until(pilot, condition, timeout: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the TUI did not show the data in time")
        await pilot.pause(0.005)


def measure(run_dir: Path) -> dict[str, tuple[float, float]]:
    """One opening of the TUI on ``run_dir``: (wall, CPU) seconds to each screen's data.
    CPU time is the whole process's (UI thread and workers): what the step costs, whatever
    else the machine is doing."""
    from textual.widgets import DataTable, OptionList

    times: dict[str, float] = {}
    cpu_times: dict[str, float] = {}

    async def main() -> None:
        start, cpu = time.perf_counter(), time.process_time()
        session = tpu_debug.open_run(run_dir)
        app = TpuDebugApp(session)
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.screen.query_one("#findings", OptionList).option_count > 0)
            times["first screen (overview)"] = time.perf_counter() - start
            cpu_times["first screen (overview)"] = time.process_time() - cpu

            async def view(key: str, label: str, ready) -> None:
                t, cpu = time.perf_counter(), time.process_time()
                await pilot.press(key)
                await _until(pilot, lambda: ready(app.screen))
                times[label] = time.perf_counter() - t
                cpu_times[label] = time.process_time() - cpu

            await view(
                "2",
                "recompiles: ranked + history + detail",
                lambda s: getattr(s, "_detail", None) is not None and s.query_one("#history").row_count > 0,
            )
            for d in (times, cpu_times):
                d["first screen + first navigation"] = (
                    d["first screen (overview)"] + d["recompiles: ranked + history + detail"]
                )
            await view("h", "HLO viewer", lambda s: getattr(s, "loaded", None) is not None)
            await pilot.press("escape")
            await view("3", "ops", lambda s: s.query_one("#ops", DataTable).row_count > 0)
            await view("4", "transfers", lambda s: bool(getattr(s, "sites", None)))
            await view("5", "divergence", lambda s: bool(getattr(s, "events", None)))
        session.close()

    asyncio.run(main())
    return {k: (v, cpu_times[k]) for k, v in times.items()}


def import_seconds(module: str = "tpu_debug.tui", repeat: int = 3, *, read_only: bool = False) -> float:
    """Best of ``repeat`` times to ``import module`` in a fresh interpreter (torch and jax included;
    with ``read_only``, as the ``tpu-debug`` script's reading verbs import it: neither)."""
    launcher = "import tpu_debug.cli; " if read_only else ""
    code = f"import time; t = time.perf_counter(); {launcher}import {module}; print(time.perf_counter() - t)"
    return min(
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeat)
    )


# -- end to end: the real command in a real terminal ------------------------------------

TMUX_SIZE = (120, 36)
OVERVIEW_TEXT = ("Findings", "mul.Tensor (eager) compiled ")  # the storm finding (5,000 at 1M events)
NAVIGATED_TEXT = ("Compile history: mul.Tensor", "closest key: compile 1", "HloModule")


def default_cli() -> list[str]:
    """The ``tpu-debug`` console script installed next to this Python, else ``python -m tpu_debug``."""
    script = Path(sys.executable).parent / "tpu-debug"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tpu_debug"]


class _Tmux:
    """One private tmux server (own socket) with one session running ``command`` once released."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.tmux = shutil.which("tmux")
        if self.tmux is None:
            raise SystemExit("--e2e needs tmux (apt-get install -y tmux)")
        self.socket = f"tui_open_{os.getpid()}_{time.monotonic_ns()}"
        # COLUMNS/LINES would override the pane's size in the TUI
        skip = ("TPU_DEBUG_", "TMUX", "COLUMNS", "LINES")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        self.env.update(TERM="xterm-256color", COLORTERM="truecolor")
        # the shell is up before the clock starts; the Enter that releases it starts the command
        shell = f"cd {shlex.quote(str(cwd))} && read go && exec {shlex.join(command)}"
        width, height = TMUX_SIZE
        self("new-session", "-d", "-s", "tui", "-x", str(width), "-y", str(height), shell, check=True)

    def __call__(self, *args: str, check: bool = False) -> str:
        return subprocess.run(
            [self.tmux, "-L", self.socket, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=check,
        ).stdout

    def wait_for(self, texts: tuple[str, ...], timeout: float = 120.0, interval: float = 0.02) -> None:
        deadline = time.perf_counter() + timeout
        while True:
            pane = self("capture-pane", "-p", "-t", "tui")
            if all(t in pane for t in texts):
                return
            if time.perf_counter() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {texts!r}; the pane shows:\n{pane}")
            time.sleep(interval)

    def close(self) -> None:
        socket = self("display-message", "-p", "#{socket_path}").strip()
        self("kill-server")
        if socket:  # tmux leaves its socket file behind
            Path(socket).unlink(missing_ok=True)


def _cpu_idle(seconds: float) -> float | None:
    """Fraction of all CPUs' time spent idle over the next ``seconds`` (None off Linux)."""

    def sample() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    first = sample()
    time.sleep(seconds)
    last = sample()
    if first is None or last is None or last[1] == first[1]:
        return None
    return (last[0] - first[0]) / (last[1] - first[1])


def wait_for_idle(limit: float, threshold: float = 0.9) -> float | None:
    """On a shared machine: wait (at most ``limit`` seconds) for a second in which the CPUs
    are ``threshold`` idle; returns the idle fraction of the last second looked at."""
    deadline = time.monotonic() + limit
    while True:
        idle = _cpu_idle(1.0)
        if idle is None or idle >= threshold or time.monotonic() > deadline:
            return idle
        time.sleep(1.0)


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used; NaN off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_e2e(run_dir: Path, command: list[str]) -> dict[str, tuple[float, float]]:
    """One start of ``command tui run_dir`` in tmux: (wall, CPU) seconds from the start to each
    screen. CPU time is the TUI process's (all threads): what the start costs, whatever else
    the machine is doing."""
    term = _Tmux([*command, "tui", str(run_dir)], run_dir.parent)
    try:
        time.sleep(0.3)  # the shell is reading
        pid = int(term("display-message", "-p", "-t", "tui", "#{pane_pid}").strip())  # exec keeps it
        start = time.perf_counter()
        term("send-keys", "-t", "tui", "Enter")
        term.wait_for(OVERVIEW_TEXT)
        overview = time.perf_counter() - start, _process_cpu(pid)
        term("send-keys", "-t", "tui", "2")
        term.wait_for(NAVIGATED_TEXT)
        navigated = time.perf_counter() - start, _process_cpu(pid)
        term("send-keys", "-t", "tui", "q")
    finally:
        term.close()
    return {
        "start to overview (findings drawn)": overview,
        "start to recompiles view navigated (key 2)": navigated,
    }



def print_table(runs: list[dict], first: str, pick, digits: int) -> None:
    """A markdown table of timed steps: ``runs`` are {step: (wall s, CPU s)} per opening;
    the first wall column is ``pick(walls)`` under the heading ``first``."""
    print(f"| step | wall, {first} | wall, median | wall, worst | CPU time, median |")
    print("|---|---:|---:|---:|---:|")
    for key in runs[0]:
        wall = [r[key][0] for r in runs]
        cpu = [r[key][1] for r in runs]
        print(
            f"| {key} | {pick(wall):.{digits}f} s | {statistics.median(wall):.{digits}f} s "
            f"| {max(wall):.{digits}f} s | {statistics.median(cpu):.{digits}f} s |"
        )

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the run here and keep it (default: a temporary dir)")
    parser.add_argument("--no-pilot", action="store_true", help="skip the in-process pilot measurements")
    parser.add_argument("--e2e", action="store_true", help="also time the real CLI in tmux, start to screen")
    parser.add_argument("--e2e-repeat", type=int, default=5, metavar="N")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each end-to-end start, wait up to SECONDS for a second of >= 90%% idle CPUs "
        "(for a shared machine; default: do not wait)",
    )
    parser.add_argument(
        "--cli",
        help="the command to start (default: the tpu-debug script next to this Python); "
        "e.g. --cli tpu-debug to go through PATH (a pyenv shim, say)",
    )
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tui_open_"))
    run_dir = (args.keep or tmp) / "20260131T120000.000Z-big"
    try:
        if (run_dir / DB_NAME).exists():
            print(f"reusing {run_dir}")
        else:
            t = time.perf_counter()
            db = generate(run_dir, args.events)
            print(
                f"generated {args.events:,} events in {time.perf_counter() - t:.1f} s "
                f"({db.stat().st_size / 2**20:.0f} MiB)"
            )
        loads = [os.getloadavg()[0]]
        if not args.no_pilot:
            runs = []
            for _ in range(args.repeat):
                if args.wait_idle > 0:
                    wait_for_idle(args.wait_idle)
                runs.append(measure(run_dir))
            loads.append(os.getloadavg()[0])
            print(
                f"\n{args.events:,} events, Textual {__import__('textual').__version__}, {args.repeat} openings:\n"
            )
            print_table(runs, "first opening", lambda wall: wall[0], digits=3)
        if args.e2e:
            command = shlex.split(args.cli) if args.cli else default_cli()
            e2e = []
            for _ in range(args.e2e_repeat):
                if args.wait_idle > 0:
                    wait_for_idle(args.wait_idle)
                loads.append(os.getloadavg()[0])
                e2e.append(measure_e2e(run_dir, command))
            print(
                f"\nend to end, {shlex.join(command)} tui RUN in tmux {TMUX_SIZE[0]}x{TMUX_SIZE[1]}, "
                f"{args.e2e_repeat} starts:\n"
            )
            print_table(e2e, "best", min, digits=2)
        print()
        for module in ("tpu_debug", "tpu_debug.cli", "tpu_debug.tui.app"):
            print(f"import {module} in a fresh interpreter, best of 3: {import_seconds(module):.2f} s")
        print(
            "import tpu_debug.tui.app as 'tpu-debug tui' does (read-only: no torch, no jax), best of 3: "
            f"{import_seconds('tpu_debug.tui.app', read_only=True):.2f} s"
        )
        loads.append(os.getloadavg()[0])
        print(
            f"1-minute load average while measuring: {min(loads):.1f} to {max(loads):.1f} "
            f"({os.cpu_count()} CPUs)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
