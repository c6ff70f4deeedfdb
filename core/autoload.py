"""A device registration that waits for ``tpu_debug.runtime`` to finish importing.

torch's backend autoload calls the ``torch.backends`` entry point (``tpu_debug._loader``) at
the end of ``import torch``. When that import was started by ``tpu_debug.runtime``'s own
modules, the runtime is half-imported and cannot register the device yet: the entry point
leaves its registration here, and the runtime's ``__init__`` runs it as its last line. The
hand-off lives in core because the entry point sits above the runtime and the runtime may not
import it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["defer", "run_deferred"]

_waiting: list[Callable[[], None]] = []


def defer(register: Callable[[], None]) -> None:
    """Run ``register`` when :func:`run_deferred` is next called (once)."""
    if register not in _waiting:
        _waiting.append(register)


def run_deferred() -> None:
    """Run the registrations :func:`defer` kept, in order, each once."""
    while _waiting:
        _waiting.pop(0)()
