"""SIGINT and SIGTERM while a trace records: the handlers a trace installs, and the signals held
while a run is set up or closed.

While a trace records in the main thread, SIGTERM raises :class:`Terminated` and SIGINT
``KeyboardInterrupt`` (unless the program set its own handlers), so the program unwinds and
the run is closed with the status the signal says; a signal that arrives inside a garbage
collection callback, where Python would swallow the exception, is sent again
(:class:`_Resender`). ``tpu-debug run`` reads :class:`Terminated` and
:func:`without_handler_frame` too, so this module imports only the standard library: the
CLI's reading verbs load it without torch and jax.
"""

from __future__ import annotations

import dis
import gc
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "HANDLERS",
    "GiveUp",
    "HeldSignals",
    "Terminated",
    "hold_unraisable",
    "release_unraisable",
    "resender",
    "say",
    "without_handler_frame",
]


class Terminated(SystemExit):
    """SIGTERM arrived while a trace was recording.

    While a trace records in the main thread, SIGTERM (unless the program set
    its own handler) raises this exception, so the program unwinds as it does
    for Ctrl-C and the run is closed with status ``"terminated"``. Uncaught, it
    ends the process with exit status 143 (128 + SIGTERM), the status a shell
    shows for a process SIGTERM killed.
    """

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _package_dirs(*names: str) -> tuple[str, ...]:
    """The folders of the named packages that are imported, each ending in ``os.sep``."""
    dirs = []
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs += [os.path.dirname(path) + os.sep, os.path.dirname(os.path.realpath(path)) + os.sep]
    return tuple(dirs)


# where the interpreter itself runs a signal's handler: entering a function and the back edge
# of a loop. Elsewhere it runs because C code asked (PyErr_CheckSignals, as torch does while an
# op or the backward pass runs), and an exception raised there unwinds through that C++
_EVAL_LOOP_CHECKS = frozenset({"RESUME", "JUMP_BACKWARD"})


def _opname(frame: Any) -> str:
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    return dis.opname[code[lasti]] if 0 <= lasti < len(code) else ""


def _unraisable(frame: Any, in_cpp: bool = True) -> bool:
    """Whether an exception raised in ``frame`` would be dropped or would crash the process.

    Python prints and drops what a gc callback or a ``__del__`` raises; jax registers a gc
    callback that runs at every collection, and a program busy compiling collects often. An
    exception raised while C++ runs (torch's call into an op or the backward pass; tpu_debug's
    kernels and hooks, which the torch dispatcher and autograd engine call; jax under jaxlib)
    unwinds through that C++, where it sometimes ends the process with "terminate called without
    an active exception" (SIGABRT) instead of reaching the program: the signal is acted on once
    the program is back in Python code that Python called (``in_cpp=False``: only the first
    kind, for a handler that must act while the run closes, waiting in tpu_debug's code)."""
    if in_cpp:
        libraries = _package_dirs("torch", "jax", "jaxlib", "tpu_debug.runtime", "tpu_debug.tracers")
        if frame is not None and frame.f_code.co_filename.startswith(libraries):
            if _opname(frame) not in _EVAL_LOOP_CHECKS:
                return True  # a library's call into C asked for the handler
    called_from_cpp = _package_dirs("jax", "jaxlib", "tpu_debug.runtime", "tpu_debug.tracers") if in_cpp else ()
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or code.co_filename.startswith(called_from_cpp):
            return True
        frame = frame.f_back
    return False


class _Resender:
    """A thread that sends a signal to this process again, for a handler that ran where it could
    not raise (see :func:`_unraisable`). From the main thread, ``signal.raise_signal`` and
    ``os.kill`` would run the handler again at once, still inside the callback, and starting a
    thread there waits, which runs it again too: the thread is started beforehand."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.pending: set[int] = set()  # signals to send again; a handler that acted drops its own

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():  # (a forked child has none)
            self._thread = threading.Thread(target=self._run, name="tpu_debug-signals", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            signum = self._queue.get()
            time.sleep(0.001)  # the main thread leaves the callback meanwhile
            # once, and only while one of our handlers is in place: sent after the trace ended,
            # it would reach Python's default handler, or kill a process that is shutting down
            if signum in self.pending and signal.getsignal(signum) in _OURS:
                self.pending.discard(signum)
                # to the main thread, the one that acts on it: sent to the process, it may land
                # on a thread of the runtime while the main thread still has it pending
                signal.pthread_kill(threading.main_thread().ident, signum)

    def send_again(self, signum: int) -> None:
        self.pending.add(signum)
        self._queue.put(signum)  # never blocks: safe in a signal handler

    def acted(self, signum: int) -> None:
        self.pending.discard(signum)


resender = _Resender()


def _raise_terminated(signum: int, frame: Any) -> None:
    if _unraisable(frame):
        resender.send_again(signum)
        return
    resender.acted(signum)
    raise Terminated


def _raise_interrupt(signum: int, frame: Any) -> None:
    # Python's own SIGINT handler, but never lost in a gc callback (see _unraisable)
    if _unraisable(frame):
        resender.send_again(signum)
        return
    resender.acted(signum)
    raise KeyboardInterrupt


def without_handler_frame(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the frame of the signal handler a trace installs (:func:`_raise_interrupt`,
    :func:`_raise_terminated`): Python's own handlers are C and add none, so the program's
    traceback ends at the user's line, as it does without a trace."""
    handlers = {_raise_interrupt.__code__, _raise_terminated.__code__}
    if tb is not None and tb.tb_frame.f_code in handlers:
        return tb.tb_next
    head = tb
    while tb is not None and tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code in handlers:
            tb.tb_next = tb.tb_next.tb_next
        else:
            tb = tb.tb_next
    return head


def _unraisable_hook(unraisable: Any) -> None:
    """``sys.unraisablehook`` while a trace records: a KeyboardInterrupt or Terminated that
    Python dropped where :func:`_unraisable` could not tell (a weakref callback, a finalizer)
    is sent again, to be raised where it can; anything else goes to the hook in place before."""
    exc_type = unraisable.exc_type
    if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Terminated)):
        resender.send_again(signal.SIGINT if issubclass(exc_type, KeyboardInterrupt) else signal.SIGTERM)
        return
    (_saved_unraisablehook or sys.__unraisablehook__)(unraisable)


_saved_unraisablehook: Any = None


def hold_unraisable() -> None:
    """Route exceptions raised where Python cannot raise them (a gc callback) through
    :func:`_unraisable_hook` while a trace's handlers are in place."""
    global _saved_unraisablehook
    if sys.unraisablehook is not _unraisable_hook:
        _saved_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable_hook


def release_unraisable() -> None:
    """Give ``sys.unraisablehook`` back, where :func:`hold_unraisable` set ours and nothing
    replaced it since."""
    if sys.unraisablehook is _unraisable_hook:
        sys.unraisablehook = _saved_unraisablehook or sys.__unraisablehook__


# while a trace records in the main thread, these handlers replace the defaults
HANDLERS = {
    signal.SIGINT: (signal.default_int_handler, _raise_interrupt),
    signal.SIGTERM: (signal.SIG_DFL, _raise_terminated),
}
_OURS: set[Any] = {_raise_interrupt, _raise_terminated}  # and each HeldSignals._held


def _defaults_in_child() -> None:
    # the trace belongs to the process that started it: a child it forks (a DataLoader worker)
    # records nothing and gets Python's handlers back, so SIGTERM ends it as it would have
    for sig, (default, ours) in HANDLERS.items():
        try:
            if signal.getsignal(sig) is ours:
                signal.signal(sig, default)
        except ValueError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_defaults_in_child)


class GiveUp(BaseException):
    """A second signal while the run is being closed: stop waiting for the writer."""


def say(line: str) -> None:
    # straight to the descriptor: called from a signal handler, which may run while the main
    # thread is inside a write to sys.stderr (a buffered writer refuses re-entrant calls)
    try:
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


class HeldSignals:
    """SIGINT and SIGTERM held while a run is set up or closed, then handed to their handlers.

    A signal acted on half-way through set-up or close would leave tracers
    subscribed, the writer open and the run "running"; held, it is delivered
    once the run is fully started (then the run ends as the signal says) or
    fully closed. While the final write is awaited, the first signal prints a
    note and a second one raises :class:`GiveUp`: an impatient Ctrl-C never
    waits for the writer. Signals a program ignores are left alone.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        self._waiting_for: Path | None = None

    def hold(self) -> HeldSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread can set handlers, and only it gets signals
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                current = signal.getsignal(sig)
                if current in (signal.SIG_IGN, None):  # ignored, or not set from Python
                    continue
                signal.signal(sig, self._held)
            except ValueError:  # not settable here (an embedded interpreter)
                continue
            _OURS.add(signal.getsignal(sig))
            self.previous[sig] = current
        return self

    def _held(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self._waiting_for is None or len(self.received) == 1:
            resender.acted(signum)
            if self._waiting_for is not None:
                self._note()
        elif _unraisable(frame, in_cpp=False):
            resender.send_again(signum)
        else:
            resender.acted(signum)
            raise GiveUp

    def _note(self) -> None:
        name = signal.Signals(self.received[0]).name
        again = "Ctrl-C" if self.received[0] == signal.SIGINT else "the signal"
        say(
            f"tpu_debug: {name} received; writing the end of the run to {self._waiting_for} first "
            f"({again} again to stop waiting)"
        )

    def waiting(self, path: Path | None) -> None:
        """While ``path`` is set, a second signal gives up waiting (raises :class:`GiveUp`)."""
        self._waiting_for = path
        if path is not None and self.received:
            self._note()

    def release(self, restore: Mapping[int, Any] | None = None) -> None:
        """Put the handlers back (``restore`` overrides what goes back for a signal) and hand
        the first held signal to the handler in place when it came: this may raise."""
        previous, self.previous = self.previous, {}
        for sig, handler in previous.items():
            _OURS.discard(signal.getsignal(sig))
            signal.signal(sig, (restore or {}).get(sig, handler))
        if not self.received:
            return
        sig = self.received[0]
        handler = previous.get(sig)
        # called here, not re-raised with raise_signal: a signal handled later could land in a
        # gc callback, where Python would swallow the exception its handler raises
        if callable(handler):
            handler(sig, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), sig)


