"""Dry runs: the `tpu` device with tensors that hold no data, every program compiled for a TPU target.

While a :class:`DryMode` is active (``with dry_mode(parse_target("v6e")) as mode:``), a `tpu`
tensor's payload is an :class:`Abstract`: a shape and a dtype. Nothing executes
and nothing is copied:

- an eager op is lowered as usual (``jax.jit(op).lower(...)`` on the abstract
  inputs); the lowering's output avals are the op's outputs, and the lowering
  goes to the target's compiler (on the target compiler's worker thread);
- a compiled graph's program is lowered and goes to the target's compiler
  instead of this machine's; calling it gives its outputs' avals;
- factories, ``.to("tpu")`` and ``copy_`` from the host make abstract payloads
  (the host tensor's data is never copied; a model built on the host still holds
  its host copy: build it under ``torch.device("tpu")`` or ``"meta"`` to avoid
  that);
- reading a value (``.item()``, ``print(t)``, ``if t:``, ``.cpu()``, an op whose
  output shape depends on values) raises :class:`DryRunValueError`, which names
  the line when the caller said how to find it (``describe``).

The target compiler's answers (per-device memory, HBM out-of-memory, refusals)
are collected with :meth:`DryMode.collect`; a tracer that records each program's
target compile takes the one already running for a lowering (:func:`target_future`)
instead of compiling it again. Programs are single-device here: a
data-parallel replica on a multi-chip target holds the same on each chip, and a
program lowered with shardings would carry its partitions to the target compile
(``compile_lowered_for_target``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np
from tpu_debug.core.errors import TpuDebugError
from tpu_debug.runtime.target import LibtpuMissingError, default_compiler
from tpu_debug.runtime.target.hardware import Target

__all__ = ["TARGET_LEVEL", "Abstract", "DryMode", "DryRunError", "DryRunValueError", "ProgramCompile",
           "active", "dry_mode", "target_future", "value_needed"]


#: XLA's effort level of a dry run's target compiles (see ``DryMode``)
TARGET_LEVEL = "O0"


class Abstract(jax.ShapeDtypeStruct):
    """A payload with a shape and a dtype and no data: a dry run's tensors hold these.

    ``jax.jit(...).lower`` takes it as an input spec; the memory registry keeps a weak
    reference to it, as to any payload (so each output of an op is an object of its own).
    """

    __slots__ = ("__weakref__",)

    def astype(self, dtype: Any) -> Abstract:
        return Abstract(self.shape, dtype)

    def reshape(self, *shape: Any) -> Abstract:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1]))
            shape = tuple(self.size // max(known, 1) if d == -1 else d for d in shape)
        return Abstract(tuple(shape), self.dtype)

    @property
    def nbytes(self) -> int:
        return int(self.size) * np.dtype(self.dtype).itemsize


_dry_runs = itertools.count()


class DryRunError(TpuDebugError, RuntimeError):
    """A dry run was asked for something it cannot do."""


class DryRunValueError(TpuDebugError, RuntimeError):
    """A dry run reached code that needs a tensor's value, which a dry run does not have.

    Attributes:
        what: what needed the value (``".item()"``, ``"print/repr"``,
            ``"aten::nonzero (its output shape depends on values)"``).
        tensor: the tensor's type, ``float32[8, 128]`` (empty when there is none).
        where: the user's line (``train.py:42``), when the dry run was told how
            to find it.
    """

    def __init__(self, what: str, tensor: str = "", where: str | None = None) -> None:
        self.what = what
        self.tensor = tensor
        self.where = where
        at = f" at {where}" if where else ""
        of = f" of a {tensor} tensor" if tensor else ""
        super().__init__(
            f"the dry run needs a value{at} ({what}): tensors in a dry run hold no data, so "
            f"nothing{of} can be read; what ran before this line is what the dry run measured. "
            "Move the read after the step being measured, or skip it in dry runs "
            "(tpu_debug.runtime.dry_mode.active is not None)"
        )


@dataclasses.dataclass(slots=True)
class ProgramCompile:
    """One program of the dry run sent to the target's compiler.

    Attributes:
        mode: ``"eager"`` (one op) or ``"compiled"`` (a graph).
        name: the op or graph (``mul.Tensor``, ``g1/forward``).
        future: the compile running on the target compiler's worker.
        result: the ``TargetCompile`` once collected.
        error: the text of an error other than the compiler's own refusal.
    """

    mode: str
    name: str
    future: Future | None
    result: Any = None
    error: str | None = None


def _tensor_text(t: Any) -> str:
    if t is None:
        return ""
    dtype = str(getattr(t, "dtype", "")).removeprefix("torch.")
    return f"{dtype}{list(getattr(t, 'shape', ()))}"


class DryMode:
    """The state of one dry run (see the module docstring).

    Args:
        target: the TPU target to compile for (parsed by the caller); None compiles
            nothing (shapes and memory only).
        describe: ``describe(op) -> (what, where)``: what a value read is and the user's
            line, called on the thread that reads (its stack is the read's).
        optimization_level: XLA's effort level for the target compiles. ``"O0"``: the
            question is memory, and O0 assigns nearly the buffers of the default level
            in a fraction of the time (see ``runtime/target``; a float32
            2048x2048 @ 2048x32000 product: 0.08 CPU seconds at O0, 0.9 at the default).
    """

    def __init__(self, target: Target | None = None, *, describe: Callable[[str], tuple[str, str | None]] | None = None,
                 optimization_level: str | None = TARGET_LEVEL) -> None:
        self.target = target
        self.describe = describe
        self.optimization_level = optimization_level
        # marks a compiled graph's dry programs in its cache; numbered, never id(self): a later
        # dry run may get an ended one's id, and with it that run's programs for another target
        self.key = ("dry run", next(_dry_runs))
        self.programs: list[ProgramCompile] = []
        self.notes: list[str] = []
        self.stop: DryRunValueError | None = None
        # an eager op's key -> its outputs' (avals, structure, torch dtypes), lowered once
        # (runtime/eager.py runs a dry run's ops)
        self.op_outputs: dict[Any, tuple[tuple, Any, tuple]] = {}
        self._lock = threading.Lock()
        # lowering -> its target compile, until a tracer takes it (weak: nothing else keeps a
        # lowering alive once its program is compiled and its outputs' avals read)
        self._futures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._compiling = self.target is not None
        self.ops = 0  # eager ops dispatched

    # -- compiled graphs -------------------------------------------------------------

    def program(self, lowered: Any, mode: str, name: str) -> Callable[..., tuple]:
        """What runs in place of a compiled graph's executable: its outputs' avals."""
        leaves = tuple((tuple(a.shape), a.dtype) for a in jax.tree_util.tree_leaves(lowered.out_info))
        self.submit(lowered, mode, name)

        def run(*_arrays: Any) -> tuple:
            return tuple(Abstract(shape, dtype) for shape, dtype in leaves)

        return run

    # -- the target compiler ---------------------------------------------------------

    def submit(self, lowered: Any, mode: str, name: str) -> None:
        """Send ``lowered`` to the target's compiler (nothing when compiling nothing)."""
        if not self._compiling:
            return

        try:
            future = default_compiler().submit_lowered(lowered, self.target, optimization_level=self.optimization_level)
        except LibtpuMissingError as exc:
            self._compiling = False
            self.notes.append(f"programs were not compiled for {self.target.name}: {exc}")
            return
        with self._lock:
            self.programs.append(ProgramCompile(mode, name, future))
            self._futures[lowered] = future

    def future_for(self, lowered: Any) -> Future | None:
        """The target compile of ``lowered`` this dry run started (taken: asked once), or None."""
        with self._lock:
            return self._futures.pop(lowered, None)

    def collect(self, timeout: float | None = None) -> list[ProgramCompile]:
        """Wait for every program sent to the target's compiler (each at most ``timeout`` seconds
        more); each gets its ``result`` or ``error``."""
        with self._lock:
            programs = list(self.programs)
        for p in programs:
            if p.future is None or p.result is not None or p.error is not None:
                continue
            try:
                p.result = p.future.result(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - one program's failure is that program's result
                p.error = f"{type(exc).__name__}: {exc}"
        return programs

    # -- values ------------------------------------------------------------------------

    def needs(self, what: str, tensor: str = "", op: str | None = None) -> DryRunValueError:
        """The error for reading a value this dry run does not have (the first is kept as ``stop``)."""
        where = None
        if self.describe is not None:
            try:
                what_read, where = self.describe(op or what)
                if op is not None:
                    what = what_read
            except Exception:  # noqa: BLE001 - naming the line is a courtesy; the stop happens anyway
                where = None
        error = DryRunValueError(what, tensor, where)
        if self.stop is None:
            self.stop = error
        return error


active: DryMode | None = None
_switch = threading.Lock()


def value_needed(op: str, t: Any = None) -> DryRunValueError:
    """The error for reading a value a dry run does not have (``op``: the runtime's name of
    the read, as in ``TransferInfo.op``: ``"item"``, ``"copy"``, ``"fallback:<op>"``)."""
    mode = active
    if mode is None:
        return DryRunValueError(op, _tensor_text(t))  # a dry run's tensor read after it ended
    return mode.needs(op, _tensor_text(t), op=op)


def target_future(lowered: Any) -> Future | None:
    """The active dry run's target compile of ``lowered`` (a ``Future[TargetCompile]``), or None
    when no dry run is active or it compiled no such lowering (see :meth:`DryMode.future_for`)."""
    mode = active
    return None if mode is None else mode.future_for(lowered)


@contextlib.contextmanager
def dry_mode(target: Target | None = None, **options: Any) -> Iterator[DryMode]:
    """Run the block as a dry run (see :class:`DryMode` for ``options``).

    Raises:
        DryRunError: a dry run is active already.

    Example::

        with dry_mode(parse_target("v6e")) as mode:
            y = model(torch.empty(8, 2048, dtype=torch.long, device="tpu"))
        [p.result.memory.temp_bytes for p in mode.collect()]
    """
    global active
    mode = DryMode(target, **options)
    with _switch:
        if active is not None:
            raise DryRunError("a dry run is active already; dry runs do not nest")
        active = mode
    try:
        yield mode
    finally:
        with _switch:
            active = None
