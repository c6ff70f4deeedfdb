"""``torch_tpu._loader``: what TorchTPU's ``torch.backends`` entry point runs, and its device
initialization.

``load()`` registers the ``tpu`` device (idempotent), as TorchTPU's does when ``import torch``
autoloads it; ``_init_device("tpu")`` registers and starts it and returns the device, as
TorchTPU's tests call it. Code that calls ``load()`` itself does so to load TorchTPU's native
libraries next (google/tpu-sync's loader then opens ``libpywrap_torch_tpu_common.so`` beside
``torch_tpu.__file__``): there is none here, so ``load()`` says so once, in a
:class:`NoNativeExtensionWarning`, and :data:`NATIVE_EXTENSION` is None.
"""

from __future__ import annotations

import warnings

from tpu_debug.runtime import install
from tpu_debug.runtime.torchtpu.api import _init_device

__all__ = ["NATIVE_EXTENSION", "NoNativeExtensionWarning", "load"]

#: TorchTPU's native library; there is none under tpu_debug's runtime.
NATIVE_EXTENSION = None


class NoNativeExtensionWarning(UserWarning):
    """``torch_tpu`` here is tpu_debug's runtime: no TorchTPU C++ library is beside it."""


_said: list[bool] = []


def load() -> None:
    """Register the ``tpu`` device (TorchTPU's ``_loader.load``; idempotent), and say once that
    no native TorchTPU library is here for an extension built against it to load."""
    install()
    if not _said:
        _said.append(True)
        warnings.warn(
            "torch_tpu is tpu_debug's runtime here: the tpu device is registered, but there is no native "
            "TorchTPU library beside torch_tpu.__file__ (no common/libpywrap_torch_tpu_common.so), so a C++ "
            "extension built against TorchTPU cannot load; use the extension's pure-Python or JAX path",
            NoNativeExtensionWarning, stacklevel=2)


# TorchTPU's tests call ``_loader._init_device("tpu")`` (see :func:`.api._init_device`)
__all__ += ["_init_device"]
