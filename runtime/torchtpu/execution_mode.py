"""``torch_tpu._internal.execution_mode``: the eager mode and the CPU fallback, as properties
and context managers.

``em.eager_mode`` reads the mode in effect and ``em.eager_mode = mode`` sets it (a module
property, as in TorchTPU); ``with em.set_eager_mode(mode):`` and the guide's
``with em.eager_mode(mode):`` run a block in ``mode``, and ``em.set_eager_mode(mode)`` called
alone sets it (this module's ``set_eager_mode`` was the extension's setter in one TorchTPU
layout); ``with em.cpu_fallback_mode(True):``
runs ops that have no lowering on CPU inside the block. TorchTPU's first layout named the
modes ``DeferMode`` (``set_defer_mode``, ``with defer_mode(mode):``): those are here too
(:mod:`.execution_mode_impl` says which mode each is).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

from tpu_debug.runtime import lazy
from tpu_debug.runtime.config import config
from tpu_debug.runtime.torchtpu.execution_mode_impl import DeferMode, get_defer_mode, set_defer_mode

__all__ = ["DeferMode", "EagerMode", "cpu_fallback_mode", "defer_mode", "get_defer_mode", "get_eager_mode",
           "set_defer_mode", "set_eager_mode"]

EagerMode = lazy.EagerMode


class set_eager_mode(lazy.set_eager_mode):
    """``em.set_eager_mode(mode)`` makes ``mode`` the eager mode; ``with em.set_eager_mode(mode):``
    also puts the mode the call found back after the block.

    TorchTPU's ``execution_mode`` exported the extension's ``set_eager_mode`` setter (its
    gpt-oss training example calls it alone) and later a context manager (the guide's
    notebooks use ``with``); an instance does both. ``torch.tpu.set_eager_mode`` stays the
    public API's context manager, which changes nothing until entered.

    Raises:
        TpuArgumentError: ``mode`` is no EagerMode.

    Example::

        em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE)  # from here on
        with em.set_eager_mode(em.EagerMode.DEFER_NEVER):  # this block only
            x.add_(1)
    """

    def __init__(self, mode: lazy.EagerMode | str) -> None:
        super().__init__(mode)
        self._found: str | None = config.eager_mode
        lazy.set_mode(self.mode)

    def __enter__(self) -> None:
        # the first entry restores what the call found; a reuse (as a decorator) what it finds then
        found, self._found = self._found, None
        self._previous.append(config.eager_mode if found is None else found)
        lazy.set_mode(self.mode)


def get_eager_mode() -> lazy.EagerMode:
    """The eager mode in effect."""
    return lazy.eager_mode()


@contextlib.contextmanager
def cpu_fallback_mode(enabled: bool) -> Iterator[None]:
    """Inside the block, an op with no lowering runs on CPU (``enabled=True``) or raises
    ``NotImplementedError`` (``False``); the setting before comes back after it."""
    before = config.cpu_fallback
    config.cpu_fallback = bool(enabled)
    try:
        yield
    finally:
        config.cpu_fallback = before


@contextlib.contextmanager
def defer_mode(mode: DeferMode) -> Iterator[None]:
    """Run the block in defer mode ``mode``; the mode before comes back after it."""
    before = lazy.eager_mode()
    set_defer_mode(mode)
    try:
        yield
    finally:
        lazy.set_mode(before)


_donation = {"disabled": False}


class _ExecutionModeModule(types.ModuleType):
    """This module, with TorchTPU's settable module properties."""

    @property
    def eager_mode(self) -> lazy.EagerMode:
        """The eager mode in effect; assigning sets it. Called with a mode it is a context
        manager (``with em.eager_mode(EagerMode.DEFER_NEVER):``)."""
        return lazy.eager_mode()

    @eager_mode.setter
    def eager_mode(self, mode: lazy.EagerMode | str) -> None:
        lazy.set_mode(mode)

    @property
    def enable_cpu_fallback(self) -> bool:
        """Whether ops with no lowering run on CPU; assigning sets it."""
        return bool(config.cpu_fallback)

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, enabled: bool) -> None:
        config.cpu_fallback = bool(enabled)

    @property
    def disable_inplace_buffer_donation(self) -> bool:
        """TorchTPU's switch for an in-place op giving its input's buffer to its output. Eager
        ops here never donate (a JAX array is immutable and each op's result is a new buffer;
        only compiled graphs donate the buffers they overwrite), so the value is kept and
        changes nothing."""
        return _donation["disabled"]

    @disable_inplace_buffer_donation.setter
    def disable_inplace_buffer_donation(self, disabled: bool) -> None:
        _donation["disabled"] = bool(disabled)


sys.modules[__name__].__class__ = _ExecutionModeModule
