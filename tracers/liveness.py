"""Is the process writing a run still alive? Answered with a lock, not a pid.

The writing process holds an exclusive ``flock`` on ``<run.db>-writer.lock``
from before the database exists until the run is closed. The kernel releases
the lock when the process ends, however it ends (SIGKILL included), so a
reader that can take a shared lock on the file knows the writer is gone. A pid
answers the same question badly: after the writer dies its pid can be given to
an unrelated process, and the run would look alive forever.

Where ``flock`` is unavailable (no ``fcntl`` module, a file system that
refuses it) the writer leaves no lock file and readers fall back to the pid and
host name recorded in the run's metadata.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from tpu_debug.core.errors import RunBusyError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_SUFFIX", "WriterLock", "lock_path", "writer_alive"]

LOCK_SUFFIX = "-writer.lock"
_ACQUIRE_WAIT = 2.0  # seconds; a reader's probe lasts microseconds


# locks this process holds, by lock path: a reader in the writing process answers from here
# (opening and closing the lock file again could drop the lock where flock is emulated with
# POSIX record locks, which belong to the process, not to the open file)
_held: dict[str, WriterLock] = {}
_held_lock = threading.Lock()


def lock_path(db_path: Path | str) -> Path:
    """The lock file of the run database at ``db_path``."""
    db_path = Path(db_path)
    return db_path.with_name(db_path.name + LOCK_SUFFIX)


class WriterLock:
    """The writer's claim on a run: held for the run's life, released by the OS at process death.

    Example::

        lock = WriterLock(Path("run.db"))
        lock.acquire()     # before the database is created
        lock.release()     # after the final metadata is committed
    """

    def __init__(self, db_path: Path | str) -> None:
        self.path = lock_path(db_path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock; False where flock is unavailable.

        Raises:
            RunBusyError: another process holds it (it is writing this run).
        """
        if fcntl is None or self._fd is not None:
            return self._fd is not None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # O_CLOEXEC: Python's default
        # readers hold a shared lock for a moment to probe it: wait that out, not a live writer
        deadline = time.monotonic() + _ACQUIRE_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
                os.close(fd)
                raise RunBusyError(
                    f"{self.path.parent}: another process is writing this run (it holds "
                    f"{self.path.name}). Record into a new run directory."
                ) from None
            except OSError:
                # a file system without flock: a lock file nobody holds would tell readers the
                # writer is dead, so leave none and let them use the pid
                os.close(fd)
                self.path.unlink(missing_ok=True)
                return False
        self._fd = fd
        with _held_lock:
            _held[str(self.path)] = self
        return True

    def release(self) -> None:
        """Let go of the lock (idempotent). The file stays: removing it could race a reader."""
        with _held_lock:
            fd, self._fd = self._fd, None
            if _held.get(str(self.path)) is self:
                del _held[str(self.path)]
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock


def _forget_in_child() -> None:
    # a child forked by the writer (a DataLoader worker, say) shares the lock's open file: if
    # it kept its copy, a SIGKILLed writer would still look alive while the child runs.
    # Closing the child's descriptor leaves the parent's lock in place.
    with _held_lock:
        locks = list(_held.values())
        _held.clear()
    for lock in locks:
        fd, lock._fd = lock._fd, None
        if fd is not None:
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _lock_says(db_path: Path | str) -> bool | None:
    """True: a process holds the writer lock; False: nobody does; None: no lock to ask."""
    path = lock_path(db_path)
    with _held_lock:
        if str(path) in _held:
            return True
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (a run from before locks, or written where flock failed)
        return None
    try:
        # shared and non-blocking: readers never wait for or exclude each other, and a shared
        # lock needs only read access (a run directory of another user)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        return False
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def writer_alive(db_path: Path | str, *, pid: int | None = None, hostname: str | None = None) -> bool:
    """Whether the process that writes the run at ``db_path`` is still running.

    The writer lock decides. Without one, a process ``pid`` alive on this host
    (``hostname``) counts as the writer: a guess, since pids are reused.

    Example:
        >>> writer_alive(Path("tpu_debug_runs/20260101T000000.000Z-train/run.db"))
        False
    """
    held = _lock_says(db_path)
    if held is not None:
        return held
    return hostname == socket.gethostname() and pid is not None and _pid_alive(int(pid))
