"""The ``torch.backends`` entry point: ``import torch`` registers the ``tpu`` device.

PyTorch loads every ``torch.backends`` entry point at the end of ``import torch``
(out-of-tree backend autoload; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off), and
turns an exception raised here into a failed ``import torch`` for every program in the
environment. So nothing escapes :func:`load`: a device that cannot be registered is said
in one line on stderr, and torch imports as if tpu_debug were not installed.
"""

from __future__ import annotations

import importlib.util
import sys

from tpu_debug.core.autoload import defer, runtime_importing

__all__ = ["load"]


def _real_tpu_owner() -> bool:
    """True when TorchTPU is installed and a TPU chip is attached: that device is the real one."""
    if importlib.util.find_spec("torch_tpu") is None:
        return False
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except (ImportError, AttributeError, OSError):
        return False


def load() -> None:
    """Register the ``tpu`` device unless a real TorchTPU owns it here (see the module)."""
    if runtime_importing():
        # a runtime module's import brought torch in: the device cannot be registered with that
        # module half-imported, so the runtime's package registers it when it next hands out a
        # name (tpu_debug.core.autoload)
        defer(_register)
        return
    _register()


def _register() -> None:
    if _real_tpu_owner():
        print(
            "tpu_debug: torch_tpu is installed and a TPU is attached, so the 'tpu' device is "
            "TorchTPU's; tpu_debug's runtime is not registered (its tracers and reading verbs still work)",
            file=sys.stderr,
        )
        return
    try:
        from tpu_debug.runtime import install

        install()
    except Exception as error:  # noqa: BLE001 - must not fail `import torch` (see the module)
        print(f"tpu_debug: the 'tpu' device is not registered: {error}", file=sys.stderr)

