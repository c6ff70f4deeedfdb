"""PyTorch's memory snapshot for the `tpu` device (``trace(memory_snapshot=FILE)``, ``tpu-debug run
--memory-snapshot FILE``), read by PyTorch's own reader: ``python -m torch.cuda._memory_viz stats``
and ``trace_plot`` run on the snapshot of an eager Llama training step and of a compiled one (and
on each compiled program's), their blocks add up to the peak the report shows, and the blocks'
frames name the lines inside the model that made them."""

from __future__ import annotations

import contextlib
import io
import pickle
import runpy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402

MODEL_FILE = str(Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny_llama.py")


@pytest.fixture(scope="module", params=["eager", "compiled"])
def llama_step(request, tmp_path_factory):
    """A tiny Llama's training step (forward, backward, AdamW) traced with a memory snapshot."""
    mode = request.param
    out = tmp_path_factory.mktemp(f"snapshot-{mode}")
    torch.manual_seed(0)
    cfg = LlamaConfig()
    model = TinyLlama(cfg).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab, (4, 64), device="tpu")

    def loss_of(tokens):
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))

    step = torch.compile(loss_of, backend="tpu_debug") if mode == "compiled" else loss_of
    snapshot = out / "llama.pickle"
    with tpu_debug.trace(logdir=out / "runs", memory_snapshot=snapshot) as session:
        loss = step(tokens)  # STEP
        loss.backward()
        opt.step()
        opt.zero_grad()
    yield mode, snapshot, session
    session.close()


def _memory_viz(*argv: str) -> str:
    """``python -m torch.cuda._memory_viz ARGV``, run in this process: its output."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ["_memory_viz", *argv]
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            # torch.cuda imports the module itself before runpy runs it as __main__: harmless here
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module("torch.cuda._memory_viz", run_name="__main__", alter_sys=False)
    finally:
        sys.argv = saved
    return out.getvalue()


def _blocks(snapshot: dict) -> list[dict]:
    return [b for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]


def _snapshots(path: Path) -> list[Path]:
    """The run's snapshot and each compiled program's beside it."""
    return [path, *sorted(path.parent.glob(f"{path.stem}.*.pickle"))]


def test_pytorchs_reader_renders_each_snapshot(llama_step, tmp_path):
    from torch.cuda._memory_viz import Bytes

    mode, path, _session = llama_step
    files = _snapshots(path)
    assert len(files) == (3 if mode == "compiled" else 1)  # the run's, and g1's forward and backward
    for file in files:
        data = pickle.loads(file.read_bytes())
        stats = _memory_viz("stats", str(file))
        reserved = sum(b["size"] for b in _blocks(data))
        # PyTorch's reader counts the segments' bytes as the blocks that fill them
        assert f"total_reserved: {Bytes(sum(s['total_size'] for s in data['segments']))}" in stats
        assert f"segments: {len(data['segments'])}" in stats
        assert sum(s["total_size"] for s in data["segments"]) - reserved < 1024 * 1024  # a heap's gaps at most
        html = tmp_path / f"{file.stem}.html"
        _memory_viz("trace_plot", str(file), "-o", str(html))
        page = html.read_text()
        assert "add_local_files" in page and '"name": "snapshot.pickle"' in page
        # the trace it plays back: allocations up to the peak, each with its frames
        (trace,) = data["device_traces"]
        assert trace and all(e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                                             "segment_free") for e in trace)


def test_the_snapshots_blocks_add_up_to_the_reports_peak(llama_step):
    mode, path, session = llama_step
    data = pickle.loads(path.read_bytes())
    (summary,) = session.events("memory")
    assert sum(b["size"] for b in _blocks(data)) == summary.peak_bytes
    if mode == "compiled":
        peaks = {e.name: e for e in session.events("program_memory")}
        for file in _snapshots(path)[1:]:
            peak = peaks[file.stem.removeprefix(f"{path.stem}.").replace(".", "/")]
            data = pickle.loads(file.read_bytes())
            # the program's total at its peak: its buffers, and the heap's gaps between them (the
            # report's "heap fragmentation" row) as the snapshot's free bytes
            assert sum(b["size"] for b in _blocks(data)) == peak.total_bytes - peak.unused_bytes
            assert sum(s["total_size"] for s in data["segments"]) == peak.total_bytes


def test_the_blocks_frames_name_the_lines_inside_the_model(llama_step):
    mode, path, _session = llama_step
    step_line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# STEP" in text)
    for file in _snapshots(path):
        blocks = sorted(_blocks(pickle.loads(file.read_bytes())), key=lambda b: -b["size"])
        in_model = [b for b in blocks if any(f["filename"] == MODEL_FILE for f in b["frames"])]
        # most bytes were made inside the model's forward (and its backward), each at its line
        assert sum(b["size"] for b in in_model) > sum(b["size"] for b in blocks) / 2, file.name
        lines = {f["line"] for b in in_model for f in b["frames"] if f["filename"] == MODEL_FILE}
        assert len(lines) > 3
        if file == path and mode == "compiled":
            # a compiled graph's output: the node's line inside the model, then the call
            called = [b for b in in_model if any(f["filename"] == __file__ and f["line"] == step_line
                                                 for f in b["frames"])]
            assert called
