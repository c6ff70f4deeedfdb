"""``torch_tpu._internal.utils.log_utils``: where a TorchTPU example's log lines go."""

from __future__ import annotations

import logging
import sys

__all__ = ["log_to_stderr"]


def log_to_stderr() -> None:
    """Send absl's and Python's log records to stderr at INFO, one formatted line each
    (what TorchTPU's distributed examples call first)."""
    from absl import logging as absl_logging

    absl_logging.use_python_logging()
    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    logging.root.addHandler(handler)
    logging.root.setLevel(logging.INFO)
