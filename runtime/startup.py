"""The device's first use: what :func:`start` does once, and the shield every kernel and
compiled program runs behind (dynamo's frame callback unset, the first use started).

Below the device and compiled mode, which both run their work through :func:`dynamo_disabled`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._C._dynamo import eval_frame as _eval_frame
from tpu_debug.runtime import accelerator
from tpu_debug.runtime import lazy as _lazy
from tpu_debug.runtime import probes, xla_options
from tpu_debug.runtime.config import config
from tpu_debug.runtime.platform import leave_out_an_absent_tpu
from tpu_debug.runtime.torchtpu.compat import eager_mode_from_env

__all__ = ["dynamo_disabled", "first_use", "single_threaded_backward", "start"]

_lock = threading.Lock()
_started = False
_in_use = False  # a kernel of the device ran (first_use): start() alone, from trace(), is not that


def start() -> None:
    """Prepare the runtime for its first work, once: the device's first op (any kernel or
    ``torch.tpu`` function that reaches JAX) and the first ``tpu_debug.trace()`` call it.

    Registering the device (``import tpu_debug``) changes nothing else in the process;
    this does, when the device is first used: it reads the runtime's ``TPU_DEBUG_*``
    variables into ``runtime.config`` (a value assigned before stands), applies the eager
    mode they ask for, keeps JAX off an absent TPU (see ``platform.leave_out_an_absent_tpu``:
    before JAX's first backend probe) and runs this thread's backward passes on this
    thread (see ``single_threaded_backward``).

    Raises:
        ConfigError: a ``TPU_DEBUG_*`` variable of the runtime holds a value it does
            not accept (the one-line message names the variable, the value and what
            is accepted); the next use tries again.
    """
    global _started
    if _started:
        return
    with _lock:
        if _started:
            return
        config.load_env()
        torchtpu_mode = eager_mode_from_env()  # TorchTPU's TPU_LAUNCH_BLOCKING, TORCH_TPU_DEFER_AND_FUSE
        if torchtpu_mode is not None:
            config.eager_mode = torchtpu_mode
        xla_options.mark_started()  # XLA_FLAGS as XLA reads it when it starts
        leave_out_an_absent_tpu()
        single_threaded_backward()
        _started = True
    # TPU_DEBUG_EAGER_MODE=defer_and_fuse: hook the optimizers as setting the mode does
    _lazy.set_mode(config.eager_mode)


def single_threaded_backward() -> None:
    """Run this thread's backward passes on this thread.

    PyTorch's autograd engine runs the nodes of a device other than CPU on a worker
    thread of that device: for `tpu`, one more thread, a hand-off per backward and the
    GIL passed back and forth around every Python node (a compiled graph's backward
    is one). That cost 0.5 ms of a 0.9 ms ``loss.backward()`` of the compiled MLP
    (benchmarks/compiled.py). With the engine's multithreading off
    (``torch.autograd.set_multithreading_enabled(False)``, per thread, as for CPU
    tensors) the calling thread runs them, and device work stays asynchronous in XLA.
    A tracer walking the stack also finds the user's ``backward()`` line. Set on the
    thread of the device's first use (``start()``) and on each thread that compiles a graph.
    """
    if torch._C._is_multithreading_enabled():
        torch._C._set_multithreading_enabled(False)


def first_use() -> None:
    """A kernel of the device ran (a `tpu` tensor made, moved or computed on): the runtime
    starts, and PyTorch's accelerator is ``tpu`` from now on (see runtime/accelerator.py)."""
    global _in_use
    start()
    accelerator.claim()
    _in_use = True


def dynamo_disabled(fn: Any, *, kernel: bool = True) -> Any:
    """``torch._dynamo.disable(fn, recursive=True)`` without importing torch._dynamo,
    which costs about a second: the same two steps through dynamo's C
    module, which loads with torch. ``fn`` and all it calls run with dynamo's frame
    callback unset, and dynamo runs the wrapper's own frame without looking at it.
    A ``kernel``'s first call is the device's first use; ``torch.tpu``'s RNG functions are
    not (``torch.manual_seed`` seeds every registered device, in CPU jobs too)."""

    def shielded(*args, **kwargs):
        prior = _eval_frame.set_eval_frame(None)
        try:
            if kernel and not _in_use:
                first_use()
            return fn(*args, **kwargs)
        finally:
            _eval_frame.set_eval_frame(prior)

    return probes.as_dynamo_disabled(shielded, fn)
