"""TorchTPU's Python modules on this runtime, for scripts written for TorchTPU.

Where TorchTPU is not installed, ``import torch_tpu`` (and its ``api``, ``utils``,
``_internal.sync``, ``.profiler``, ``.pallas``, ``.execution_mode``, the launcher) resolves
to the modules of this package through the finder of :mod:`tpu_debug.core.torch_tpu_finder`
(the wheel's ``.pth`` file installs it at start-up, the device registration again). Each
module here holds TorchTPU's names, with TorchTPU's signatures and return types, over
tpu_debug's runtime; ``docs/torchtpu_compat.md`` lists every name and what it does here.

The ``torch.tpu`` submodules TorchTPU's ``public_api`` declares (``torch.tpu.compiler``,
``ops``, ``optimizers``, ``pallas``, ``profiler``, ``distributed``) are in :mod:`.public`.
"""

from __future__ import annotations
