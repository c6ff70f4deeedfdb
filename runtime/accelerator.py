"""PyTorch's accelerator while the `tpu` device is registered: CPU until the script asks for `tpu`.

PyTorch decides its accelerator in C++ (``at::accelerator::getAccelerator``): a registered
PrivateUse1 backend comes first, before CUDA and the others, and PrivateUse1 counts as
registered as soon as it is renamed. Registering the `tpu` device renames it at ``import
torch``, so with the wheel installed ``torch._C._get_accelerator()`` would say ``tpu`` in
every process, and code that asks PyTorch for "the" accelerator changes what a CPU job
does: FSDP2's ``fully_shard(model)`` without a mesh builds its mesh on that device,
``init_process_group()`` with no backend picks that device's backend, ``barrier()`` and
``torch.accelerator.*`` use it.

The rename cannot wait (``torch.device("tpu")`` needs it), so the two functions PyTorch's
Python code asks, ``torch._C._get_accelerator`` and ``torch._C._accelerator_getAccelerator``
(behind ``torch.accelerator.current_accelerator``), answer as on a machine without an
accelerator until the script uses the device: its first kernel (a `tpu` tensor made, moved
or computed on), a process group or device mesh it makes for `tpu`
(``init_process_group("tpu_dist")``, ``init_process_group()`` with no backend, which asks
for the accelerator's as on TorchTPU, ``init_device_mesh("tpu", ...)``). From then on they
answer PyTorch's own ``tpu``. A CPU job (``init_process_group("gloo")``) never claims it
and runs as without the wheel. A script importing ``torch_tpu`` (written for TorchTPU, where
``tpu`` is the accelerator from the start) claims it at that import.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

__all__ = ["claim", "claimed", "install"]

_lock = threading.Lock()
_claimed = False
_originals: dict[str, Any] = {}


def _get_accelerator(*args: Any, **kwargs: Any) -> Any:
    if _claimed:
        return _originals["_get_accelerator"](*args, **kwargs)
    return torch.device("cpu")  # what PyTorch answers with no accelerator


def _accelerator_get_accelerator(*args: Any, **kwargs: Any) -> Any:
    if _claimed:
        return _originals["_accelerator_getAccelerator"](*args, **kwargs)
    return None  # no accelerator


_WRAPPERS = {"_get_accelerator": _get_accelerator, "_accelerator_getAccelerator": _accelerator_get_accelerator}


def install() -> None:
    """Make PyTorch's accelerator CPU until :func:`claim` (once; the device registration calls it)."""
    from torch._C._dynamo import eval_frame

    # PyTorch's code calls these in eager frames that run with dynamo's frame callback set
    # (after a graph break): dynamo runs their frames without looking at them, as it does the
    # C functions they stand in for
    skip = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
    for wrapper in _WRAPPERS.values():
        eval_frame.set_code_exec_strategy(wrapper.__code__, skip)
    with _lock:
        for name, wrapper in _WRAPPERS.items():
            current = getattr(torch._C, name, None)
            if current is None or current is wrapper:
                continue
            _originals[name] = current
            setattr(torch._C, name, wrapper)
    # a script that imported torch_tpu before the device registered (runtime/torchtpu/root.py)
    if getattr(sys.modules.get("torch_tpu"), "__tpu_debug_shim__", False):
        claim()


def claim() -> None:
    """The script uses the `tpu` device: PyTorch's accelerator is ``tpu`` from now on."""
    global _claimed
    if not _claimed:
        _claimed = True
        # torch.get_device_module() keeps its first answer for "the accelerator's module"
        cache_clear = getattr(torch.get_device_module, "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


def claimed() -> bool:
    """Whether the script has used the `tpu` device (PyTorch's accelerator is ``tpu``)."""
    return _claimed
