"""Hooks that time what a training step waits for outside the runtime: the next batch and
checkpoint saves.

PyTorch reports neither to a listener: a ``DataLoader`` iterator's ``__next__`` and
``torch.save`` run no device op until their data reaches the device, and what they cost
is Python time that would otherwise be taken for the step's own. While a trace records,
:func:`install` wraps ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (every
loader iterator's, single- or multi-process), ``torch.save`` and, once it is imported,
``torch.distributed.checkpoint``'s ``save`` and ``async_save``; :func:`uninstall` puts
the originals back. Each wrapper hands the wait to the step tracker
(:meth:`~tpu_debug.tracers.recording.step_tracker.StepTracker.begin_wait` / ``end_wait``), which counts it
in the step's split and records a :class:`~tpu_debug.tracers.events.WaitEvent`.

The wrappers are the tool's code inside the user's program: dynamo never traces them
(:func:`tpu_debug.runtime.probes.as_dynamo_disabled` marks them as ``torch._dynamo.disable``
does), they change no argument and no result, and a wait the tracker cannot take (another
thread's, a trace that ended) costs two clock reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpu_debug.core.post_import import when_imported
from tpu_debug.runtime.probes import as_dynamo_disabled

__all__ = ["install", "uninstall"]

# the tracker the wrappers report to (None outside a trace); per (owner, attribute name),
# the original and the wrapper put in its place
_tracker: Any = None
_replaced: dict[tuple[Any, str], tuple[Any, Any]] = {}


def install(tracker: Any) -> None:
    """Time ``DataLoader`` iterators' ``__next__``, ``torch.save`` and DCP saves for ``tracker``.

    Example::

        install(tracker)      # while the trace records
        ...
        uninstall()
    """
    global _tracker
    from torch.utils.data import dataloader
    _tracker = tracker
    _wrap(dataloader._BaseDataLoaderIter, "__next__", "input", "DataLoader", _loader_settings)
    import torch
    import torch.serialization

    save = _wrap(torch.serialization, "save", "checkpoint", "torch.save")
    if save is not None and torch.save is save[0]:
        _replace(torch, "save", save[1])
    when_imported("torch.distributed.checkpoint.state_dict_saver", _wrap_dcp)


def uninstall() -> None:
    """Put every original back (a wrapper replaced since by someone else's stays theirs)."""
    global _tracker
    _tracker = None
    originals = {id(wrapper): original for original, wrapper in _replaced.values()}
    for (owner, name), (original, wrapper) in list(_replaced.items()):
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, original)
    # a package that imported a wrapped function while its module was first imported (DCP's
    # __init__ takes save from state_dict_saver after the hook wrapped it) holds the wrapper too
    import sys

    package = sys.modules.get("torch.distributed.checkpoint")
    for name in ("save", "async_save"):
        held = getattr(package, name, None) if package is not None else None
        if held is not None and id(held) in originals:
            setattr(package, name, originals[id(held)])
    _replaced.clear()


def _wrap_dcp() -> None:
    if _tracker is None:
        return  # imported after the trace ended
    import sys

    saver = sys.modules.get("torch.distributed.checkpoint.state_dict_saver")
    package = sys.modules.get("torch.distributed.checkpoint")
    for name, api in (("save", "dcp.save"), ("async_save", "dcp.async_save")):
        done = _wrap(saver, name, "checkpoint", api)
        if done is not None and package is not None and getattr(package, name, None) is done[0]:
            _replace(package, name, done[1])


def _replace(owner: Any, name: str, wrapper: Any) -> None:
    _replaced[(owner, name)] = (getattr(owner, name), wrapper)
    setattr(owner, name, wrapper)


def _wrap(owner: Any, name: str, what: str, api: str,
          settings: Callable[[Any], dict] | None = None) -> tuple[Any, Any] | None:
    """Replace ``owner.name`` with a timed wrapper; (the original, the wrapper), or None when
    ``owner`` has no such callable."""
    original = getattr(owner, name, None) if owner is not None else None
    if original is None or not callable(original):
        return None
    if (owner, name) in _replaced:
        return _replaced[(owner, name)]
    perf_counter = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        tracker = _tracker
        token = tracker.begin_wait(what) if tracker is not None else None
        if token is None:
            return original(*args, **kwargs)
        start = perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = perf_counter() - start
            extra = settings(args[0]) if settings is not None and args else {}
            tracker.end_wait(token, seconds, api, **extra)

    wrapper = as_dynamo_disabled(timed, original)
    _replace(owner, name, wrapper)
    return original, wrapper


def _loader_settings(iterator: Any) -> dict[str, Any]:
    """A loader iterator's workers, pinning and prefetch depth (what an input-bound fix changes)."""
    workers = getattr(iterator, "_num_workers", None)
    prefetch = getattr(iterator, "_prefetch_factor", None)
    return {
        "workers": int(workers) if isinstance(workers, int) else None,
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "prefetch_factor": int(prefetch) if isinstance(prefetch, int) and workers else None,
    }
