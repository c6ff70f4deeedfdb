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

Importing tpu_debug (torch, jax) is not part of these times; it is measured
apart, in a fresh interpreter. Target (issue 6): open and navigable in < 2 s.

    python benchmarks/tui_open.py [--events 1000000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpu_debug.tracers.store import DB_NAME, RunWriter
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


def import_seconds() -> float:
    """Seconds to ``import tpu_debug.tui`` in a fresh interpreter (torch and jax included)."""
    code = "import time; t = time.perf_counter(); import tpu_debug.tui; print(time.perf_counter() - t)"
    return float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the run here and keep it (default: a temporary dir)")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tui_open_"))
    run_dir = (args.keep or tmp) / "20260131T120000.000Z-big"
    try:
        t = time.perf_counter()
        db = generate(run_dir, args.events)
        print(
            f"generated {args.events:,} events in {time.perf_counter() - t:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)"
        )
        runs = [measure(run_dir) for _ in range(args.repeat)]
        print(
            f"\n{args.events:,} events, Textual {__import__('textual').__version__}, {args.repeat} openings:\n"
        )
        print("| step | wall, first opening | wall, median | wall, worst | CPU time, median |")
        print("|---|---:|---:|---:|---:|")
        for key in runs[0]:
            wall = [r[key][0] for r in runs]
            cpu = [r[key][1] for r in runs]
            print(
                f"| {key} | {wall[0]:.3f} s | {statistics.median(wall):.3f} s | {max(wall):.3f} s "
                f"| {statistics.median(cpu):.3f} s |"
            )
        print(f"\nimport tpu_debug.tui in a fresh interpreter (torch, jax): {import_seconds():.2f} s")
        print(
            f"load average while measuring: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
