"""The run writer alone: how fast op events and compile events go through ``RunWriter``.

Two workloads, each ``--events`` events: per-execution op events (the high-volume
kind, rows of ``executions``) and compile events (a header row, a ``compiles``
row with the arguments as JSON). For each, the time ``put()`` takes on the
traced thread and the time until ``flush()`` returns (everything inserted and
committed), as events per second; best of ``--repeat``. CPU time of the whole
process (the writer thread included) is given too: it is the figure least
disturbed by other processes on a shared machine.

    python benchmarks/store_writer.py [--events 200000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import threading
import time
from pathlib import Path

from tpu_debug.tracers.events import ArgInfo, CompileEvent, OpEvent, SourceLocation
from tpu_debug.tracers.recording.run_writer import RunWriter


def _op_events(writer: RunWriter, n: int, locs: list[SourceLocation], tid: int) -> list:
    return [
        OpEvent(writer.new_id(), i * 1e-6, "eager", tid, locs[i % 16], "mul.Tensor", 2e-5, None)
        for i in range(n)
    ]


def _compile_events(writer: RunWriter, n: int, locs: list[SourceLocation], tid: int) -> list:
    out = []
    for i in range(n):
        args = (ArgInfo("self", (i % 97, 128), "float32"), ArgInfo("dim", static=str(i % 3)))
        out.append(
            CompileEvent(
                writer.new_id(),
                i * 1e-6,
                "eager",
                tid,
                locs[i % 16],
                "sum.dim_IntList",
                f"sum.dim_IntList(float32[{i % 97},128], dim={i % 3})",
                args,
                1e-3,
                None,
                identity="sum.dim_IntList",
            )
        )
    return out


def _rate(logdir: Path, make, n: int) -> dict[str, float]:
    """One run of ``n`` events through a fresh writer: put rate, committed rate, CPU µs per event."""
    db = logdir / f"bench_{time.perf_counter_ns()}.db"
    writer = RunWriter(db, {"name": "store-writer-bench"})
    tid = threading.get_native_id()
    locs = [SourceLocation(f"/work/user/train{i}.py", 10 + i, "step") for i in range(16)]
    events = make(writer, n, locs, tid)
    writer.flush()  # the writer is idle and waiting, as in a traced program
    gc.collect()
    gc.disable()
    try:
        cpu0, start = time.process_time(), time.perf_counter()
        for e in events:
            writer.put(e)
        queued = time.perf_counter()
        ok = writer.flush(timeout=600)
        done, cpu1 = time.perf_counter(), time.process_time()
    finally:
        gc.enable()
    writer.close()
    if not ok:
        raise SystemExit(f"the writer failed: {writer.error}")
    db.unlink()
    return {"put": n / (queued - start), "committed": n / (done - start), "cpu_us": (cpu1 - cpu0) / n * 1e6}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per workload")
    parser.add_argument("--repeat", type=int, default=5, help="runs per workload (best is kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("op", _op_events), ("compile", _compile_events)):
            runs = [_rate(Path(tmp), make, args.events) for _ in range(args.repeat)]
            results[name] = {
                "put": max(r["put"] for r in runs),
                "committed": max(r["committed"] for r in runs),
                "cpu_us": min(r["cpu_us"] for r in runs),
            }
    if args.json:
        print(json.dumps(results))
        return
    print(f"events={args.events} repeat={args.repeat} (best of the runs)\n")
    print("| workload | put() events/s | committed events/s | CPU µs per event |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} events | {r['put']:,.0f} | {r['committed']:,.0f} | {r['cpu_us']:.2f} |")


if __name__ == "__main__":
    main()
