"""Values on both sides: a device storage's payload, its CPU copy, and the tensors inside op arguments.

A ``tpu`` tensor's storage holds its value as an immutable jax array (the
*payload*, under ``PAYLOAD_ATTR``); a write replaces the payload, so holding a
payload is a snapshot of the storage. A tensor is a view of its storage's
payload through its shape, strides and offset (:func:`geometry`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import torch
from tpu_debug.runtime.tensor import PAYLOAD_ATTR, Uninit

__all__ = [
    "BF16",
    "CPU",
    "all_finite",
    "covers",
    "finite",
    "geometry",
    "host_copy",
    "is_float_payload",
    "map_tpu",
    "on_tpu",
    "payload_of",
    "single_threaded",
    "tensors",
    "value_at",
]

CPU = torch.device("cpu")
BF16 = np.dtype(ml_dtypes.bfloat16)  # numpy's view of bfloat16 arrays (ml_dtypes comes with jax)

# argument values that hold no tensor: not walked into
_LEAVES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.layout})


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's argument or result (nested lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif type(value) in _LEAVES:
        return
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def map_tpu(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with each ``tpu`` tensor replaced by ``fn(tensor)`` and a ``tpu`` device by the CPU."""
    if isinstance(value, torch.Tensor):
        return fn(value) if value.device.type == "tpu" else value
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is tuple or kind is list:
        return kind([map_tpu(v, fn) for v in value])
    if isinstance(value, (list, tuple)):  # FX's immutable_list, torch.Size
        return type(value)(map_tpu(v, fn) for v in value)
    if isinstance(value, dict):  # FX's immutable_dict too
        return {k: map_tpu(v, fn) for k, v in value.items()}
    if kind is torch.device and value.type == "tpu":
        return CPU
    return value


def value_at(args: tuple, kwargs: dict, pos: int, name: str) -> Any:
    """The argument at schema position ``pos`` (named ``name``), passed positionally or by keyword."""
    return args[pos] if pos < len(args) else kwargs.get(name)


def on_tpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def payload_of(t: torch.Tensor) -> Any:
    """The current payload of ``t``'s storage (None for a CPU tensor)."""
    return getattr(t.untyped_storage(), PAYLOAD_ATTR, None)


def host_copy(payload: Any, dtype: torch.dtype) -> torch.Tensor:
    """A CPU copy of a storage payload, in the payload's shape, contiguous (a fresh tensor:
    CPU ops may write it)."""
    if payload is None or type(payload) is Uninit:
        n = int(getattr(payload, "numel", 0) or 0)
        return torch.zeros(n, dtype=dtype)
    a = np.array(payload)  # a copy
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def geometry(host: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t``'s view of its storage's values ``host`` (contiguous, any shape)."""
    if t.storage_offset() == 0 and host.shape == t.shape and t.is_contiguous():
        return host
    return host.view(-1).as_strided(tuple(t.shape), t.stride(), t.storage_offset())


def covers(t: torch.Tensor) -> bool:
    """``t`` is its whole storage, densely (writing it replaces the storage's value)."""
    size = getattr(payload_of(t), "size", None)
    return t.storage_offset() == 0 and t.is_contiguous() and size == t.numel()


def finite(t: torch.Tensor) -> bool:
    """No NaN/Inf in a CPU tensor; non-float tensors are finite."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex) or t.numel() == 0:
        return True
    return bool(torch.isfinite(t).all())


def is_float_payload(payload: Any) -> bool:
    dtype = getattr(payload, "dtype", None)
    return dtype is not None and (np.dtype(dtype) == BF16 or np.dtype(dtype).kind in "fc")


def all_finite(payload: Any) -> bool:
    """No NaN/Inf in a jax payload (or a CPU tensor); non-float values are finite."""
    if isinstance(payload, torch.Tensor):
        return finite(payload)
    if payload is None or not hasattr(payload, "dtype") or type(payload) is Uninit:
        return True
    a = np.asarray(payload)
    if a.dtype == BF16:
        a = a.astype(np.float32)
    elif a.dtype.kind not in "fc":
        return True
    return bool(np.isfinite(a).all())


class single_threaded:
    """PyTorch's CPU ops on one thread, without autograd, and numpy quiet, meanwhile. The reference ops are
    small and interleave with XLA's: OpenMP workers spinning after each of them starve
    XLA's threads (40x slower on 2 cores); one thread has no workers to spin."""

    __slots__ = ("grad", "numpy", "threads")

    def __enter__(self) -> None:
        # NaN/Inf differences are measured, not warned about (set once here, not per comparison)
        self.numpy = np.seterr(all="ignore")
        self.grad = torch.is_grad_enabled()
        if self.grad:
            torch._C._set_grad_enabled(False)
        self.threads = torch.get_num_threads()
        if self.threads != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.threads != 1:
            torch.set_num_threads(self.threads)
        if self.grad:
            torch._C._set_grad_enabled(True)
        np.seterr(**self.numpy)
