"""The entry points PyTorch loads: ``import torch`` registers the ``tpu`` device
(``torch.backends``), and dynamo finds the ``tpu_debug`` backend (``torch_dynamo_backends``).

PyTorch loads every ``torch.backends`` entry point at the end of ``import torch``
(out-of-tree backend autoload; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off), and
turns an exception raised here into a failed ``import torch`` for every program in the
environment. So nothing escapes :func:`load`: a device that cannot be registered is said
in one line on stderr, and torch imports as if tpu_debug were not installed.
"""

from __future__ import annotations

import sys
from typing import Any

from tpu_debug import runtime
from tpu_debug.core import torch_tpu_finder
from tpu_debug.core.autoload import defer, runtime_importing

__all__ = ["dynamo_backend", "load"]


def _real_tpu_owner() -> bool:
    """True when TorchTPU is installed and a TPU chip is attached: that device is the real one."""
    if not torch_tpu_finder.installed_elsewhere():  # find_spec would find the modules served here
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
        runtime.install()
    except Exception as error:  # noqa: BLE001 - must not fail `import torch` (see the module)
        print(f"tpu_debug: the 'tpu' device is not registered: {error}", file=sys.stderr)


def dynamo_backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """The ``torch_dynamo_backends`` entry point. Dynamo loads it only for a backend name the
    runtime has not registered, which ``install()`` does: so the device was not registered
    (PyTorch's backend autoload off), and this registers it before the graph compiles
    (``DeviceTakenError`` when another backend owns PrivateUse1)."""
    runtime.install()
    # PyTorch may load this module in the middle of `import torch`, which the runtime's
    # modules import: they are imported when called
    # deferred: autoload: torch is still importing when its entry points are read
    from tpu_debug.runtime.compiled import dynamo_backend as compile_graph

    return compile_graph(gm, example_inputs, **kwargs)
