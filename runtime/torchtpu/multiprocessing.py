"""``torch_tpu._internal.distributed.multiprocessing`` and ``torch_tpu.shims.g3_multiprocessing``:
the entry points of TorchTPU's launch scripts.

``handle_main(main)`` runs ``main`` as ``absl.app.run(main)`` does (flags parsed from
``sys.argv``, ``main(argv)`` called, its return the exit status), which is TorchTPU's
open-source meaning of it; the ranks the script then starts (``torch.multiprocessing.spawn``,
``torch.distributed.run``) are PyTorch's. ``init_spawn()``/``parse_absl_flags()`` parse absl's
flags in a spawned rank that starts without them (flags the rank does not define, such as a
launcher's, are left alone).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["get_context", "handle_main", "handle_test_main", "init_spawn", "parse_absl_flags"]


def handle_main(main: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``absl.app.run(main, *args, **kwargs)``."""
    from absl import app

    return app.run(main, *args, **kwargs)


def handle_test_main(main: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``main(*args, **kwargs)`` (a test runner parses the flags itself)."""
    return main(*args, **kwargs)


def parse_absl_flags() -> None:
    """Parse absl's flags from ``sys.argv`` unless they are parsed (unknown flags are kept)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv, known_only=True)


def init_spawn() -> None:
    """What a spawned rank runs first: absl's flags parsed (see :func:`parse_absl_flags`)."""
    parse_absl_flags()


def get_context(method: str | None = None) -> Any:
    """``multiprocessing.get_context(method)``."""
    return multiprocessing.get_context(method)
