"""examples/distributed/train_llama_dp_tp.py under `tpu-debug run --devices 8`, as its docstring runs it."""

from __future__ import annotations

from dist_helpers import REPO, run_python
from tpu_debug.tracers.reading.program_collectives import program_collectives

import tpu_debug

EXAMPLE = REPO / "examples" / "distributed" / "train_llama_dp_tp.py"
LLAMA = REPO / "examples" / "models" / "tiny_llama.py"


def _line(path, text: str) -> int:
    (line,) = [i for i, src in enumerate(path.read_text().splitlines(), 1) if text in src]
    return line


def test_dp_tp_llama_example_trains_like_cpu_and_records_its_collectives(tmp_path):
    # --devices makes the run's own process simulate the 8 devices: a fresh python
    proc = run_python(["-m", "tpu_debug", "run", "--logdir", str(tmp_path), "--devices", "8", str(EXAMPLE),
                       "--steps", "2"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # the example compares its losses and final weights with PyTorch's CPU itself (bounds and why there)
    assert "8 devices" in proc.stdout and "mesh dp=2 x tp=4" in proc.stdout
    assert "sharded training matches CPU" in proc.stdout
    assert "\nCollectives\n" in proc.stderr
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with tpu_debug.open_run(run) as session:
        assert session.metadata().device_count == 8
        programs = [e for e in program_collectives(session) if e.mode == "compiled"]
    step = max(programs, key=lambda e: len(e.collectives))
    assert step.devices == 8 and step.memory_bytes > 0
    where = {(c.opcode, c.group_size, c.line) for c in step.collectives if c.file == str(LLAMA)}
    # the row-wise MLP down projection sums its partial products over the 4 tensor-parallel devices
    assert ("all-reduce", 4, _line(LLAMA, "return self.down(")) in where
