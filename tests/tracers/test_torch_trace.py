"""A run under ``TORCH_TRACE`` writes tpu_debug's artifacts into PyTorch's structured trace,
checked with tlparse, the independent reader of that log: its output files them under
dynamo's compile ids, beside dynamo's own artifacts of the same compile."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tpu_debug.runtime.target import _libtpu

SCRIPT = textwrap.dedent(
    """\
    import torch

    m = torch.nn.Linear(8, 4).to("tpu")

    def step(x, scale):
        loss = (torch.sin(m(x)) * scale).sum()
        loss.backward()
        return loss

    g = torch.compile(step, backend="tpu_debug", dynamic=False)
    for i in range(3):
        g(torch.ones(2, 8, device="tpu"), i + 1)
    """
)

HAS_LIBTPU = bool(_libtpu._find_libtpu())


def _tlparse_binary() -> str:
    tlparse = shutil.which("tlparse") or str(Path(sys.executable).parent / "tlparse")
    if not Path(tlparse).exists():
        pytest.skip("tlparse is not installed (the dev extra installs it)")
    return tlparse


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tlparse's output directory for the log of SCRIPT run by ``tpu-debug run`` under TORCH_TRACE
    (compiled for a v5e as well when libtpu is installed)."""
    tlparse = _tlparse_binary()
    root = tmp_path_factory.mktemp("torch_trace")
    (root / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG")}
    env["TORCH_TRACE"] = str(root / "trace")
    target = ["--target", "v5e"] if HAS_LIBTPU else []
    done = subprocess.run(
        [sys.executable, "-m", "tpu_debug", "run", "--logdir", str(root / "runs"), *target, "script.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = next((root / "trace").glob("dedicated_log_torch_trace*.log"))
    out = root / "tlparse"
    done = subprocess.run(
        [tlparse, str(log), "-o", str(out), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def _compiles(out: Path) -> dict[str, list[Path]]:
    """tlparse's directories of each dynamo compile that produced a graph, by compile id: one per
    attempt ("-_0_1_0", "-_0_1_1": frame 0, compile 1; dynamo restarts a compile at a graph break)."""
    found: dict[str, list[Path]] = {}
    for d in sorted(out.iterdir()):
        parts = d.name.split("_")
        if d.is_dir() and len(parts) == 4 and parts[1].isdigit():
            found.setdefault(f"{parts[1]}/{parts[2]}", []).append(d)
    return {k: v for k, v in found.items() if any(list(d.glob("dynamo_output_graph_*.txt")) for d in v)}


def _files(directories: list[Path], pattern: str) -> list[Path]:
    return [p for d in directories for p in d.glob(pattern)]


def _one(directories: list[Path], pattern: str) -> Path:
    found = _files(directories, pattern)
    assert len(found) == 1, (pattern, sorted(p.name for d in directories for p in d.iterdir()))
    return found[0]


def test_each_graph_has_its_hlo_beside_dynamos_graph(parsed: Path) -> None:
    compiles = _compiles(parsed)
    assert sorted(compiles) == ["0/0", "0/1", "0/2"]  # one per value of the Python number 'scale'
    index = (parsed / "index.html").read_text()
    for directories in compiles.values():
        # dynamo's graph calls sin; the XLA program it became (forward) computes a sine and
        # (backward) its derivative, a cosine
        graph = _one(directories, "dynamo_output_graph_*.txt")
        assert "torch.sin" in graph.read_text()
        forward = _one(directories, "tpu_debug_hlo_forward_*.txt")
        backward = _one(directories, "tpu_debug_hlo_backward_*.txt").read_text()
        assert forward.parent == graph.parent  # the attempt that made the graph
        assert re.search(r"= f32\[[\d,]*\]\{[^}]*\} sine\(", forward.read_text())
        assert backward.startswith("HloModule ") and re.search(r"= f32\[[\d,]*\]\{[^}]*\} cosine\(", backward)
        # and tlparse's index links it under that compile
        assert f'href="{forward.parent.name}/{forward.name}"' in index


def test_each_recompile_has_its_diff_read_from_the_guard_tlparse_shows(parsed: Path) -> None:
    compiles = _compiles(parsed)
    recompiles = {k: v for k, v in compiles.items() if _files(v, "recompile_reasons_*.json")}
    assert sorted(recompiles) == ["0/1", "0/2"]
    for directories in recompiles.values():
        text = _one(directories, "recompile_reasons_*.json").read_text()
        # one cached entry's reason is written as plain text, several as a JSON list
        first = json.loads(text)[0] if text.lstrip().startswith("[") else text
        # dynamo's reason: the most recent cached entry and the guard that failed for it
        entry, name, value = re.match(r"(\d+/\d+): (\w+) == (\S+)", first).groups()
        diffs = _files(directories, "tpu_debug_recompile_*.json")
        assert len(diffs) == 2  # the forward graph's and the backward graph's
        for path in diffs:
            diff = json.loads(path.read_text())
            assert diff["previous_compile_id"] == entry
            assert [(d["aspect"], d["arg_name"], d["before"], d["source"]) for d in diff["diffs"]] == [
                ("scalar", name, value, "guard")
            ]
            # and the value the call passed instead
            assert [d["now"] for d in diff["diffs"]] == [str(int(value) + 1)]
    assert not _files(compiles["0/0"], "tpu_debug_recompile_*.json")  # the first compile is none


@pytest.mark.skipif(
    not HAS_LIBTPU, reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)
def test_each_graph_has_its_tpu_hlo_with_tpu_layouts(parsed: Path) -> None:
    for directories in _compiles(parsed).values():
        for kind in ("forward", "backward"):
            local = _one(directories, f"tpu_debug_hlo_{kind}_*.txt").read_text()
            tpu = _one(directories, f"tpu_debug_tpu_hlo_{kind}_*.txt").read_text()
            # a TPU program's arrays carry the TPU's tiled layouts ({1,0:T(8,128)}); the CPU's never do
            assert re.search(r"\{[\d,]*:T\(\d+(,\d+)*\)", tpu) and not re.search(r":T\(\d+", local)


def test_without_torch_trace_no_emitter_is_made(
    monkeypatch: pytest.MonkeyPatch, logdir: Path, forget_graphs: None
) -> None:
    import torch
    from tpu_debug.tracers.recording import torch_trace

    import tpu_debug

    made = []
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    monkeypatch.setattr(torch_trace, "TorchTraceEmitter", lambda *a, **k: made.append(a))
    g = torch.compile(lambda x: torch.cos(x) + 1, backend="tpu_debug")
    with tpu_debug.trace(logdir=logdir) as session:
        g(torch.ones(3, device="tpu"))
    assert made == []
    assert session.compiles(mode="compiled")


TRAIN_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F
    import tpu_debug

    model = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    train_step = tpu_debug.compile(train_step)
    opt_step = tpu_debug.compile(opt.step)
    x, y = torch.randn(16, 8, device="tpu"), torch.randint(0, 4, (16,), device="tpu")
    for _ in range(2):
        train_step(x, y)
        opt_step()
        opt.zero_grad()
    """
)


def test_optimizer_step_and_train_step_labelled_inference(tmp_path: Path) -> None:
    # AOTAutograd calls both graphs "inference" (no autograd around them); a reader is told
    # what each program is: the step that takes the gradients, and the optimizer's step
    tlparse = _tlparse_binary()
    (tmp_path / "script.py").write_text(TRAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG")}
    env["TORCH_TRACE"] = str(tmp_path / "trace")
    argv = [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(tmp_path / "runs"), "script.py"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    log = next((tmp_path / "trace").glob("dedicated_log_torch_trace*.log"))
    out = tmp_path / "tlparse"
    done = subprocess.run(
        [tlparse, str(log), "-o", str(out), "--no-browser"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    hlo = sorted(p.name.rsplit("_", 1)[0] for p in out.rglob("tpu_debug_hlo_*.txt"))
    assert hlo == ["tpu_debug_hlo_optimizer_step", "tpu_debug_hlo_train_step"], hlo

    import tpu_debug

    with tpu_debug.open_run(None, logdir=tmp_path / "runs") as session:
        names = sorted({c.name for c in session.compiles(mode="compiled")})
    assert names == ["g1/train_step", "g2/optimizer_step"], names
