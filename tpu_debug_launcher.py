"""The ``tpu-debug`` console script.

``import tpu_debug`` imports neither torch (~1.0 s) nor jax (~0.45 s), so the reading
verbs (``tui``, ``report``, ``runs``, ``tensorboard``, ``diff``), ``--help`` and
``--version`` start without them in any process (this script, ``python -m tpu_debug``,
a notebook). What this script adds: ``run`` with a missing script says so before torch
is imported, and the reading verbs ignore the recording options' ``TPU_DEBUG_*``
variables (:func:`tpu_debug.core.options.ignore_recording_options`), since they record
nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tpu_debug.core.options import ignore_recording_options
from tpu_debug.core.run_args import early_error

from tpu_debug.cli import main as cli_main

__all__ = ["READING_VERBS", "main"]

READING_VERBS = frozenset({"tui", "report", "runs", "tensorboard", "diff"})


def _verb(argv: Sequence[str]) -> str | None:
    # the top-level parser has options (--help, --version) but none that takes a value
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tpu-debug`` command line (see :func:`tpu_debug.cli.main`); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verb = _verb(args)
    if verb == "run" and "torch" not in sys.modules:
        # a missing script is said at once, before torch and jax are imported (seconds)
        error = early_error(args[args.index("run") + 1:])
        if error is not None:
            print(f"tpu-debug run: {error}", file=sys.stderr)
            return error.exit_code

    if verb not in READING_VERBS:
        return cli_main(args)
    # they record nothing: a bad recording variable (TPU_DEBUG_HLO=junk) must not stop them
    with ignore_recording_options():
        return cli_main(args)
