"""The persistent compile cache: `tpu-debug run SCRIPT` cold, again warm, and with the cache off.

Each run is a fresh process (`python -m tpu_debug run --no-report`) with the
cache in a new temporary directory; the figures are read from the runs
recorded: compiles, their time, programs read back and the compile time that
saved, and the process's wall time. Writes nothing else; paste the table into
benchmarks/README.md.

    python benchmarks/compile_cache.py [--script examples/mlp_train.py] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpu_debug import open_run

_ROOT = Path(__file__).resolve().parent.parent


def _run(script: Path, logdir: Path, cache: Path, name: str, *extra: str) -> dict:
    env = dict(os.environ, TPU_DEBUG_COMPILE_CACHE_DIR=str(cache))
    env.pop("TPU_DEBUG_COMPILE_CACHE", None)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(logdir), "--name", name,
         *extra, str(script)],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    session = open_run(max(logdir.glob(f"*-{name}")))
    ops = session.ops()
    return {
        "wall": wall,
        "compiles": sum(o.compiles for o in ops),
        "compile_s": sum(o.compile_seconds for o in ops),
        "read_back": sum(o.read_back for o in ops),
        "saved_s": sum(o.saved_seconds for o in ops),
        "readback_s": sum(c.seconds for c in session.compiles() if c.from_cache),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", type=Path, default=_ROOT / "examples" / "mlp_train.py")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| run | wall | compiles | compile time | read back | read-back time | compile time saved |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            logdir, cache = Path(tmp) / "runs", Path(tmp) / "compile"
            for label, name, extra in (
                ("1st (cold cache)", "cold", ()),
                ("2nd (warm cache)", "warm", ()),
                ("3rd, `--no-compile-cache`", "off", ("--no-compile-cache",)),
            ):
                r = _run(args.script, logdir, cache, name, *extra)
                print(
                    f"| {label} | {r['wall']:.2f} s | {r['compiles']} | {r['compile_s']:.2f} s | {r['read_back']} "
                    f"| {r['readback_s']:.3f} s | {r['saved_s']:.2f} s |"
                )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
