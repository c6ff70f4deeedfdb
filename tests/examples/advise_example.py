"""Run one example under ``tpu-debug run`` and print the findings of its run, as one line
``FINDINGS [finding, ...]`` (each ``Finding.to_dict()``), after whatever the script printed.

    python advise_example.py LOGDIR [RUN_OPTIONS...] -- SCRIPT [ARGS...]

One example per process: examples register torch libraries and set runtime
options that a second run in the same process would trip over, and a warm
cache would hide the compiles of a pitfall.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import tpu_debug
    from tpu_debug.cli import main as cli

    logdir, *rest = argv
    split = rest.index("--")
    options, command = rest[:split], rest[split + 1 :]
    code = cli(["run", "--no-hlo", "--logdir", logdir, "--name", "example", *options, *command])
    run = tpu_debug.open_run("example", logdir=logdir)
    findings = [f.to_dict() for f in run.findings()]
    sys.stdout.flush()
    print("FINDINGS " + json.dumps(findings), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
