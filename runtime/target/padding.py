"""The HBM bytes a TPU gives one array, as its compiler lays it out: tiles padded.

A TPU stores an array in tiles (``{0,2,1:T(8,128)}`` for an f32[N,10,10]: the two
minor dimensions padded to 8 x 128, 1.6x the logical bytes), and which layout it
picks depends on the shape, the dtype and the generation. Rather than restate
those rules, the compiler is asked: a deviceless compile of a program taking one
array of that shape and dtype as an entry parameter, whose argument bytes are the
array's size in HBM. One compile per (topology, shape, dtype, jax, jaxlib, libtpu),
kept in memory and in the target compile cache.
"""

from __future__ import annotations

import hashlib
import threading

from tpu_debug.runtime.target import cache
from tpu_debug.runtime.target._libtpu import libtpu_version
from tpu_debug.runtime.target.compile import compile_for_target
from tpu_debug.runtime.target.errors import LibtpuMissingError, TargetError
from tpu_debug.runtime.target.hardware import Target

# The tracers the report imports read paddings through this module: the compiler (jax) is
# imported by the measurement.

__all__ = ["padded_bytes"]

_memo: dict[tuple[str, tuple[int, ...], str], int | None] = {}
_lock = threading.Lock()


def padded_bytes(tgt: Target, shape: tuple[int, ...], dtype: str) -> int | None:
    """The bytes one ``dtype[shape]`` array takes in one device's HBM on ``target``, or None
    where the compiler gives no figure (libtpu missing, a dtype the TPU has not, an array
    larger than the device: the caller keeps the logical bytes).

    Args:
        tgt: the target.
        shape: the array's dimensions.
        dtype: a NumPy dtype name (``"float32"``, ``"bfloat16"``).
    """
    key = (tgt.topology, tuple(int(d) for d in shape), str(dtype))
    found = _memo.get(key, _memo)  # a dict read: the hot path takes no lock
    if found is not _memo:
        return found
    with _lock:
        if key in _memo:
            return _memo[key]
        value = _cached_or_measured(tgt, key[1], key[2])
        _memo[key] = value
        return value


def _cached_or_measured(tgt: Target, shape: tuple[int, ...], dtype: str) -> int | None:
    try:
        disk_key = _key(tgt, shape, dtype)
    except LibtpuMissingError:
        return None
    value = cache.load_value(disk_key)
    if isinstance(value, int) and value > 0:
        return value
    try:
        value = _measure(tgt, shape, dtype)
    except (LibtpuMissingError, TargetError, TypeError, ValueError):
        return None
    if value is not None:
        cache.store_value(disk_key, value)
    return value


def _key(tgt: Target, shape: tuple[int, ...], dtype: str) -> str:
    import jax
    import jaxlib

    h = hashlib.sha256()
    for part in ("padded", tgt.topology, repr(shape), dtype, jax.__version__, jaxlib.__version__,
                 libtpu_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _measure(tgt: Target, shape: tuple[int, ...], dtype: str) -> int | None:
    import jax
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    # one element out: the output is tiny, so an array near the device's size still compiles
    # 64-bit on, as the runtime keeps tensors: an int64 array is not narrowed to int32
    result = compile_for_target(lambda a: a[(0,) * a.ndim] if a.ndim else a, (x,), tgt, x64=True, cache=False)
    if not result.ok or result.memory is None:
        return None
    return int(result.memory.argument_bytes)
