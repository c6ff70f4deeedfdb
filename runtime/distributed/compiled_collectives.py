"""Functional collectives (``_c10d_functional`` ops) inside compiled graphs.

A graph dynamo captures from a DTensor module (``parallelize_module``), a
``SequenceParallel`` layer or a function calling
``torch.distributed._functional_collectives`` holds nodes such as
``_c10d_functional.all_reduce(x, "sum", group_name)`` and ``wait_tensor``. Each
collective becomes an ordered host callback in the graph's one XLA program
(``jax.experimental.io_callback(..., ordered=True)``): the program stops there,
the callback runs the same functional op eagerly on host copies of its inputs,
through the group's c10d process group (for `tpu` groups, ``TpuProcessGroup``:
gloo on the host, recorded as a ``collective_call`` like an eager call), and the
program continues with the result. ``wait_tensor`` is the identity: the
callback returns once the collective is done. So a rank's step is one program
per graph, its collectives in program order, and the numbers are gloo's, as in
eager mode.

A program holding collectives is waited for before its call returns
(:func:`run`): the rank's next eager collective cannot start before the
program's have ended, so every rank issues its collectives in one order.

The collective's user line: the callback may run on one of XLA's threads, whose
stack holds none of the user's frames. It calls the op under stand-in frames of
the stack the graph node was traced at (FX's ``stack_trace``) on top of the
stack that called the program, so a tracer walking the stack for the user's line
finds the line inside the model that issued the collective, as it finds an eager
collective's line.

A dry run (a TPU-target compile) gets the collectives' output shapes only: the
target compile describes one rank's program, whose memory the collectives'
outputs are part of, not their values.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental import io_callback

from tpu_debug.core.errors import LoweringError
from tpu_debug.runtime import dry_mode as _dryrun
from tpu_debug.runtime.dtypes import to_jax_dtype

__all__ = ["handles", "lower", "run"]

_ops = torch.ops._c10d_functional
_autograd_ops = torch.ops._c10d_functional_autograd


@dataclasses.dataclass(frozen=True, slots=True)
class _Collective:
    """How one functional collective is lowered: its outputs' shapes from its arguments
    (``(shape, dtype)`` per output, a list for the coalesced ops)."""

    op: torch._ops.OpOverload
    shapes: Callable[..., Any]
    many: bool = False  # takes a list of tensors and returns a list


_COLLECTIVES: dict[torch._ops.OpOverload, _Collective] = {}


def _collective(*ops: torch._ops.OpOverload, many: bool = False) -> Callable:
    def register(shapes: Callable) -> Callable:
        for op in ops:
            if op in _COLLECTIVES:
                raise LoweringError(f"{op} registered twice as a compiled collective ({shapes.__name__})")
            _COLLECTIVES[op] = _Collective(op, shapes, many)
        return shapes

    return register


def _resized(x, dim0: int) -> tuple[tuple[int, ...], Any]:
    return (dim0, *x.shape[1:]), x.dtype


@_collective(_ops.all_reduce.default)
def _all_reduce(x, reduce_op, group_name):
    return x.shape, x.dtype


@_collective(_ops.broadcast.default)
def _broadcast(x, src, group_name):
    return x.shape, x.dtype


@_collective(_ops.all_gather_into_tensor.default, _autograd_ops.all_gather_into_tensor.default)
def _all_gather(x, group_size, group_name):
    return _resized(x, x.shape[0] * group_size)


@_collective(_ops.reduce_scatter_tensor.default, _autograd_ops.reduce_scatter_tensor.default)
def _reduce_scatter(x, reduce_op, group_size, group_name):
    return _resized(x, x.shape[0] // group_size)


@_collective(_ops.all_to_all_single.default, _autograd_ops.all_to_all_single.default)
def _all_to_all(x, output_split_sizes, input_split_sizes, group_name):
    return _resized(x, sum(output_split_sizes) if output_split_sizes else x.shape[0])


@_collective(_ops.all_reduce_coalesced.default, many=True)
def _all_reduce_coalesced(xs, reduce_op, group_name):
    return [(x.shape, x.dtype) for x in xs]


@_collective(_ops.all_gather_into_tensor_coalesced.default, many=True)
def _all_gather_coalesced(xs, group_size, group_name):
    return [_resized(x, x.shape[0] * group_size) for x in xs]


@_collective(_ops.reduce_scatter_tensor_coalesced.default, many=True)
def _reduce_scatter_coalesced(xs, reduce_op, group_size, group_name):
    return [_resized(x, x.shape[0] // group_size) for x in xs]


_WAIT = _ops.wait_tensor.default


def handles(op: Any) -> bool:
    """Whether ``op`` (an FX node's target) is a functional collective this module lowers."""
    return op is _WAIT or op in _COLLECTIVES


def lower(node: torch.fx.Node, args: Sequence, kwargs: dict) -> Any:
    """The value of FX node ``node`` (a functional collective) inside the program being traced.

    Args:
        node: the graph node; its ``stack_trace`` is where the collective was called.
        args: its arguments, JAX arrays for its tensors.
        kwargs: its keyword arguments.

    Returns:
        The collective's output (a list of them for the coalesced ops), computed by an
        ordered host callback that runs the same op on the host.
    """
    if node.target is _WAIT:  # the callback returned only once the collective was done
        return args[0]
    spec = _COLLECTIVES[node.target]
    shapes = spec.shapes(*args, **kwargs)
    outs = shapes if spec.many else [shapes]
    avals = [jax.ShapeDtypeStruct(tuple(int(d) for d in shape), dtype) for shape, dtype in outs]
    tensors = list(args[0]) if spec.many else [args[0]]
    if _dryrun.active is not None:  # a target compile: one rank's program, shapes only
        standins = [_standin(x, aval) for x, aval in zip(tensors, avals)]
        return standins if spec.many else standins[0]
    frames = _parse_stack(node.meta.get("stack_trace"))
    dtypes = _input_dtypes(node, len(tensors))
    wide_in = [(np.dtype(x.dtype), tuple(x.shape)) if _wide(x.dtype) else None for x in tensors]
    wide_out = [(np.dtype(a.dtype), a.shape) if _wide(a.dtype) else None for a in avals]
    rest = tuple(args[1:])

    def host(*arrays: np.ndarray) -> list[np.ndarray]:
        try:
            arrays = [_narrowed(a, w) for a, w in zip(arrays, wide_in)]
            inputs = [_to_torch(a, dt) for a, dt in zip(arrays, dtypes)]
            first = inputs if spec.many else inputs[0]
            results = _at(frames, lambda: _call_eagerly(spec, first, rest, kwargs))
            return [_widened(_to_numpy(t), w) for t, w in zip(results, wide_out)]
        except BaseException as exc:  # raised again by run(), as itself
            _failures.append(exc)
            raise

    # 64-bit values cross as pairs of uint32: JAX checks a callback's results against the
    # dtypes the thread running it allows, and the runtime enables 64-bit types only while
    # it traces and compiles (an XLA thread runs the callback)
    passed = [jax.lax.bitcast_convert_type(x, jnp.uint32) if w else x for x, w in zip(tensors, wide_in)]
    declared = [jax.ShapeDtypeStruct((*a.shape, 2), jnp.uint32) if w else a for a, w in zip(avals, wide_out)]
    values = io_callback(host, declared, *passed, ordered=True)
    values = [jax.lax.bitcast_convert_type(v, a.dtype) if w else v
              for v, a, w in zip(values, avals, wide_out)]
    return values if spec.many else values[0]


def _wide(dtype: Any) -> bool:
    return np.dtype(dtype).itemsize == 8


def _narrowed(a: np.ndarray, wide: tuple | None) -> np.ndarray:
    """A 64-bit array that crossed as uint32 pairs, as itself."""
    if wide is None:
        return a
    dtype, shape = wide
    return np.ascontiguousarray(a).view(dtype).reshape(shape)


def _widened(a: np.ndarray, wide: tuple | None) -> np.ndarray:
    """A 64-bit array as the uint32 pairs it crosses as."""
    if wide is None:
        return a
    _, shape = wide
    return np.ascontiguousarray(a).view(np.uint32).reshape(*shape, 2)


def _standin(x, aval: jax.ShapeDtypeStruct):
    if tuple(x.shape) == aval.shape:
        return x
    return jnp.zeros(aval.shape, aval.dtype)


def _call_eagerly(spec: _Collective, first: Any, rest: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The functional op on host tensors, waited for: the group's own collective (for a
    program of the tpu device, whose arrays these tensors copy)."""
    from tpu_debug.runtime.distributed.c10d import for_program  # deferred: optional: c10d needs torch.distributed

    with for_program("tpu"):
        out = spec.op(first, *rest, **kwargs)
    outs = list(out) if spec.many else [out]
    return [_ops.wait_tensor.default(t) for t in outs]


def _input_dtypes(node: torch.fx.Node, n: int) -> list[torch.dtype | None]:
    first = node.args[0]
    nodes = list(first) if isinstance(first, (list, tuple)) else [first]
    return [_val_dtype(nd) for nd in nodes][:n] + [None] * max(0, n - len(nodes))


def _val_dtype(nd: Any) -> torch.dtype | None:
    val = nd.meta.get("val") if isinstance(nd, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _to_torch(a: np.ndarray, dtype: torch.dtype | None) -> torch.Tensor:
    """A host tensor holding a copy of ``a`` (the callback's arrays are XLA's buffers)."""
    a = np.asarray(a)
    if a.dtype == to_jax_dtype(torch.bfloat16):  # numpy's bfloat16 is ml_dtypes', unknown to torch
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    t = torch.from_numpy(a.copy())
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(to_jax_dtype(torch.bfloat16))
    return t.numpy()


# -- the user's line ------------------------------------------------------------------------

_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+?)\s*$')
_Frame = tuple[str, int, str]  # (file, line, function)


def _parse_stack(stack_trace: str | None) -> tuple[_Frame, ...]:
    """The frames of an FX node's ``stack_trace``, outermost first."""
    frames = []
    for line in (stack_trace or "").splitlines():
        m = _FRAME_LINE.match(line)
        if m:
            frames.append((m["file"], int(m["line"]), m["name"]))
    return tuple(frames)


# one frame of a stand-in stack: calls the next function of the chain. Compiled from text
# so its code object can be given the file, line and name of the frame it stands for
_HOP = next(c for c in compile("def hop(chain, i, call): return chain[i](chain, i + 1, call)\n",
                               "<hop>", "exec").co_consts if isinstance(c, types.CodeType))
_hops: dict[_Frame, types.FunctionType] = {}
_hops_lock = threading.Lock()


def _hop(frame: _Frame) -> types.FunctionType:
    fn = _hops.get(frame)
    if fn is None:
        file, line, name = frame
        ident = name if name.isidentifier() else "_"
        code = _HOP.replace(co_filename=file, co_name=ident, co_qualname=name, co_firstlineno=max(line, 1))
        with _hops_lock:
            fn = _hops.setdefault(frame, types.FunctionType(code, {}, ident))
    return fn


def _end(chain, i, call):
    return call()


# the stack that called the running program (see run); read by its callbacks, which may
# run on another thread: a module global, one program with collectives runs at a time
_caller: tuple[_Frame, ...] = ()


def _at(frames: tuple[_Frame, ...], call: Callable[[], Any]) -> Any:
    """``call()`` under stand-in frames: the program's caller's stack, then ``frames``."""
    chain = [_hop(f) for f in (*_caller, *frames)]
    chain.append(_end)
    return chain[0](chain, 1, call)


def _stack(frame: types.FrameType | None) -> tuple[_Frame, ...]:
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append((code.co_filename, frame.f_lineno, code.co_qualname))
        frame = frame.f_back
    return tuple(reversed(frames))


# -- running a program that holds collectives ------------------------------------------------

_run_lock = threading.Lock()
# the errors the running program's callbacks raised
_failures: list[BaseException] = []


class _RaisedAgain(logging.Filter):
    """Drops JAX's log of a failed callback whose error :func:`run` raises again as itself:
    the user sees that error once, not after its traceback through XLA's callback first."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not any(exc is f for f in _failures)


_filter = _RaisedAgain()


def _quiet_callback_failures() -> None:
    logger = logging.getLogger("jax._src.callback")
    if _filter not in logger.filters:
        logger.addFilter(_filter)


def run(executable: Callable, *arrays: Any) -> Any:
    """``executable(*arrays)`` for a program holding collectives, waited for.

    Its callbacks see the caller's stack (for the user's line), and the rank's next eager
    collective starts after the program's have ended. An error a collective raised is
    raised again as itself (XLA reports it as a failed callback).
    """
    global _caller
    _quiet_callback_failures()
    with _run_lock:
        _caller = _stack(sys._getframe(2))
        _failures.clear()
        try:
            outs = executable(*arrays)
            jax.block_until_ready(outs)
        except Exception:
            if _failures:
                raise _failures[0] from None
            raise
        finally:
            _caller = ()
            _failures.clear()
    return outs
