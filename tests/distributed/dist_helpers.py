"""Helpers of the distributed tests: child pythons with a chosen number of CPU devices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    return subprocess.run(
        [sys.executable, *args], env=python_env(devices, **extra), cwd=cwd or REPO, capture_output=True,
        text=True, timeout=timeout, check=False,
    )
