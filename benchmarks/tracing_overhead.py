"""Tracing overhead: the same eager and compiled loops with tracing off and on, and the store's write rate.

Everything runs in this one process. Off and on runs are interleaved (order
alternating, collector paused); the table gives the best wall time of each and
the medians of the per-pair wall-time and CPU-time ratios, so the figures hold
on a noisy machine (CPU time is the least disturbed by other processes). "On" times the loop
inside ``with tpu_debug.trace(hlo=True)``; the fixed cost of entering and
leaving the trace (run directory, database, writer thread, final flush) is
reported on its own. Targets: eager <= 1.25x, compiled <= 1.05x,
store >= 200k events/s.

    python benchmarks/tracing_overhead.py [--steps 50] [--repeat 15] [--events 500000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn
from tpu_debug.core.records import TransferInfo
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers.events import OpEvent, SourceLocation, TransferEvent
from tpu_debug.tracers.recording.run_writer import RunWriter

import tpu_debug


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 8))


def _eager_train_loop(steps: int):
    model = _model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64).to("tpu")
    y = torch.randn(32, 8).to("tpu")

    def loop():
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
        loss.detach().cpu()  # wait for the device once, at the end

    return loop


def _compiled_loop(steps: int):
    model = torch.compile(_model().to("tpu"), backend="tpu_debug")
    x = torch.randn(32, 64).to("tpu")

    def loop():
        with torch.no_grad():
            for _ in range(steps):
                out = model(x)
        out.cpu()

    return loop


def _single_op_loop(calls: int):
    a, b = torch.randn(64, 64).to("tpu"), torch.randn(64, 64).to("tpu")

    def loop():
        for _ in range(calls):
            out = a + b
        out.cpu()

    return loop


def _single_graph_loop(calls: int):
    f = torch.compile(lambda x, y: x + y, backend="tpu_debug")
    a, b = torch.randn(64, 64).to("tpu"), torch.randn(64, 64).to("tpu")

    def loop():
        for _ in range(calls):
            out = f(a, b)
        out.cpu()

    return loop


def _overhead(loop, logdir: Path, repeat: int, *, cold: bool = False, **options) -> dict[str, float]:
    """Tracing off vs on for ``loop``, over ``repeat`` interleaved pairs.

    Returns the best wall time of each, the median of the per-pair wall-time
    ratios, the median of the per-pair CPU-time ratios (``process_time``: all
    threads of this process, the writer thread included; the figure least
    disturbed by other processes), and the median fixed cost of entering and
    leaving a trace (run directory, database, writer thread, final flush).
    """

    def off() -> tuple[float, float]:
        if cold:
            clear_cache()
        w, c = time.perf_counter(), time.process_time()
        loop()
        return time.perf_counter() - w, time.process_time() - c

    def on() -> tuple[float, float, float]:
        if cold:
            clear_cache()
        t0 = time.perf_counter()
        with tpu_debug.trace(logdir=logdir, name="bench", **options):
            w, c = time.perf_counter(), time.process_time()
            loop()
            wall, cpu = time.perf_counter() - w, time.process_time() - c
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        return wall, cpu, (w - t0) + (t3 - t2)

    off(), on()  # warm up: compile everything, import lazily loaded modules
    offs, ons, fixed, wall_ratios, cpu_ratios = [], [], [], [], []
    for i in range(repeat):
        # alternate which goes first, and keep the collector out of the timings (as timeit does)
        gc.collect()
        gc.disable()
        try:
            if i % 2:
                b, b_cpu, c = on()
                a, a_cpu = off()
            else:
                a, a_cpu = off()
                b, b_cpu, c = on()
        finally:
            gc.enable()
        offs.append(a)
        ons.append(b)
        fixed.append(c)
        wall_ratios.append(b / a)
        cpu_ratios.append(b_cpu / a_cpu)
    return {
        "off": min(offs),
        "on": min(ons),
        "wall_ratio": statistics.median(wall_ratios),
        "cpu_ratio": statistics.median(cpu_ratios),
        "fixed": statistics.median(fixed),
    }


def _probe_cost(logdir: Path, calls: int = 100_000, repeat: int = 7) -> float:
    """Seconds the recorder adds to one op execution: the runtime's ``on_execute``
    report (two clock reads and ``probes.executed``) with a trace's recorder subscribed."""
    from tpu_debug.runtime import probes
    from tpu_debug.tracers.recording.recorder import Recorder

    key = (torch.ops.aten.add.Tensor, ((torch.Size([64, 64]), torch.float32, False),) * 2, ())
    writer = RunWriter(logdir / "probe_bench.db", {"name": "probe-bench"})
    recorder = Recorder(writer)
    executed, clock = probes.executed, time.perf_counter
    probes.subscribe(recorder)
    try:
        best = float("inf")
        for _ in range(repeat):
            start = clock()
            for _ in range(calls):
                t = clock()
                executed("eager", "add.Tensor", key, clock() - t)
            best = min(best, clock() - start)
    finally:
        probes.unsubscribe(recorder)
        writer.close()
    return best / calls


def _store_rate(n: int, logdir: Path, *, transfers_every: int = 5) -> tuple[float, float]:
    """(events/s accepted by put, events/s inserted and committed by the writer thread).

    The clock stops when ``flush()`` returns, i.e. when the last event is committed;
    the close (WAL checkpoint into the main file) is not part of the sustained rate.
    """
    db = logdir / f"store_bench_{transfers_every}.db"
    writer = RunWriter(db, {"name": "store-bench"})
    tid = threading.get_native_id()
    locs = [SourceLocation(f"/work/user/train{i}.py", 10 + i, "step") for i in range(16)]
    events = []
    for i in range(n):
        nid = writer.new_id()
        if transfers_every and i % transfers_every == transfers_every - 1:
            events.append(
                TransferEvent(nid, i * 1e-6, None, tid, locs[i % 16], TransferInfo("d2h", 4, (), "float32", "item", 1e-5), op="item", implicit=True)
            )
        else:
            events.append(OpEvent(nid, i * 1e-6, "eager", tid, locs[i % 16], "mul.Tensor", 2e-5, None))
    writer.flush()  # the writer is idle and waiting, as in a traced program
    start = time.perf_counter()
    for e in events:
        writer.put(e)
    queued = time.perf_counter()
    assert writer.flush(timeout=600), writer.error  # everything inserted and committed
    done = time.perf_counter()
    writer.close()
    return n / (queued - start), n / (done - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="loop iterations per timing")
    parser.add_argument("--repeat", type=int, default=15, help="interleaved off/on pairs")
    parser.add_argument("--events", type=int, default=500_000, help="events for the store rate")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        rows = []
        rows.append(
            ("eager: one op (add 64x64), 500 calls", _overhead(_single_op_loop(500), logdir, 3 * args.repeat))
        )
        rows.append(
            (
                "compiled: one graph (x + y), 500 calls",
                _overhead(_single_graph_loop(500), logdir, 3 * args.repeat),
            )
        )
        eager = _eager_train_loop(args.steps)
        rows.append(("eager MLP train step (fwd+bwd+SGD), warm cache", _overhead(eager, logdir, args.repeat)))
        rows.append(
            ("eager, per-execution op events on", _overhead(eager, logdir, args.repeat, op_events=True))
        )
        cold = _eager_train_loop(max(args.steps // 10, 5))
        rows.append(
            (
                f"eager, cold cache ({max(args.steps // 10, 5)} steps, every op compiles)",
                _overhead(cold, logdir, max(args.repeat // 2, 2), cold=True),
            )
        )
        compiled = _compiled_loop(args.steps * 20)
        rows.append(("compiled MLP forward (one program per call)", _overhead(compiled, logdir, args.repeat)))
        put_rate, store_rate = _store_rate(args.events, logdir)
        _, op_rate = _store_rate(args.events, logdir, transfers_every=0)
        per_call = _probe_cost(logdir)

    print(f"steps={args.steps} repeat={args.repeat}; tracing on = trace(hlo=True)\n")
    print(
        "| loop | off (best) | on (best) | on / off, best wall | on / off, median wall | "
        "on / off, median CPU | trace enter+exit |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(
            f"| {name} | {r['off'] * 1e3:.1f} ms | {r['on'] * 1e3:.1f} ms | {r['on'] / r['off']:.3f}x "
            f"| {r['wall_ratio']:.3f}x | {r['cpu_ratio']:.3f}x | {r['fixed'] * 1e3:.1f} ms |"
        )
    eager_op = rows[0][1]["off"] / 500
    graph_call = rows[1][1]["off"] / 500
    print()
    print(
        f"Recorder cost per execution report: {per_call * 1e6:.2f} µs "
        f"(= {100 * per_call / eager_op:.1f} % of one eager add, {eager_op * 1e6:.1f} µs; "
        f"{100 * per_call / graph_call:.1f} % of one compiled-graph call, {graph_call * 1e6:.1f} µs)"
    )
    print()
    print("| run store | events/s |")
    print("|---|---:|")
    print(f"| put() on the traced thread | {put_rate:,.0f} |")
    print(f"| written and committed: 80% op, 20% transfer events | {store_rate:,.0f} |")
    print(f"| written and committed: per-execution op events only | {op_rate:,.0f} |")


if __name__ == "__main__":
    main()
