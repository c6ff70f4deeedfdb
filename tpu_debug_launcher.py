"""The ``tpu-debug`` console script.

It lives outside the ``tpu_debug`` package because ``import tpu_debug`` registers
the ``tpu`` device, which imports torch (~1.0 s) and jax (~0.45 s). The reading
verbs (``tui``, ``report``, ``runs``, ``tensorboard``, ``diff``) only read a run store, so
for them (and for ``--help`` and ``--version``) this module sets :data:`read_only`
before it imports the package: the package then skips the registration and
exposes its API lazily. ``run`` and every other verb import ``tpu_debug`` as
``import tpu_debug`` always does. The reading verbs also ignore the recording
options' ``TPU_DEBUG_*`` variables (:func:`tpu_debug_core.options.ignore_recording_options`).

The flag lives in this process only (never in the environment), so a child
process that imports ``tpu_debug`` registers the device as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["READING_VERBS", "main", "read_only"]

READING_VERBS = frozenset({"tui", "report", "runs", "tensorboard", "diff"})

#: Read by ``tpu_debug/__init__.py`` when it is first imported; set only by :func:`main`.
read_only = False


def _verb(argv: Sequence[str]) -> str | None:
    # the top-level parser has options (--help, --version) but none that takes a value
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tpu-debug`` command line (see :func:`tpu_debug.cli.main`); returns the exit code."""
    global read_only
    args = list(sys.argv[1:] if argv is None else argv)
    verb = _verb(args)
    # no verb: --help, --version or the usage, which need the device no more than 'report' does
    if "tpu_debug" not in sys.modules and (verb is None or verb in READING_VERBS):
        read_only = True
    if verb == "run" and "tpu_debug" not in sys.modules:
        # a missing script is said at once, before torch and jax are imported (seconds)
        from tpu_debug_core.run_args import early_error

        error = early_error(args[args.index("run") + 1:])
        if error is not None:
            print(f"tpu-debug run: {error}", file=sys.stderr)
            return error.exit_code
    from tpu_debug.cli import main as cli_main

    if verb not in READING_VERBS:
        return cli_main(args)
    # they record nothing: a bad recording variable (TPU_DEBUG_HLO=junk) must not stop them
    from tpu_debug_core.options import ignore_recording_options

    with ignore_recording_options():
        return cli_main(args)
