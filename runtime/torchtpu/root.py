"""``torch_tpu`` itself, where TorchTPU is not installed: the package of TorchTPU's modules,
served by tpu_debug's runtime.

``torch_tpu.__file__`` is this file: a caller that looks beside the package for TorchTPU's
native libraries (``Path(torch_tpu.__file__).parent / "common" / "libpywrap_torch_tpu_common.so"``,
as google/tpu-sync's loader does) finds the folder of the runtime's Python modules and no
native extension in it, which is the truth: nothing here is built against TorchTPU's C++
ABI, and an extension linked against it cannot load. ``torch_tpu._loader.NATIVE_EXTENSION``
is None for the same reason. Importing this module loads neither torch nor jax, as
``import torch_tpu`` before ``import torch`` should not.

A script that imports ``torch_tpu`` is written for TorchTPU, where `tpu` is PyTorch's
accelerator (``torch.accelerator.current_accelerator()``, which TorchTPU's examples place
their models with): importing it makes `tpu` the accelerator here too, now if the device is
registered, else when it registers (``runtime/accelerator.py`` says why a script that does
not use the device keeps CPU).
"""

from __future__ import annotations

import sys

__all__: list[str] = []

_accelerator = sys.modules.get("tpu_debug.runtime.accelerator")
if _accelerator is not None:
    _accelerator.claim()
