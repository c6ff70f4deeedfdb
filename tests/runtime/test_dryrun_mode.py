"""Dry runs of whole programs (runtime/dry_mode.py, tpu_debug.dry_run, tpu-debug run --dry-run):
tensors that hold no data, every program compiled for a TPU target, nothing executed.

The sizes checked are exact: a dry run's payload of a float32[n] tensor holds 4n bytes on
the device, as the same tensor does in PyTorch on CPU (``untyped_storage().nbytes()``).
"""

from __future__ import annotations

import gc
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_python

import tpu_debug
from tpu_debug.runtime import dry_mode
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tpu_debug.tracers.reading.memory_view import memory_view

ROOT = Path(__file__).resolve().parents[2]
requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)
GiB = 1024**3
pytestmark = requires_libtpu


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


def test_a_value_read_stops_the_dry_run_at_its_line():
    cpu = torch.nn.Linear(64, 32)
    held = sum(p.untyped_storage().nbytes() for p in cpu.parameters()) + 16 * 64 * 4

    def step():
        with torch.device("tpu"):
            model = torch.nn.Linear(64, 32)
        x = torch.ones(16, 64, device="tpu")
        loss = model(x).square().mean()
        assert loss.shape == () and loss.dtype == torch.float32  # shapes and dtypes are known
        value = loss.item()  # the read
        raise AssertionError(f"a dry run read a value: {value}")

    read_line = step.__code__.co_firstlineno + 6
    result = tpu_debug.dry_run(step, target="v5e")
    assert result.stopped is not None and result.stopped.where.endswith(f"test_dryrun_mode.py:{read_line}")
    assert ".item()" in str(result.stopped) and result.outputs is None
    assert dry_mode.active is None  # the mode ended with the run
    # what ran before the read was measured: parameters and input were live at the peak
    assert result.memory.peak_bytes >= held
    assert result.memory.stopped and result.fits is True and result.memory.target == "v5e"
    assert result.programs and not result.ooms and not result.refused
    assert f"test_dryrun_mode.py:{read_line}" in result.render()


def test_a_tensor_over_one_chip_is_a_finding_with_estimated_fixes():
    n = 5 * GiB  # float32: 20 GiB, over a v5e chip's 16 GiB HBM

    def step():
        x = torch.empty(n, device="tpu")
        x.mul_(2)  # a program reading and writing it, so the compiler sees it too
        return x

    line = step.__code__.co_firstlineno + 1
    result = tpu_debug.dry_run(step, target="v5e")
    assert result.stopped is None and result.outputs.shape == (n,) and result.outputs.device.type == "tpu"
    assert result.fits is False and result.memory.peak_bytes >= 4 * n
    assert result.memory.required_bytes > result.memory.capacity_bytes
    (finding,) = [f for f in result.findings if f.finding == "does_not_fit"]
    top = finding.holders[0]
    assert (os.path.basename(top.file), top.line, top.nbytes, top.shape) == ("test_dryrun_mode.py", line, 4 * n, (n,))
    remedies = {f.remedy: f for f in finding.fixes}
    # float32 -> bfloat16 halves the tensor: ~10 GiB, which fits; two v5e chips split it
    assert remedies["bfloat16"].fits and remedies["bfloat16"].estimate_bytes < 16 * GiB
    assert remedies["chips"].fits and remedies["chips"].factor >= 2
    assert "does NOT fit" in result.render()


BIG = textwrap.dedent(
    """
    import resource, sys
    import torch
    sys.path.insert(0, {root!r})
    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    # a wide Llama: ~4.7 GB of bfloat16 parameters, more than the process grows by after its
    # imports (the TPU compiles: 1-3 GB, by libtpu's threads and the cache), so a materialized
    # copy would show
    print("rss0", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    cfg = LlamaConfig(vocab=128000, hidden=4096, intermediate=14336, layers=6, heads=32, kv_heads=8, max_seq=64)
    with torch.device("meta"):
        model = TinyLlama(cfg).to(torch.bfloat16)
    model = model.to_empty(device="tpu")
    tokens = torch.zeros(8, 64, dtype=torch.long, device="tpu")
    with torch.no_grad():
        logits = model(tokens)
    print("params", sum(p.untyped_storage().nbytes() for p in model.parameters()))
    print("logits", tuple(logits.shape), logits.dtype)
    print("maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print("loss", logits.float().mean().item())
    print("not reached")
    """
)


def test_a_model_bigger_than_this_process_dry_runs_from_the_cli(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(BIG.format(root=str(ROOT)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k in ("TPU_DEBUG_TARGET_CACHE", "TPU_DEBUG_COMPILE_CACHE")}
    proc = warm_python.run(
        [sys.executable, "-m", "tpu_debug", "run", "--logdir", str(tmp_path / "runs"), "--target", "v6e",
         "--dry-run", str(script)],
        cwd=tmp_path, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    params = int(said["params"])
    assert params > 4 * GiB
    assert said["logits"] == "(8, 64, 128000) torch.bfloat16" and "not reached" not in said
    # what the process grew by after its imports (the model's meta build, the compiles) stayed
    # under the model's size: a materialized copy of the parameters alone would be that much
    assert int(said["maxrss"]) - int(said["rss0"]) < params
    # the stop names the line in one sentence, then the report
    line = BIG.splitlines().index('print("loss", logits.float().mean().item())') + 1
    stop = [ln for ln in proc.stderr.splitlines() if ln.startswith("tpu-debug run --dry-run: ")]
    assert len(stop) == 1 and f"serve.py:{line} (.item())" in stop[0], proc.stderr[-3000:]
    summary = memory_view(tpu_debug.open_run(logdir=tmp_path / "runs")).summary
    assert summary.dry_run and summary.target == "v6e" and summary.fits is True
    assert summary.peak_bytes >= params and summary.oom_programs == 0 and summary.programs > 0
    assert summary.stopped


def test_a_traced_dry_run_over_one_chip_is_one_of_the_runs_findings(tmp_path, capsys):
    import json

    from tpu_debug.cli import main

    n = 5 * GiB  # float32: 20 GiB, over a v5e chip's 16 GiB HBM
    stops = pytest.raises(dry_mode.DryRunValueError, match=r"the dry run needs a value .*\(\.item\(\)\)")
    with stops, tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target="v5e") as session:
        x = torch.empty(n, device="tpu")  # the big tensor
        x.mul_(2)
        x.sum().item()  # the read that stops it
    del x  # the traceback pytest keeps would hold it (and its 20 GiB) alive in the next test's trace
    lines = Path(__file__).read_text().splitlines()
    big, read = (next(i for i, t in enumerate(lines, 1) if marker in t) for marker in ("# the big tensor", "# the read that stops it"))
    found = {f.kind: f for f in session.findings()}
    fit = found["memory_fit"]
    assert fit.severity == "error" and fit.subject == "v5e"
    assert (os.path.basename(fit.evidence.location.file), fit.evidence.location.line) == ("test_dryrun_mode.py", big)
    assert fit.evidence.count("need per device") >= 4 * n > fit.evidence.count("HBM per device") > 15 * GiB
    # the tensor is held to the end, so its bytes must shrink: bfloat16 halves them to 10 GiB,
    # under the 15.75 GiB; a smaller batch or checkpointing would not touch them
    assert fit.cause == "state" and fit.fix.startswith("bfloat16"), fit.fix
    assert fit.evidence.count("need after bfloat16") < 15 * GiB
    stop = found["dry_run_stopped"]
    assert stop.evidence.location.line == read and ".item()" in stop.title
    # and so in report --json, which reads the advisor
    capsys.readouterr()
    assert main(["report", "--json", str(session.run_dir)]) == 0
    kinds = {f["kind"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert {"memory_fit", "dry_run_stopped"} <= kinds


def test_a_dry_run_that_fits_makes_no_memory_finding(tmp_path):
    gc.collect()  # tensors other tests left to the collector are live tpu tensors to a trace
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target="v5e") as session:
        x = torch.empty(1024, 1024, device="tpu")
        x.mul_(2)
    assert memory_view(session).summary.fits is True
    assert session.findings() == []


@pytest.mark.parametrize("spec", ["v5e", "v6e"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_matmul_of_empty_tensors_needs_what_the_same_jax_program_does(spec, dtype):
    # torch.empty tensors hold no relayout a device tensor would not: the product's TPU
    # program needs what jnp's a @ b on arrays of that shape needs, compiled straight
    # through JAX for the same target
    import jax
    import jax.numpy as jnp
    from tpu_debug.runtime.target import parse_target
    from tpu_debug.runtime.target._libtpu import topology

    n = 1024  # a multiple of the TPU tiles; a relayout of an operand would still be 1/3 of the total

    def step():
        a = torch.empty(n, n, dtype=dtype, device="tpu")
        b = torch.empty(n, n, dtype=dtype, device="tpu")
        (a @ b).sum(dim=0)

    result = tpu_debug.dry_run(step, target=spec)
    products = [p.result for p in result.programs if p.result is not None and "mm" in p.name]
    assert len(products) == 1, [p.name for p in result.programs]
    mine = products[0].memory
    sharding = jax.sharding.SingleDeviceSharding(topology(parse_target(spec))[0])
    jdtype = jnp.float32 if dtype == torch.float32 else jnp.bfloat16
    x = jax.ShapeDtypeStruct((n, n), jdtype, sharding=sharding)
    precision = "highest" if dtype == torch.float32 else None  # torch's float32 default
    stats = jax.jit(lambda a, b: jnp.dot(a, b, precision=precision)).lower(x, x).compile().memory_analysis()
    reference = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                 + stats.temp_size_in_bytes)
    assert mine.argument_bytes == stats.argument_size_in_bytes
    # within 2 %: a flat input's relayout would add a whole operand (1/3 of it) in temporaries
    assert mine.total_bytes - mine.generated_code_bytes == pytest.approx(reference, rel=0.02)
