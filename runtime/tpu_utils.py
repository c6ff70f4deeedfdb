"""TorchTPU's debugging utilities on this runtime: cache statistics, device memory, an op
tracer, and ``assert_close`` with tolerances fit for TPU numerics.

``torch.tpu._get_cache_stats()`` reads the runtime's executable caches (TorchTPU's fields and
each cache's entries), ``torch.tpu._hbm_usage_summary()`` the live device buffers;
``torch.tpu.utils.OpTracer`` counts the ops a block dispatches, with TorchTPU's
``ops_log`` / ``num_atens()`` / ``_pformat()``; ``torch.tpu.utils.assert_close`` is
TorchTPU's (``CheckValueMode`` LOOSE, STRICT, SKIP; a preamble), with defaults that follow
the float32 matmul precision in effect, and a failure that lists the largest mismatches and
says which tolerances would pass.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import dataclasses
import enum
import math
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tpu_debug.core.format import format_bytes
from tpu_debug.runtime import compiled, eager, lazy
from tpu_debug.runtime.config import config

__all__ = [
    "CacheEntry",
    "CacheEntryStats",
    "CacheStats",
    "CheckValueMode",
    "CompilationCacheStats",
    "HbmUsage",
    "OpTracer",
    "assert_close",
    "clear_caches",
    "get_cache_stats",
    "hbm_usage",
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


@dataclasses.dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached executable as TorchTPU's ``per_entry_stats`` show it.

    Attributes:
        read_count: calls that looked it up (its compile included).
        compilation_duration: its compile time, in microseconds.
        last_read: TorchTPU's time of the last lookup; this runtime does not record it (None).
        name: what it runs (an op, ``lazy/<trigger>``, a compiled graph's program).
        cache: the cache holding it (see :class:`CacheStats`).
    """

    read_count: int
    compilation_duration: int
    last_read: None
    name: str
    cache: str


@dataclasses.dataclass(frozen=True, slots=True)
class CompilationCacheStats:
    """``torch.tpu._get_cache_stats()``: TorchTPU's totals over every executable cache of the
    runtime (eager ops, fused programs, compiled graphs' programs), and the caches themselves.

    Attributes:
        caches: one :class:`CacheStats` per cache, with its entries.
    """

    caches: tuple[CacheStats, ...]

    @property
    def num_cache_reqs(self) -> int:
        """Lookups of every cache (an entry's first lookup is its compile)."""
        return sum(c.requests for c in self.caches)

    @property
    def num_cache_hits(self) -> int:
        """Lookups that found the executable compiled."""
        return sum(c.hits for c in self.caches)

    @property
    def num_compilations(self) -> int:
        """Lookups that compiled (one per entry held)."""
        return self.num_cache_reqs - self.num_cache_hits

    @property
    def per_entry_stats(self) -> list[CacheEntry]:
        """Every entry held, as TorchTPU lists them."""
        return [CacheEntry(e.requests, round(e.compile_seconds * 1e6), None, e.name, c.name)
                for c in self.caches for e in c.entries]


def get_cache_stats() -> CompilationCacheStats:
    """Requests, hits and compile time of every cached executable (``torch.tpu._get_cache_stats()``).

    Returns:
        TorchTPU's fields (``num_cache_reqs``, ``num_cache_hits``, ``per_entry_stats``
        with ``read_count`` and ``compilation_duration``), and ``caches``: one
        :class:`CacheStats` per executable cache: eager ops, lazy mode's fused programs,
        and ``torch.compile`` graphs' programs.

    Example::

        stats = torch.tpu._get_cache_stats()
        stats.num_cache_reqs, stats.num_cache_hits
        # (15, 11)
        {c.name: (c.requests, c.hits) for c in stats.caches}
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
    return CompilationCacheStats((
        CacheStats("eager executables", eager_entries),
        CacheStats("fused programs", fused),
        CacheStats("compiled programs", programs),
    ))


def clear_caches() -> None:
    """Drop every compiled executable the runtime holds (``torch.tpu._clear_cache()``): eager
    ops', fused programs' and compiled graphs' programs; each compiles again on next use.
    A graph dynamo already compiled keeps the program it holds until ``torch.compiler.reset()``."""
    eager.clear_cache()
    lazy._fused.clear()
    compiled._programs.clear()


def _program_name(entry: Any) -> str:
    return entry.info.name if entry.info is not None else "program"


@dataclasses.dataclass(frozen=True, slots=True)
class HbmUsage:
    """``torch.tpu._hbm_usage_summary()``: the device memory the runtime's buffers hold now.

    Attributes:
        device: the XLA device the runtime runs on (it says which platform it is).
        live_bytes: bytes of the device buffers alive now (every ``tpu`` tensor's data, the
            arrays the runtime keeps, and any JAX array of the process on that device).
        live_buffers: how many buffers those are.
        bytes_limit: the device's capacity where XLA reports one (a TPU, a GPU); None on CPU.
    """

    device: str
    live_bytes: int
    live_buffers: int
    bytes_limit: int | None

    def __str__(self) -> str:
        limit = "" if self.bytes_limit is None else f" of {format_bytes(self.bytes_limit)}"
        return f"{self.device}: {format_bytes(self.live_bytes)}{limit} in {self.live_buffers} live buffers"


def hbm_usage() -> HbmUsage:
    """What the device holds now (see :class:`HbmUsage`), from XLA's live buffers."""
    import jax

    device = jax.local_devices()[0]
    arrays = [a for a in jax.live_arrays() if device in a.devices()]
    stats = device.memory_stats() or {}
    return HbmUsage(f"tpu:0 (XLA {device.platform.upper()} {device.device_kind})",
                    sum(a.nbytes for a in arrays), len(arrays), stats.get("bytes_limit"))


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

    def _pformat(self) -> str:
        """The counts as text (TorchTPU's name for :func:`pformat_op_tracer`)."""
        return pformat_op_tracer(self)


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
# STRICT's relative check allows this much on top of rtol * |expected|, so an expected 0
# met by -0.0 (or by a denormal) passes, as TorchTPU's does
_STRICT_FLOOR = 1e-7
# how many of the largest mismatches a failure lists, value by value
_SHOWN = 5


class CheckValueMode(enum.Enum):
    """How ``assert_close`` compares values (TorchTPU's ``utils.CheckValueMode``).

    ``LOOSE`` (the default): close when ``|actual - expected| <= atol + rtol * |expected|``,
    PyTorch's rule. ``STRICT``: close when the error is within both bounds,
    ``|actual - expected| <= atol`` and ``<= rtol * |expected|`` (plus 1e-7, so an expected
    zero met by a tiny value passes only that way). ``SKIP``: shapes and dtypes only.
    """

    SKIP = "skip"
    LOOSE = "loose"
    STRICT = "strict"


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


def _on_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        return value.cpu()
    return value


def assert_close(
    actual: Any,
    expected: Any,
    rtol: float | None = None,
    atol: float | None = None,
    preamble: str | None = None,
    check_value: CheckValueMode | None = None,
    check_dtype: bool = True,
    **kwargs: Any,
) -> None:
    """Assert that ``actual`` is close to ``expected`` (TorchTPU's ``utils.assert_close``), on
    ``tpu`` tensors too; a failure lists the largest mismatches and the tolerances that pass.

    Args:
        actual, expected: tensors (a ``tpu`` tensor is compared on CPU), or sequences of
            them compared pairwise.
        rtol, atol: the tolerances (positional, as TorchTPU takes them); one left out is
            :func:`suggested_tolerances` of ``expected``'s dtype (float32 follows the
            matmul precision in effect).
        preamble: a line naming what is compared, put first in a failure's message.
        check_value: :class:`CheckValueMode`; None is LOOSE.
        check_dtype: False compares the two in their promoted dtype.
        **kwargs: passed to ``torch.testing.assert_close`` (``equal_nan``, ...) in LOOSE mode.

    Raises:
        AssertionError: shapes, dtypes or values differ: the preamble, what differs, the
            largest mismatches value by value, and ``suggested tolerances: ...``.

    Example::

        utils.assert_close(out_tpu, out_cpu, 1.6e-2, 1e-5, check_value=utils.CheckValueMode.STRICT)
    """
    actual, expected = _on_host(actual), _on_host(expected)
    sequences = [isinstance(v, collections.abc.Sequence) and not isinstance(v, str) for v in (actual, expected)]
    if all(sequences):
        if len(actual) != len(expected):
            raise AssertionError(f"{_lead(preamble)}sequences of {len(actual)} and {len(expected)} values")
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol, atol, preamble, check_value, check_dtype, **kwargs)
        return
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kwargs)
        return
    if not check_dtype:
        common = torch.promote_types(actual.dtype, expected.dtype)
        actual, expected = actual.to(common), expected.to(common)
    default_rtol, default_atol = suggested_tolerances(expected.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    mode = CheckValueMode.LOOSE if check_value is None else CheckValueMode(check_value)
    if mode is CheckValueMode.SKIP or mode is CheckValueMode.STRICT:
        _check_meta(actual, expected, preamble)
        if mode is CheckValueMode.STRICT:
            _check_strict(actual, expected, rtol, atol, preamble)
        return
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kwargs)
    except AssertionError as exc:
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise AssertionError(f"{_lead(preamble)}{exc}") from None
        need_rtol, need_atol = (_round_up(t) for t in _needed(actual, expected, rtol, atol))
        raise AssertionError(
            f"{_lead(preamble)}{exc}\n{_largest(actual, expected)}\nsuggested tolerances: "
            f"rtol={need_rtol:.3g} (with atol={atol:.3g}) or atol={need_atol:.3g} (with rtol={rtol:.3g})"
        ) from None


def _lead(preamble: str | None) -> str:
    return f"{preamble.rstrip()}\n" if preamble else ""


def _check_meta(actual: torch.Tensor, expected: torch.Tensor, preamble: str | None) -> None:
    for what, a, e in (("shape", tuple(actual.shape), tuple(expected.shape)), ("dtype", actual.dtype, expected.dtype)):
        if a != e:
            raise AssertionError(f"{_lead(preamble)}Tensor {what} mismatch: expected {e}, actual {a}")


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(|actual - expected|, |expected|) in float64 (complex128), NaN against NaN counted equal."""
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    a, e = actual.detach().to(wide), expected.detach().to(wide)
    diff = (a - e).abs()
    diff = torch.where(torch.isnan(a) & torch.isnan(e), torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    return diff, e.abs()


def _check_strict(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
                  preamble: str | None) -> None:
    diff, mag = _errors(actual, expected)
    bad = (diff > atol) | (diff > rtol * mag + _STRICT_FLOOR)
    if not bool(bad.any()):
        return
    n, total = int(bad.sum()), diff.numel()
    need_atol = float(diff.max())
    need_rtol = float(((diff - _STRICT_FLOOR).clamp(min=0) / mag.clamp(min=1e-300)).max())
    raise AssertionError(
        f"{_lead(preamble)}Tensor-likes are not close (STRICT: within atol={atol:.3g} and "
        f"rtol={rtol:.3g} of |expected| both)!\n\nMismatched elements: {n} / {total} "
        f"({100.0 * n / total:.1f}%)\n{_largest(actual, expected)}\n"
        f"suggested tolerances: STRICT needs both rtol>={_round_up(need_rtol):.3g} and "
        f"atol>={_round_up(need_atol):.3g}"
    )


def _largest(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """The largest absolute differences, one line each with the index and both values."""
    diff, mag = _errors(actual, expected)
    if diff.numel() == 0:
        return ""
    flat = diff.reshape(-1)
    order = torch.argsort(flat, descending=True)[:_SHOWN]
    lines = ["Largest mismatches:"]
    for i in order.tolist():
        if flat[i] == 0:
            break
        index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), diff.shape)) if diff.dim() else ()
        rel = float(flat[i] / mag.reshape(-1)[i]) if mag.reshape(-1)[i] != 0 else math.inf
        lines.append(f"    at index {index}, expected={expected.reshape(-1)[i].item()}, "
                     f"actual={actual.reshape(-1)[i].item()}, relative diff={rel:.3g}, diff={float(flat[i]):.3g}")
    return "\n".join(lines)


def _needed(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[float, float]:
    """The smallest rtol (given ``atol``) and atol (given ``rtol``) with which every
    finite element passes ``|a - e| <= atol + rtol * |e|``."""
    diff, mag = _errors(actual, expected)
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


def _round_up(x: float) -> float:
    """``x`` rounded up to 3 significant digits (so the printed value still passes)."""
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.ceil(x / scale * (1 + 1e-12)) * scale
