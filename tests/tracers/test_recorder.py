"""The Recorder probe under threads: probes fire on whichever thread does device work
(a DataLoader worker, say), and the writer thread reads the counters meanwhile."""

from __future__ import annotations

import sys
import threading

import torch
from tpu_debug.core.records import CollectiveDone, CollectiveInfo
from tpu_debug.tracers.recording.recorder import Recorder

import tpu_debug


class _Writer:
    """The part of RunWriter a Recorder uses, keeping what it gets."""

    def __init__(self) -> None:
        self.events: list = []
        self.stats_source = None
        self._ids = 0

    def set_stats_source(self, source) -> None:
        self.stats_source = source

    def new_id(self) -> int:
        self._ids += 1
        return self._ids

    def put(self, event) -> None:
        self.events.append(event)


def test_counts_from_four_threads_are_exact_while_the_writer_reads():
    """Four threads report executions of the same two executables while another thread
    takes snapshots, as the writer thread does: no execution is lost, and the final
    snapshot has every one (thread switches forced as often as CPython allows)."""
    writer = _Writer()
    recorder = Recorder(writer, hlo=False)
    keys = [("add.Tensor", "f32[8]"), ("mul.Tensor", "f32[8]")]
    per_thread, threads = 20_000, 4
    done = threading.Event()
    latest: dict[int, tuple] = {}

    def run():
        for i in range(per_thread):
            recorder.on_execute("eager", keys[i % 2][0], keys[i % 2], 0.5)

    def snapshots():
        while not done.is_set():
            for row in writer.stats_source():
                latest[row[0]] = row

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        reader = threading.Thread(target=snapshots)
        reader.start()
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    for row in writer.stats_source():
        latest[row[0]] = row
    totals = {name: (count, seconds) for _, _, name, _, _, count, seconds in latest.values()}
    each = threads * per_thread // 2
    # seconds: sums of 0.5, exact in binary floating point
    assert totals == {"add.Tensor": (each, each * 0.5), "mul.Tensor": (each, each * 0.5)}
    assert writer.stats_source() == []  # nothing changed since the last snapshot


def test_eager_ops_from_four_threads_under_a_trace(logdir):
    """Each of four threads runs its own loop of device ops: the results match CPU and the
    run stores the exact number of executions of each op."""
    loops, threads = 300, 4
    inputs = [torch.randn(16) for _ in range(threads)]
    results: list = [None] * threads

    def loop(i):
        x = inputs[i].to("tpu")
        for _ in range(loops):
            x = torch.tanh(x * 0.5 + 0.25)
        results[i] = x.cpu()

    with tpu_debug.trace(logdir=logdir) as session:
        workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    for i, got in enumerate(results):
        want = inputs[i]
        for _ in range(loops):
            want = torch.tanh(want * 0.5 + 0.25)
        # the same float32 ops on both sides; tanh may differ by an ulp or so per step,
        # and the map x -> tanh(x/2 + 1/4) contracts errors (|derivative| <= 1/2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    counts = {o.name: o.count for o in session.ops()}
    assert counts == {"mul.Tensor": loops * threads, "add.Tensor": loops * threads, "tanh": loops * threads}


def test_events_of_a_worker_thread_carry_that_thread(logdir, cold_cache):
    """A worker thread that compiles, runs and copies: each event names the worker."""
    seen = {}
    x_cpu = torch.randn(3, 11)

    def work():
        seen["thread"] = threading.get_native_id()
        seen["y"] = torch.sinh(x_cpu.to("tpu")).cpu()

    with tpu_debug.trace(logdir=logdir, op_events=True) as session:
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    torch.testing.assert_close(seen["y"], torch.sinh(x_cpu))
    ops = [e for e in session.events("op") if e.name == "sinh"]
    compiles = [e for e in session.compiles() if e.name == "sinh"]
    assert len(ops) == 1 and len(compiles) == 1
    assert {e.thread for e in (*ops, *compiles, *session.transfers())} == {seen["thread"]}
    assert seen["thread"] != threading.get_native_id()


def test_equal_keys_in_distinct_objects_count_as_one_executable():
    """A compiled graph's call builds its key per call: equal key objects are one
    executable's runs, however the recorder finds its counters first."""
    writer = _Writer()
    recorder = Recorder(writer, hlo=False)
    first = ("graph_0", "digest", (("f32", (8,)),))
    for _ in range(5):
        recorder.on_execute("compiled", "graph_0", first, 0.25)
    for _ in range(3):
        recorder.on_execute("compiled", "graph_0", tuple(x for x in first), 0.25)  # equal, another object
    recorder.on_execute("compiled", "graph_1", ("graph_1", "digest", ()), 0.25)
    rows = {name: (count, seconds) for _, _, name, _, _, count, seconds in writer.stats_source()}
    assert rows == {"graph_0": (8, 2.0), "graph_1": (1, 0.25)}


def test_a_collectives_return_is_recorded_with_its_seconds(tmp_path):
    """The probe path of a c10d collective without processes: its entry and its return go
    through the probes to a subscribed Recorder, and the return is stored and read back."""
    from tpu_debug.runtime import probes
    from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDoneEvent
    from tpu_debug.tracers.reading import RunQuery
    from tpu_debug.tracers.recording.run_writer import RunWriter

    writer = _Writer()
    recorder = Recorder(writer, hlo=False)
    probes.subscribe(recorder)
    try:
        probes.collective(CollectiveInfo("allreduce", "0", (0, 1), 1, 7, ((4, 2),), "float32", 32, "SUM"))
        probes.collective_done(CollectiveDone("allreduce", "0", 1, 7, 0.25))
    finally:
        probes.unsubscribe(recorder)
    call, done = writer.events
    assert isinstance(call, CollectiveCallEvent) and isinstance(done, CollectiveDoneEvent)
    assert (done.op, done.group, done.rank, done.seq, done.seconds) == ("allreduce", "0", 1, 7, 0.25)
    assert (call.group, call.rank, call.seq) == (done.group, done.rank, done.seq)
    assert done.ts >= call.ts

    db = tmp_path / "run.db"
    store = RunWriter(db, {"name": "demo"})
    stored = CollectiveDoneEvent(store.new_id(), 0.5, None, 3, None, CollectiveDone("send", "0", 1, 2, 0.125))
    store.put(stored)
    store.close({"status": "finished", "exit_status": 0})
    q = RunQuery(db)
    assert q.events("collective_done") == [stored]  # 0.125: exact in binary floating point
    q.close()
