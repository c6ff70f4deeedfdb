"""The HBM one device of a target offers a program, as the TPU compiler itself counts it.

The spec sheet's figure is not what a program gets: the compiler keeps some of
the chip for itself (v5e offers 15.75 of its 16 GiB, v6e 31.25 of 32, a v4
TensorCore 15.25 of 16). Its out-of-memory message states the figure to
0.01 GiB ("exceeds available HBM (15.75G)"); the exact limit is found by
compiling programs that hold one array just below and just above it, and
keeping the biggest program the compiler accepted (to 4 KiB: the array grows
by one (8, 128) float32 tile a step). A dozen compiles of a trivial program,
about a second, once per (topology, jax, jaxlib, libtpu): the figure is kept in
the target compile cache.
"""

from __future__ import annotations

import hashlib
import threading

from tpu_debug.runtime.target import cache
from tpu_debug.runtime.target._libtpu import libtpu_version
from tpu_debug.runtime.target.compile import compile_for_target
from tpu_debug.runtime.target.errors import LibtpuMissingError, TargetError
from tpu_debug.runtime.target.hardware import Target

# The tracers the report imports read capacities through this module: the compiler (jax) is
# imported by the measurement.

__all__ = ["usable_hbm_bytes", "hbm_capacity"]

_TILE = 8 * 128 * 4  # one float32 (8, 128) tile: an array of such rows has no padding
_MARGIN = 32 * 1024**2  # well beyond the message's rounding to 0.01 GiB
_FAR_TOO_BIG = (200_000, 200_000)  # 149 GiB of float32: more than any chip

_memo: dict[str, int] = {}
_lock = threading.Lock()


def usable_hbm_bytes(tgt: Target) -> int:
    """The most HBM bytes one device's program may need (arguments, outputs, temporaries, code).

    Raises:
        LibtpuMissingError: libtpu is not installed.
        TargetError: the compiler stated no limit, or accepted or refused against it.
    """
    with _lock:
        if tgt.topology in _memo:
            return _memo[tgt.topology]
        key = _key(tgt)
        value = cache.load_value(key)
        if not isinstance(value, int) or value <= 0:
            value = _measure(tgt)
            cache.store_value(key, value)
        _memo[tgt.topology] = value
        return value


def hbm_capacity(tgt: Target) -> tuple[int, str]:
    """``(bytes, source)``: the compiler's figure (``"compiler"``), or the spec sheet's
    (``"spec"``) where libtpu is not installed to ask or its compiler stated no limit."""
    try:
        return usable_hbm_bytes(tgt), "compiler"
    except TargetError:  # a limit that cannot be measured is not worth failing a report for
        return tgt.spec_hbm_bytes_per_device, "spec"
    except LibtpuMissingError:
        return tgt.spec_hbm_bytes_per_device, "spec"


def _key(tgt: Target) -> str:
    import jax
    import jaxlib

    h = hashlib.sha256()
    for part in ("capacity", tgt.topology, jax.__version__, jaxlib.__version__, libtpu_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _probe(tgt: Target, tiles: int):
    """Compile a program holding one array of ``tiles`` float32 tiles (and reading 8 rows of it)."""
    import jax
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((8 * tiles, 128), jnp.float32)
    return compile_for_target(lambda a: a[:8], (x,), tgt, cache=False)


def _measure(tgt: Target) -> int:
    import jax
    import jax.numpy as jnp

    refused = compile_for_target(lambda a: a + 1, (jax.ShapeDtypeStruct(_FAR_TOO_BIG, jnp.float32),), tgt,
                                 cache=False)
    stated = refused.error.available_bytes if refused.error is not None else None
    if stated is None:
        raise TargetError(f"the TPU compiler for {tgt.name} stated no HBM limit: {refused.error}")
    lo, hi = max(1, (stated - _MARGIN) // _TILE), (stated + _MARGIN) // _TILE
    accepted = _probe(tgt, lo)
    if not accepted.ok or _probe(tgt, hi).ok:
        raise TargetError(
            f"the TPU compiler for {tgt.name} states {stated} B of HBM but does not accept "
            f"{lo * _TILE} B and refuse {hi * _TILE} B around it"
        )
    while hi - lo > 1:  # lo is accepted, hi refused
        mid = (lo + hi) // 2
        result = _probe(tgt, mid)
        if result.ok:
            lo, accepted = mid, result
        else:
            hi = mid
    return accepted.memory.total_bytes
