"""Helpers of the distributed tests: child pythons with a chosen number of CPU devices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import warm_python

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def python_env(devices: int | None = None, **extra: str) -> dict[str, str]:
    """This environment for a child python: no TPU_DEBUG_* of the test process, ``devices``
    CPU devices, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.update(extra)
    return env


def run_python(args: list[str], *, devices: int | None = None, timeout: float = 600, cwd: Path | None = None,
               **extra: str) -> subprocess.CompletedProcess:
    return warm_python.run([sys.executable, *args], env=python_env(devices, **extra), cwd=cwd or REPO, timeout=timeout)


def ranks_on_both_devices(launch: list[str], base: Path, *, timeout: float = 300,
                          env: dict[str, dict[str, str]] | None = None) -> dict[str, list[dict]]:
    """Run ``launch + [device, out]`` for the `tpu` device and for CPU with gloo at once, and
    return each device's per-rank results (``rank<r>.pt`` in ``out``, two ranks), side by
    side: the reference a distributed result is compared with is the same script on gloo.
    ``env``: more variables for one device's run."""
    procs = {}
    for device in ("tpu", "cpu"):
        out = base / device
        out.mkdir()
        procs[device] = subprocess.Popen([*launch, device, str(out)], env=python_env(**(env or {}).get(device, {})),
                                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = {}
    for device, proc in procs.items():
        output, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{device} ranks failed:\n{output[-6000:]}"
        results[device] = [torch.load(base / device / f"rank{r}.pt") for r in range(2)]
    return results


def assert_exactly_gloos(ranks: dict[str, list[dict]], key: str) -> None:
    """Result ``key`` of a collective is gloo's on every rank: same dtype, shape and values
    (a collective moves or reduces the same numbers in the same order)."""
    for rank in range(2):
        got, want = ranks["tpu"][rank][key], ranks["cpu"][rank][key]
        assert got.dtype == want.dtype and got.shape == want.shape, f"rank {rank}"
        assert torch.equal(got, want), f"rank {rank}: {got} != {want}"


def assert_trained_as_gloo(ranks: dict[str, list[dict]], what: str) -> None:
    """Training ``what`` gave gloo's losses and parameters on every rank, and the ranks' full
    parameters agree exactly. The tolerance is float32 rounding: XLA's CPU kernels sum in
    another order than PyTorch's, a few ulps per step over a few steps."""
    for rank in range(2):
        mine, ref = ranks["tpu"][rank], ranks["cpu"][rank]
        torch.testing.assert_close(mine[f"{what}.losses"], ref[f"{what}.losses"], rtol=1e-5, atol=1e-6)
        for got, want in zip(mine[f"{what}.params"], ref[f"{what}.params"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(ranks["tpu"][0][f"{what}.params"], ranks["tpu"][1][f"{what}.params"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
