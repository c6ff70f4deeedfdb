"""The checkout's wheel, built once per test session for every test that installs it.

``pip wheel --no-build-isolation`` builds in the checkout's own ``build/``: two xdist workers
building at once write and remove each other's files there. The first caller builds under an
exclusive lock and later callers, in any worker, take its wheel.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _session_dir() -> Path:
    # one folder per checkout and pytest session: xdist workers share the controller's
    # PYTEST_XDIST_TESTRUNUID; a single process has its own pid
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    tag = hashlib.sha1(f"{ROOT}:{run}".encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"tpu_debug-wheel-{tag}"
    folder.mkdir(exist_ok=True)
    return folder


def built_wheel() -> Path:
    """The path of the checkout's wheel (built by the first caller of the session)."""
    folder = _session_dir()
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = sorted(folder.glob("tpu_debug-*.whl"))
        if wheels:
            return wheels[-1]
        build = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(folder), str(ROOT)],
            capture_output=True, text=True, timeout=600, check=False,
        )
        shutil.rmtree(ROOT / "build", ignore_errors=True)
        assert build.returncode == 0, build.stderr[-2000:]
        (wheel,) = folder.glob("tpu_debug-*.whl")
        return wheel
