"""TorchTPU's debugging utilities on this runtime: cache statistics, an op tracer,
and ``assert_close`` with tolerances fit for TPU numerics.

``torch.tpu._get_cache_stats()`` reads the runtime's executable caches;
``torch.tpu.utils.OpTracer`` counts the ops a block dispatches, with TorchTPU's
``ops_log`` / ``num_atens()`` and ``pformat_op_tracer``; ``torch.tpu.utils.assert_close``
is ``torch.testing.assert_close`` with defaults that follow the float32 matmul
precision in effect, and a failure that says which tolerances would pass.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tpu_debug.runtime import compiled, eager, lazy
from tpu_debug.runtime.config import config

__all__ = [
    "CacheEntryStats",
    "CacheStats",
    "OpTracer",
    "assert_close",
    "get_cache_stats",
    "pformat_op_tracer",
    "suggested_tolerances",
]


# ---------------------------------------------------------------------------
# Cache statistics
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CacheEntryStats:
    """One cached executable: what it runs, how often it was asked for, its compile time."""

    name: str
    requests: int
    hits: int
    compile_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class CacheStats:
    """One executable cache (``"eager executables"``, ``"fused programs"``,
    ``"compiled programs"``) over the entries it holds now.

    ``requests`` counts the calls that looked an executable up, ``hits`` those that
    found it compiled; an entry's first request is its compile, so ``misses`` is
    ``requests - hits``. Entries evicted by the cache's bound take their counts with
    them (``runtime.cache_counts()`` counts the evictions).
    """

    name: str
    entries: tuple[CacheEntryStats, ...]

    @property
    def requests(self) -> int:
        return sum(e.requests for e in self.entries)

    @property
    def hits(self) -> int:
        return sum(e.hits for e in self.entries)

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    @property
    def compile_seconds(self) -> float:
        return sum(e.compile_seconds for e in self.entries)


def get_cache_stats() -> tuple[CacheStats, ...]:
    """Requests, hits and compile time of every cached executable, per cache.

    Returns:
        One :class:`CacheStats` per executable cache: eager ops, lazy mode's fused
        programs, and ``torch.compile`` graphs' programs.

    Example::

        {c.name: (c.requests, c.hits) for c in torch.tpu._get_cache_stats()}
        # {'eager executables': (12, 9), 'fused programs': (3, 2), 'compiled programs': (0, 0)}
    """
    eager_entries = tuple(
        CacheEntryStats(s.op, s.calls, s.hits, s.compile_seconds) for s in eager.cache_stats()
    )
    # a fused program or a compiled graph's program is compiled by its first call
    fused = tuple(
        CacheEntryStats(e.name, e.calls, max(e.calls - 1, 0), e.seconds) for e in lazy._fused.values()
    )
    # the compiled-programs cache is keyed by each program's entry (its value: where it is kept)
    programs = tuple(
        CacheEntryStats(
            _program_name(e), e.calls, max(e.calls - 1, 0), e.info.seconds if e.info is not None else 0.0
        )
        for e in compiled._programs
    )
    return (
        CacheStats("eager executables", eager_entries),
        CacheStats("fused programs", fused),
        CacheStats("compiled programs", programs),
    )


def _program_name(entry: Any) -> str:
    return entry.info.name if entry.info is not None else "program"


# ---------------------------------------------------------------------------
# Op tracer
# ---------------------------------------------------------------------------


class OpTracer(TorchDispatchMode, contextlib.ContextDecorator):
    """Counts the ops dispatched inside it, per namespace (TorchTPU's ``utils.OpTracer``).

    Usable as a context manager or a decorator. Ops are counted as the dispatcher
    sees them below autograd (``aten.mm.default``, ``aten.add_.Tensor``), on any device.

    Attributes:
        ops_log: namespace (``"aten"``) -> op (``"aten.mm.default"``) -> calls.

    Example::

        with torch.tpu.utils.OpTracer() as tracer:
            y = x @ w
        tracer.ops_log["aten"]["aten.mm.default"], tracer.num_atens()
        # (1, 1)
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops_log: dict[str, dict[str, int]] = collections.defaultdict(dict)

    def __enter__(self) -> Self:
        super().__enter__()
        self.ops_log = collections.defaultdict(dict)
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counts = self.ops_log[func.namespace]
        name = str(func)
        counts[name] = counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def num_atens(self) -> int:
        """How many aten op calls were traced."""
        return sum(self.ops_log.get("aten", {}).values())


def pformat_op_tracer(tracer: OpTracer) -> str:
    """The tracer's counts, one namespace header and one line per op (most called first)."""
    lines = []
    for namespace in sorted(tracer.ops_log):
        ops = tracer.ops_log[namespace]
        lines.append(f"Ops for namespace: '{namespace}' ({len(ops)} ops)")
        lines += [f"  {op}: {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# assert_close
# ---------------------------------------------------------------------------

# float32 products by matmul precision: "medium" is one bfloat16 pass (bfloat16's 8-bit
# significand, so bfloat16's tolerances); "high" is three passes (about 16 bits:
# 2**-16 = 1.5e-5, with a margin of ~6x for accumulation over the reduced dimension)
_FLOAT32_BY_PRECISION = {"highest": (1.3e-6, 1e-5), "high": (1e-4, 1e-5), "medium": (1.6e-2, 1e-5)}


def suggested_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """The (rtol, atol) to compare values of ``dtype`` computed on this device.

    Float32 follows the float32 matmul precision in effect (``torch.tpu.precision``):
    a TPU's default one-pass bfloat16 products need bfloat16's tolerances. Other
    dtypes get ``torch.testing.assert_close``'s defaults; integers and bools 0.
    """
    if dtype in (torch.float32, torch.complex64):
        return _FLOAT32_BY_PRECISION[config.effective_precision()]
    # torch.testing.assert_close's own defaults, read from it rather than copied
    from torch.testing._comparison import default_tolerances

    return default_tolerances(dtype)


def _needed(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[float, float]:
    """The smallest rtol (given ``atol``) and atol (given ``rtol``) with which every
    finite element passes ``|a - e| <= atol + rtol * |e|``."""
    a, e = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    if a.is_complex() or e.is_complex():
        a, e = a.to(torch.complex128), e.to(torch.complex128)
    diff, mag = (a - e).abs(), e.abs()
    finite = torch.isfinite(diff)
    if not bool(finite.any()):
        return rtol, atol
    diff, mag = diff[finite], mag[finite]
    need_atol = float((diff - rtol * mag).clamp(min=0).max())
    over = (diff - atol).clamp(min=0)
    with_mag = mag > 0
    if bool((over[~with_mag] > 0).any()):
        need_rtol = math.inf  # an element of 0 expected differs by more than atol
    else:
        need_rtol = float((over[with_mag] / mag[with_mag]).max()) if bool(with_mag.any()) else 0.0
    return need_rtol, need_atol


def assert_close(
    actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None, **kwargs: Any
) -> None:
    """``torch.testing.assert_close``, on ``tpu`` tensors too, with :func:`suggested_tolerances`
    as defaults; a mismatch names the tolerances that would have passed.

    Args:
        actual, expected: tensors (on any device: a ``tpu`` tensor is compared on CPU).
        rtol, atol: both or neither (as in torch); neither: suggested for ``expected``'s dtype.
        **kwargs: passed to ``torch.testing.assert_close`` (``equal_nan``, ``check_dtype``, ...).

    Raises:
        AssertionError: the values differ beyond the tolerances (torch's message,
            then ``suggested tolerances: rtol=..., atol=...``).

    Example::

        torch.tpu.utils.assert_close(model(x.to("tpu")), model(x))
    """
    if isinstance(actual, torch.Tensor) and actual.device.type == "tpu":
        actual = actual.cpu()
    if isinstance(expected, torch.Tensor) and expected.device.type == "tpu":
        expected = expected.cpu()
    if (rtol is None) != (atol is None):
        raise ValueError(
            "Both 'rtol' and 'atol' must be either specified or omitted, "
            f"but got no {'rtol' if rtol is None else 'atol'}."
        )
    if rtol is None and isinstance(expected, torch.Tensor):
        rtol, atol = suggested_tolerances(expected.dtype)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kwargs)
    except AssertionError as exc:
        if not (
            isinstance(actual, torch.Tensor)
            and isinstance(expected, torch.Tensor)
            and actual.shape == expected.shape
            and rtol is not None
        ):
            raise
        need_rtol, need_atol = (_round_up(t) for t in _needed(actual, expected, rtol, atol))
        raise AssertionError(
            f"{exc}\nsuggested tolerances: rtol={need_rtol:.3g} (with atol={atol:.3g}) "
            f"or atol={need_atol:.3g} (with rtol={rtol:.3g})"
        ) from None


def _round_up(x: float) -> float:
    """``x`` rounded up to 3 significant digits (so the printed value still passes)."""
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.ceil(x / scale * (1 + 1e-12)) * scale
