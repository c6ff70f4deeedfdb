"""Target compiles off the caller's thread: one worker, futures.

A TPU compile takes 0.1 s to minutes (the first in a process also loads the
compiler, about a second more); the program that asked for it goes on. XLA's
compile releases the GIL; lowering a function (``submit``) runs Python on the
worker and shares the GIL with the caller, compiling an existing lowering
(``submit_lowered``) does not trace at all. What slows the program is CPU the
compiler takes: the worker runs at a lower priority. One worker keeps compiles in
submission order and bounds the CPU they take. When the program exits, the
compile running finishes and the ones still queued are dropped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from tpu_debug.runtime.target import _libtpu
from tpu_debug.runtime.target.compile import TargetCompile, compile_for_target, compile_lowered_for_target
from tpu_debug.runtime.target.hardware import Target, parse_target

__all__ = [
    "TargetCompiler",
    "default_compiler",
    "compile_for_target_async",
    "compile_lowered_for_target_async",
]


class TargetCompiler:
    """A one-thread executor for target compiles.

    ``submit``/``submit_lowered`` check the target and that libtpu is installed on
    the calling thread (so a wrong spec fails where it was written), then return a
    ``Future[TargetCompile]``.

    Example::

        compiler = TargetCompiler()
        future = compiler.submit(step, (params, batch), "v6e")
        ...                                   # the program goes on
        future.result().memory.temp_bytes
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu_debug-target",
                                        initializer=_lower_priority)
        # at interpreter exit, compiles nobody started are dropped (the one running
        # finishes: XLA cannot be interrupted). Registered with threading's exit hooks,
        # which run newest first, so before concurrent.futures joins its workers.
        threading._register_atexit(self._drop_pending)

    def _drop_pending(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, fn, abstract_args: tuple, tgt: Target, **options) -> Future[TargetCompile]:
        """``compile_for_target(fn, abstract_args, tgt, **options)`` on the worker.

        The calling thread's 64-bit setting (``jax.enable_x64``, thread-local) is
        carried over unless ``x64=`` is given.
        """
        import jax

        _libtpu.require_libtpu()
        options.setdefault("x64", bool(jax.config.read("jax_enable_x64")))
        return self._pool.submit(compile_for_target, fn, tuple(abstract_args), tgt, **options)

    def submit_lowered(self, lowered, tgt: Target, **options) -> Future[TargetCompile]:
        """``compile_lowered_for_target(lowered, tgt, **options)`` on the worker."""
        _libtpu.require_libtpu()
        return self._pool.submit(compile_lowered_for_target, lowered, tgt, **options)

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _lower_priority() -> None:
    """The worker yields the CPU to the program: 10 nicer than the process (the compiler's
    threads it starts inherit it). On 2 busy cores an eager training loop ran 1.4x slower
    beside target compiles at the same priority, 1.04x at this one (benchmarks/
    target_compile.py overhead). Linux only: there a thread is a task with its own nice
    value; elsewhere setpriority takes a process id, which a thread id is not."""
    if sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))


_default: TargetCompiler | None = None
_default_lock = threading.Lock()


def default_compiler() -> TargetCompiler:
    """The process's shared ``TargetCompiler``, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = TargetCompiler()
        return _default


def compile_for_target_async(fn, abstract_args=(), target: str | Target = "v5e",
                             **options) -> Future[TargetCompile]:
    """``compile_for_target`` on the shared worker thread; returns a future."""
    return default_compiler().submit(fn, abstract_args, parse_target(target), **options)


def compile_lowered_for_target_async(lowered, target: str | Target = "v5e",
                                     **options) -> Future[TargetCompile]:
    """``compile_lowered_for_target`` on the shared worker thread; returns a future."""
    return default_compiler().submit_lowered(lowered, parse_target(target), **options)
