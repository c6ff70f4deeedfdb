"""The live check's watcher: one daemon thread per process that wakes the ranks' blocking
reads of the group store, and tells whether a rank's process still runs.

A rank that does not come is written for, so the readers wake: a process that leaves writes
an "ended" entry for the collective after its last one (at exit), and the watcher, looking
every tenth of a second at the ranks a reader has waited for, writes "died" for one whose
process is gone and "missing" once the timeout has passed. It also deletes the entries every
rank has read, off the collective's path, and answers the other ranks' questions of where a
thread of this process is now.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time
from typing import Any, Protocol

from tpu_debug.core.collective_kinds import RECEIVES
from tpu_debug.runtime.distributed import flight_recorder
from tpu_debug.runtime.distributed.config import config
from tpu_debug.runtime.distributed.rank_state import exit_status, leaving, thread_stack

__all__ = ["KEY", "Watched", "process_key", "process_space", "tell_at_exit", "watcher"]

#: the prefix of every key of the live check in a c10d store
KEY = "tpu_debug/collectives"
# how often the watcher looks at the ranks a reader waits for: a dead rank is named before
# a launcher that saw it die (torchrun polls its workers every 0.1 s) stops this one
_LOOK_SECONDS = 0.1
# a rank waited for past the timeout is asked where it is: its watcher looks for the question
# every _ANSWER_EVERY rounds, and the asker waits _ANSWER_SECONDS for the answer
_ANSWER_EVERY = 3
_ANSWER_SECONDS = 2.0
# a send or receive waited for this long: its peer is asked whether it waits to receive from
# this rank too (two ranks that each receive first wait for each other for ever)
_CYCLE_SECONDS = 1.0


class Watched(Protocol):
    """A group's live check, as the watcher sees it (``live_check.LiveCheck``)."""

    store: Any
    me: int
    timeout: float
    space: str  # where its process's id means its process (process_space())
    asked: set[str]  # the sends and receives waited for whose peer was asked if it waits too
    thread: int | None  # the thread that called last: the one the others ask about

    def side_store(self) -> Any: ...
    def state_key(self, kind: str, rank: int) -> str: ...
    def p2p_key(self, channel: tuple[int, int, int], n: int, send: bool) -> str: ...
    def sweep(self) -> None: ...
    def release(self) -> None: ...
    def leave(self) -> None: ...


_exit_marks: list[Watched] = []  # the live checks of this process, told at exit
_exit_lock = threading.Lock()


def tell_at_exit(check: Watched) -> None:
    """Have ``check`` tell the other ranks when this process leaves (and the watcher sweep it)."""
    with _exit_lock:
        if not _exit_marks:
            atexit.register(_mark_exit)
        _exit_marks.append(check)


def _mark_exit() -> None:
    """Tell the other ranks this process has left its groups (they stop waiting for it)."""
    # the watcher first: a daemon thread still inside a store call when the interpreter
    # finalizes is unwound through C++ and aborts the process
    watcher.stop()
    for check in _exit_marks:
        check.leave()
    fr = flight_recorder.recorder
    if fr is not None:
        if config.flight_recorder_at_exit:
            fr.dump()
        elif leaving()["state"] == "raised":
            fr.dump_on_error()


def process_space() -> str:
    """Where this process's id means this process: the host and its pid namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{namespace}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` (of this pid namespace) still runs; a zombie does not."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


class _Watcher:
    """One daemon thread per process. For the ranks a reader has waited for more than
    :data:`_LOOK_SECONDS` it writes whether they left, died or are missing after the timeout,
    so the reader's blocking read returns; for this process it answers the other ranks'
    requests for where a thread of it is now (see :meth:`answer`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # thread id -> (check, targets: (rank, key, its last entry's key), start, what the thread waits in)
        self._waits: dict[int, tuple[Watched, list[tuple[int, str, str | None]], float, dict]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._root: Any = None  # see root()
        self.caller: int | None = None  # the thread that called a collective last: the one other ranks ask about

    def begin(self, check: Watched, targets: list[tuple[int, str, str | None]], card: dict) -> None:
        with self._lock:
            self._waits[threading.get_ident()] = (check, targets, time.monotonic(), card)
        self.ensure()

    def ensure(self) -> None:
        """Start the thread, once."""
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="tpu_debug-collective-watcher", daemon=True)
                self._thread.start()

    def end(self) -> None:
        with self._lock:
            self._waits.pop(threading.get_ident(), None)

    def waiting_in(self, ident: int | None) -> dict | None:
        """The call thread ``ident`` waits in now, or None."""
        with self._lock:
            wait = self._waits.get(ident) if ident is not None else None
        return None if wait is None else wait[3]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        rounds = 0
        while not self._stopped:
            self._wake.wait(_LOOK_SECONDS)
            if self._stopped:
                return
            rounds += 1
            with self._lock:
                waits = list(self._waits.values())
            now = time.monotonic()
            for check, targets, start, _ in waits:
                if now - start >= _LOOK_SECONDS:
                    with contextlib.suppress(Exception):  # a store gone: the reader's own read fails and says so
                        self.look(check, targets, waited=now - start)
            with _exit_lock:
                checks = list(_exit_marks)
            for check in checks:
                with contextlib.suppress(Exception):  # entries left behind cost a few bytes in the store
                    check.sweep()
                    check.release()
            if checks and rounds % _ANSWER_EVERY == 0:
                with contextlib.suppress(Exception):  # the store's host gone: no one asks any more
                    self.answer(checks[0])

    def look(self, check: Watched, targets: list[tuple[int, str, str | None]], *, waited: float) -> None:
        """For each ``(rank, key, key of its last entry)`` of ``check`` whose key is not written
        yet: write how the rank left when it did, "died" when its process is gone, "missing"
        once the timeout has passed (with where it is now, when it answers), or at once for a
        peer that waits to receive from this rank while this rank waits to receive from it
        (that never ends: after :data:`_CYCLE_SECONDS` it is asked); the reader then wakes."""
        side = check.side_store()
        timed_out = waited >= check.timeout
        for rank, key, before in targets:
            if side.check([key]):
                continue
            last = json.loads(side.get(before)) if before is not None and side.check([before]) else None
            last = last if last is not None and last.get("state", "called") == "called" else None
            left = check.state_key("left", rank)
            state: dict | None = json.loads(side.get(left)) if side.check([left]) else None
            if state is None and last is not None and last.get("space") == check.space:
                pid = int(last.get("pid", -1))
                if not _alive(pid):
                    state = {"state": "died", "exit_status": exit_status(pid)}
            if state is None and timed_out:
                state = {"state": "missing", **self._ask(check, side, rank)}
            elif state is None and waited >= _CYCLE_SECONDS and "/p2p/" in key and key not in check.asked:
                check.asked.add(key)
                answer = self._ask(check, side, rank)
                state = {"state": "missing", **answer} if answer.get("cycle") else None
            if state is not None:
                side.compare_set(key, "", json.dumps({"seq": None, **state, "last": last}))

    def _ask(self, check: Watched, side: Any, rank: int) -> dict:
        """Where ``rank`` is now, from its own watcher: ``{"stack": [...], "cycle": bool}``
        (``cycle``: it waits to receive from this rank), or {} when it does not answer in time.
        While it waits for the answer it answers this process's own question: two ranks that
        wait for each other ask each other at once."""
        root = self.root(check)
        answer = process_key("stack", rank)
        try:
            root.delete_key(answer)
            root.set(process_key("ask", rank), str(check.me))
            deadline = time.monotonic() + _ANSWER_SECONDS
            while not root.check([answer]):
                if time.monotonic() > deadline:
                    return {}  # no answer: a process stuck outside Python, or gone
                self.answer(check)
                time.sleep(_LOOK_SECONDS / 2)
            got = json.loads(root.get(answer))
        except (RuntimeError, OSError, ValueError):
            return {}
        waiting = got.get("waiting") or {}
        cycle = False
        if waiting.get("op") in RECEIVES and waiting.get("peer") == check.me:
            # it waits for a send of this rank that this rank has not posted: neither goes on
            mine = check.p2p_key((check.me, rank, int(waiting.get("tag", 0))), int(waiting.get("n", 1)), True)
            cycle = not side.check([mine])
        if cycle:
            # it waits for this rank's send, as this rank waits for its: say so on its side too
            # (it may be past its own question by the time it would ask)
            ident = check.thread if check.thread is not None else threading.main_thread().ident
            side.compare_set(mine, "", json.dumps(
                {"seq": None, "state": "missing", "cycle": True, "stack": thread_stack(ident),
                 "last": self.waiting_in(ident)}))
        return {"stack": got.get("stack", []), "cycle": cycle}

    def root(self, check: Watched) -> Any:
        """This thread's connection to the store every group of the job shares (its root)."""
        if self._root is None:
            store = check.store
            while (under := getattr(store, "underlying_store", None)) is not None:
                store = under
            self._root = store.clone()
        return self._root

    def answer(self, check: Watched) -> None:
        """Answer another rank's question: where this process's calling thread is now, and what
        it waits in (one key per process, in the job's root store)."""
        root = self.root(check)
        ask = process_key("ask", check.me)
        if not root.check([ask]):
            return
        root.delete_key(ask)
        ident = self.caller if self.caller is not None else threading.main_thread().ident
        root.set(process_key("stack", check.me),
                 json.dumps({"stack": thread_stack(ident), "waiting": self.waiting_in(ident)}))


watcher = _Watcher()


def process_key(kind: str, rank: int) -> str:
    """The key of a question to a process ("ask") or of its answer ("stack"), in the job's root store."""
    return f"{KEY}/{kind}/{rank}"
