"""Child processes that end with the process that started them.

A verb that serves through a child (``tpu-debug tensorboard``, each browser tab of ``tpu-debug
tui --serve``) must not leave it serving when the verb ends, however it ends: Ctrl-C, SIGTERM,
SIGHUP or SIGKILL. Only the kernel sees every one of those, so the child asks it to be sent a
signal when its parent dies (Linux's ``PR_SET_PDEATHSIG``); elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["end_with_parent", "ends_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # no C library to ask (a static interpreter)
        return None


def end_with_parent(parent: int, prctl: Callable[..., int] | None = None, sig: int = signal.SIGTERM) -> None:
    """Have this process sent ``sig`` when ``parent`` (its parent's pid) ends.

    Args:
        parent: the pid the caller expects as its parent; when the parent is already gone
            (this process was reparented before the request took effect), ``sig`` comes at once.
        prctl: the C library's ``prctl``, looked up beforehand when called in a forked child.
        sig: the signal to be sent.
    """
    prctl = prctl or _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def ends_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child ends when this process does.

    Example::

        subprocess.Popen(command, preexec_fn=ends_with_parent())
    """
    parent, prctl = os.getpid(), _prctl()  # looked up here: between fork and exec, call only

    def preexec() -> None:
        end_with_parent(parent, prctl)

    return preexec
