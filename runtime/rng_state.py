"""Device RNG state: a seed and a counter, turned into a fresh PRNG key per op.

Keys are built on the host (no device op per draw) as raw threefry key data
``uint32[2]``; the key is an input of the executable, never baked in, so a new
draw does not recompile.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from tpu_debug.core.errors import TpuArgumentError

__all__ = ["manual_seed", "seed", "initial_seed", "next_key", "key_from_generator", "get_rng_state", "set_rng_state"]

_lock = threading.Lock()
_seed = 67280421310721
_counter = 0


def manual_seed(s: int) -> None:
    global _seed, _counter
    with _lock:
        _seed = int(s) & 0xFFFF_FFFF_FFFF_FFFF
        _counter = 0


def seed() -> int:
    s = int(np.random.SeedSequence().entropy) & 0xFFFF_FFFF_FFFF_FFFF
    manual_seed(s)
    return s


def initial_seed() -> int:
    return _seed


def next_key() -> np.ndarray:
    global _counter
    with _lock:
        c = _counter
        _counter += 1
        s = _seed
    hi = (s >> 32) ^ (s & 0xFFFF_FFFF) ^ ((c >> 32) * 0x9E3779B9)
    return np.array([hi & 0xFFFF_FFFF, c & 0xFFFF_FFFF], dtype=np.uint32)


def key_from_generator(generator: torch.Generator) -> np.ndarray:
    """A key drawn from an explicit ``torch.Generator``.

    PyTorch cannot create a Generator for a Python-registered PrivateUse1
    device, so a CPU generator is accepted: each draw advances it, so the same
    ``manual_seed`` gives the same tpu numbers and consecutive calls differ.
    """
    if generator.device.type not in ("cpu", "tpu"):
        raise TpuArgumentError(
            f"generator on {generator.device} cannot drive tpu random ops; "
            "pass a CPU torch.Generator (tpu generators cannot be created in PyTorch's Python API)"
        )
    bits = torch.randint(0, 2**62, (1,), generator=generator).item()
    return np.array([(bits >> 31) & 0xFFFF_FFFF, bits & 0x7FFF_FFFF], dtype=np.uint32)


def get_rng_state() -> torch.Tensor:
    """The state as a CPU uint8 tensor (16 bytes: seed, counter)."""
    with _lock:
        raw = np.array([_seed, _counter], dtype=np.uint64)
    return torch.from_numpy(raw.view(np.uint8).copy())


def set_rng_state(state: torch.Tensor) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise TpuArgumentError(
            "tpu RNG state must be the uint8 tensor of 16 bytes that "
            "torch.tpu.get_rng_state() returned"
        )
    global _seed, _counter
    seed_, counter = state.cpu().numpy().view(np.uint64).tolist()
    with _lock:
        _seed, _counter = int(seed_), int(counter)
