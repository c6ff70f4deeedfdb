"""The c10d process-group backends ``tpu`` and ``tpu_dist`` for the `tpu` device.

TorchTPU registers these names, and makes ``tpu_dist`` the default for the
device, so ``torch.distributed.init_process_group()`` with no backend works on
`tpu`; scripts written for it run here unchanged, under ``torchrun``,
``torch.multiprocessing.spawn`` or ``tpu-debug run --nproc``.

The engine is gloo on the host, PyTorch's own CPU backend: a collective copies
its `tpu` tensors to the host, runs the same collective there on a gloo process
group built on the same store, and writes the results back into the `tpu`
tensors in place. So every rank only needs what ``init_process_group`` already
gives it (a store, a rank, a size), sub-groups are gloo sub-groups, and the
numbers are gloo's (the tests' reference is gloo on CPU). JAX's multi-process
runtime is the other engine at hand, but it makes every process see one global
device set and needs its own coordinator before the first `tpu` tensor exists,
which ``torchrun`` and ``mp.spawn`` scripts do not arrange.

Before a collective enters gloo, each rank checks that the others of its group call
the same one (see "Hangs and desyncs" in docs/distributed.md): it publishes what it is
about to call (op, sizes, dtype, reduction, root, its user's line) in the group's c10d
store and reads the others' entries for the same sequence number. Another collective,
other sizes, a rank that ended or died, or one that does not arrive within
``TPU_DEBUG_COLLECTIVE_TIMEOUT`` seconds raise :class:`CollectiveDesyncError` /
:class:`CollectiveTimeoutError` on every rank that sees it, naming each rank's call and
line and the fix by cause, instead of gloo's 30-minute wait.

The process group is a Python subclass of ``torch.distributed.ProcessGroup``
(c10d's C++ ``Backend`` has no Python constructor): c10d then uses it as the
whole group, so ``dist.*``, DDP's reducer and the functional collectives all
call its methods, with tensors of any device. Each call finishes before it
returns; its work object is complete, and its future holds the output tensors.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import json
import math
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C._distributed_c10d import ProcessGroupGloo
from tpu_debug.core import desync
from tpu_debug.core.collective_kinds import FLIGHT_RECORDER_NAMES, P2P_OPS
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.post_import import when_imported
from tpu_debug.core.rank_env import read_rank_env
from tpu_debug.runtime import accelerator, probes
from tpu_debug.runtime.distributed import flight_recorder
from tpu_debug.runtime.distributed.config import config
from tpu_debug.runtime.distributed.errors import (
    CollectiveDesyncError,
    CollectiveDeviceError,
    CollectiveTimeoutError,
    LaunchError,
    MeshError,
)
from tpu_debug.runtime.distributed.rank_state import exit_status, leaving, thread_stack, user_site

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "TpuProcessGroup", "for_program", "register_backends"]

BACKEND_NAMES = ("tpu", "tpu_dist")
DEFAULT_BACKEND = "tpu_dist"
_lock = threading.Lock()
_registered = False

_RedOp = dist.ReduceOp.RedOpType
# ReduceOps gloo has itself; AVG and PREMUL_SUM are made from SUM (XLA's all-reduce has
# them all, and FSDP2 asks for AVG and PREMUL_SUM on float32 gradients)
_FLOAT_ONLY = (_RedOp.AVG, _RedOp.PREMUL_SUM)
_BITWISE = (_RedOp.BAND, _RedOp.BOR, _RedOp.BXOR)


class _DoneWork(dist.Work):
    """The work of a collective that finished before its call returned.

    Its future's value is the collective's output tensors (on their own device): DDP's
    reducer reads a bucket's reduced gradients from it.
    """

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        return None

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


def _flat(value: Any) -> list[torch.Tensor]:
    """The tensors of an argument: a tensor, a list of them, or a list of lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat(item)]
    return []


def _to_host(value: Any, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``value`` with each non-CPU tensor replaced by a contiguous host copy (recorded in ``copies``)."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value
        host = value.detach().cpu().contiguous()
        copies.append((value, host))
        return host
    if isinstance(value, list):
        return [_to_host(v, copies) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_host(v, copies) for v in value)
    return value


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, torch.Tensor):
        return value * factor
    return [_scaled(v, factor) for v in value]


def _write_back(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for device_tensor, host in copies:
            device_tensor.copy_(host)


def _check_reduce(op: Any, tensors: Sequence[torch.Tensor]) -> None:
    kind = op if isinstance(op, _RedOp) else op.op
    for t in tensors:
        if kind in _FLOAT_ONLY and not (t.is_floating_point() or t.is_complex()):
            raise TypeError(
                f"ReduceOp.{kind.name} on a {t.dtype} tensor: the tpu backend averages floating "
                "point tensors only; reduce with ReduceOp.SUM and divide"
            )
        if kind in _BITWISE and (t.is_floating_point() or t.is_complex()):
            raise TypeError(
                f"ReduceOp.{kind.name} on a {t.dtype} tensor: bitwise reductions need an integer or "
                "bool tensor"
            )


# -- the live check: ranks compare each collective before it enters gloo -------------------

# The entries live in the group's own store (c10d prefixes it with the group's name), one
# key per rank and sequence number. A rank publishes its entry (a store write without a
# reply) and reads the others' with one multi_get, which the store answers once they all
# exist: no polling. Its own entry of two collectives back is then of no further use: every
# other rank has read it (each has published the previous collective, after reading this
# rank's entries before it); the watcher thread below deletes such entries,
# off the collective's path, so the store holds a few entries per rank and group however
# long the job runs. A rank that does not come is written for, so the readers wake: a process
# that leaves writes an "ended" entry for the collective after its last one (at exit), and a
# watcher thread, looking every tenth of a second at the ranks a reader has waited for, writes
# "died" for one whose process is gone and "missing" once the timeout has passed.
_KEY = "tpu_debug/collectives"
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
_exit_marks: list[Any] = []  # the live checks of this process, told at exit
_exit_lock = threading.Lock()


def _mark_exit() -> None:
    """Tell the other ranks this process has left its groups (they stop waiting for it)."""
    # the watcher first: a daemon thread still inside a store call when the interpreter
    # finalizes is unwound through C++ and aborts the process
    _watcher.stop()
    for check in _exit_marks:
        check.leave()
    fr = flight_recorder.recorder
    if fr is not None:
        if config.flight_recorder_at_exit:
            fr.dump()
        elif leaving()["state"] == "raised":
            fr.dump_on_error()


def _dump_on_error(*, timeout: bool) -> None:
    """A check raises: write the Flight Recorder's dump when it records and is asked to."""
    if flight_recorder.recorder is not None:
        flight_recorder.recorder.dump_on_error(timeout=timeout)


def _process_space() -> str:
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


def _rank_call(rank: int, card: dict | None, state: str = "called", details: dict | None = None) -> desync.RankCall:
    """What ``rank`` did, from its store entry ``card`` (its call, or with another ``state`` its
    last one); ``details`` is the state's own entry (the error, stack or exit status)."""
    extra = {} if details is None else {
        "error": str(details.get("error", "")), "stack": tuple(details.get("stack", ())),
        "exit_status": details.get("exit_status"),
    }
    if card is None:
        return desync.RankCall(rank, state, **extra)
    return desync.RankCall(rank, state, card["op"], card.get("seq"), tuple(card["shapes"]), card["dtype"],
                           card["reduce_op"], card["peer"], card["file"], card["line"], card["function"],
                           card.get("device", ""), **extra)


class _Watcher:
    """One daemon thread per process. For the ranks a reader has waited for more than
    :data:`_LOOK_SECONDS` it writes whether they left, died or are missing after the timeout,
    so the reader's blocking read returns; for this process it answers the other ranks'
    requests for where a thread of it is now (see :meth:`_LiveCheck.answer`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # thread id -> (check, targets: (rank, key, its last entry's key), start, what the thread waits in)
        self._waits: dict[int, tuple[_LiveCheck, list[tuple[int, str, str | None]], float, dict]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._root: Any = None  # see root()

    def begin(self, check: _LiveCheck, targets: list[tuple[int, str, str | None]], card: dict) -> None:
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
                    try:
                        check.look(targets, waited=now - start)
                    except Exception:  # noqa: BLE001 - a store gone: the reader's own read fails and says so
                        pass
            with _exit_lock:
                checks = list(_exit_marks)
            for check in checks:
                try:
                    check.sweep()
                    check.release()
                except Exception:  # noqa: BLE001 - entries left behind cost a few bytes in the store
                    pass
            if checks and rounds % _ANSWER_EVERY == 0:
                with contextlib.suppress(Exception):  # the store's host gone: no one asks any more
                    self.answer(checks[0])

    def root(self, check: _LiveCheck) -> Any:
        """This thread's connection to the store every group of the job shares (its root)."""
        if self._root is None:
            store = check.store
            while (under := getattr(store, "underlying_store", None)) is not None:
                store = under
            self._root = store.clone()
        return self._root

    def answer(self, check: _LiveCheck) -> None:
        """Answer another rank's question: where this process's calling thread is now, and what
        it waits in (one key per process, in the job's root store)."""
        root = self.root(check)
        ask = _process_key("ask", check.me)
        if not root.check([ask]):
            return
        root.delete_key(ask)
        ident = _caller if _caller is not None else threading.main_thread().ident
        root.set(_process_key("stack", check.me),
                 json.dumps({"stack": thread_stack(ident), "waiting": self.waiting_in(ident)}))


_watcher = _Watcher()
_caller: int | None = None  # the thread that called a collective last: the one other ranks ask about


def _process_key(kind: str, rank: int) -> str:
    # "ask"/"stack": a question to a process and its answer, in the job's root store
    return f"{_KEY}/{kind}/{rank}"


class _LiveCheck:
    """One group's check, on one rank: publish this rank's call, read the others' for the same
    sequence number, raise when they differ or do not come. Sends and receives are compared
    pair by pair: each side publishes its call when it posts it, and reads its peer's when it
    waits for it."""

    def __init__(self, store: Any, me: int, ranks: Sequence[int], timeout: float) -> None:
        self.store = self._store = store
        self.me = me
        self._side: Any = None  # the watcher's own connection: a store client serves one request at a time
        self._me = me
        self._others = [r for r in ranks if r != me]
        self.timeout = timeout
        self._space = _process_space()
        self._pid = os.getpid()
        self._agreed: set[tuple[str | None, int | None]] = set()  # lines whose calls the ranks agreed on
        self._last = 0  # the last sequence number this rank published
        self._spent: list[str] = []  # entries every rank that reads them has read (the watcher deletes them)
        self._channels: dict[tuple[int, int, int], int] = {}  # (source, destination, tag) -> calls posted
        self._held: list[_PostedWork] = []  # sends not given to gloo yet (see hold)
        self._asked: set[str] = set()  # the sends and receives waited for whose peer was asked if it waits too
        self._held_lock = threading.Lock()
        # a held send's receiver side is compared by the watcher (release) and by the send's
        # wait (match), possibly at once: one comparison per ticket, one recorded desync
        self._compare_lock = threading.Lock()
        self._thread: int | None = None  # the thread that called last: the one the others ask about
        self._off = False
        # a group made again under the same name (destroy_process_group, then init_process_group
        # on the same store) must not read the entries its previous life left: each rank counts
        # the lives of this group's name in the store, and every rank makes the same groups
        try:
            self._life = int(store.add(f"{_KEY}/lives/{me}", 1))
        except (RuntimeError, OSError):  # a store without counters: the group runs unchecked
            self._life, self._off = 0, True
        with _exit_lock:
            if not _exit_marks:
                atexit.register(_mark_exit)
            _exit_marks.append(self)

    def _key(self, rank: int, seq: int) -> str:
        return f"{_KEY}/{self._life}/{rank}/{seq}"

    def _p2p_key(self, channel: tuple[int, int, int], n: int, send: bool) -> str:
        source, destination, tag = channel
        return f"{_KEY}/{self._life}/p2p/{source}/{destination}/{tag}/{n}/{'send' if send else 'recv'}"

    def _state_key(self, kind: str, rank: int) -> str:
        # "now": a rank's latest send or receive; "left": how it left
        return f"{_KEY}/{self._life}/{kind}/{rank}"

    def _card(self, info: probes.CollectiveInfo, device: str, peer: int | None) -> dict:
        global _caller
        file, line, function = user_site(3)
        _caller = self._thread = threading.get_ident()
        return {"seq": info.seq, "op": info.op, "shapes": [str(list(s)) for s in info.shapes], "dtype": info.dtype,
                "reduce_op": info.reduce_op, "peer": peer, "file": file, "line": line, "function": function,
                "pid": self._pid, "space": self._space, "device": device, "t": time.time_ns()}

    def _stop(self, exc: BaseException) -> None:
        # without its store a group cannot be checked; gloo still tells a broken group
        self._off = True
        import warnings

        warnings.warn(f"tpu_debug: the live collective check of this process group stopped: its store "
                      f"failed ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=4)

    def check(self, info: probes.CollectiveInfo, device: str = "") -> tuple[int, float] | None:
        """Raise unless every rank of the group calls this collective, alike (``device``: the
        device type of its tensors).

        Returns:
            (the rank that arrived last, seconds this rank waited for it), or None unchecked.

        Raises:
            CollectiveDesyncError: another rank calls another collective here, or ended or died.
            CollectiveTimeoutError: a rank did not call it within the timeout.
        """
        if self._off:
            return None
        mine = self._card(info, device, info.peer)
        file, line = mine["file"], mine["line"]
        seq = info.seq
        store = self._store
        try:
            store.set(self._key(self._me, seq), json.dumps(mine))
            self._last = seq
            _watcher.begin(self, [(r, self._key(r, seq), self._key(r, seq - 1)) for r in self._others], mine)
            try:
                raw = store.multi_get([self._key(r, seq) for r in self._others])
            finally:
                _watcher.end()
            if seq > 2:
                self._spent.append(self._key(self._me, seq - 2))
        except (RuntimeError, OSError) as exc:  # c10d's DistError is a RuntimeError
            self._stop(exc)
            return None
        cards = dict(zip(self._others, (json.loads(v) for v in raw), strict=True))
        calls = [_rank_call(self._me, mine)]
        for r, card in cards.items():
            state = card.get("state", "called")
            calls.append(_rank_call(r, card) if state == "called"
                         else _rank_call(r, card.get("last") or self._previous(r, seq), state, card))
        calls.sort(key=lambda c: c.rank)
        reason = desync.differ(calls)
        site = (file, line)
        if reason is None:
            if len(self._agreed) < 4096:
                self._agreed.add(site)
            arrived = {r: card.get("t", 0) for r, card in cards.items()} | {self._me: mine["t"]}
            last = max(arrived, key=lambda r: arrived[r])
            return last, (arrived[last] - mine["t"]) / 1e9
        cause = desync.cause_of(reason, calls, repeated=site in self._agreed)
        waited = any(c.state == "missing" for c in calls)
        timeout = self.timeout if waited else None
        message = desync.describe(info.group, seq, reason, cause, calls, timeout=timeout)
        if probes.listening("on_collective_desync"):
            probes.collective_desync(probes.DesyncInfo(info.group, tuple(info.ranks), self._me, seq, reason, cause,
                                                       tuple(calls), timeout, message))
        others = tuple(c.rank for c in calls if c.rank != self._me and (c.state != "called" or reason != "missing"))
        error = CollectiveTimeoutError if waited else CollectiveDesyncError
        _dump_on_error(timeout=waited)
        raise error(message, group=info.group, seq=seq, reason=reason, cause=cause, ranks=others)

    def _previous(self, rank: int, seq: int) -> dict | None:
        """``rank``'s entry of collective ``seq - 1`` (its last one, when it has not called ``seq``)."""
        key = self._key(rank, seq - 1)
        if seq > 1 and self._store.check([key]):
            card = json.loads(self._store.get(key))
            return card if card.get("state", "called") == "called" else None
        return None

    # -- sends and receives: each compared with its peer's side ----------------------------

    def post(self, info: probes.CollectiveInfo, device: str, peer: int, tag: int) -> dict | None:
        """Publish this rank's send to, or receive from, global rank ``peer`` (no wait): the
        ticket :meth:`match` reads the peer's side with, when the call is waited for."""
        if self._off:
            return None
        send = info.op == "send"
        channel = (self._me, peer, tag) if send else (peer, self._me, tag)
        n = self._channels[channel] = self._channels.get(channel, 0) + 1
        card = self._card(info, device, peer) | {"n": n, "tag": tag}
        try:
            text = json.dumps(card)
            self._store.set(self._p2p_key(channel, n, send), text)
            self._store.set(self._state_key("now", self._me), text)
        except (RuntimeError, OSError) as exc:
            self._stop(exc)
            return None
        return {"info": info, "card": card, "channel": channel, "n": n, "peer": peer,
                "theirs": self._p2p_key(channel, n, not send)}

    def peek(self, ticket: dict, store: Any = None) -> bool:
        """Whether the peer has posted its side of a send or receive, alike (True: posting to
        gloo is safe), without waiting: False while it has not.

        Raises:
            CollectiveDesyncError: the peer's side has other sizes or dtype.
        """
        store = self._store if store is None else store
        if ticket.get("matched"):
            return True
        try:
            if not store.check([ticket["theirs"]]):
                return False
            card = json.loads(store.get(ticket["theirs"]))
        except (RuntimeError, OSError):
            return False
        if card.get("state", "called") != "called":
            return False  # it left or died: the wait says so
        error = self._compare(ticket, card)
        if error is not None:
            raise error
        ticket["matched"] = True
        self._spent.append(ticket["theirs"])  # its one reader is this rank
        return True

    def match(self, ticket: dict) -> None:
        """Wait for the peer's side of a posted send or receive, and raise unless it matches.

        Raises:
            CollectiveDesyncError: the peer's side has other sizes or dtype, or it left or died.
            CollectiveTimeoutError: the peer did not post its side within the timeout.
        """
        if ticket.get("matched"):
            return
        peer, theirs, mine = ticket["peer"], ticket["theirs"], ticket["card"]
        try:
            _watcher.begin(self, [(peer, theirs, self._state_key("now", peer))], mine)
            try:
                (raw,) = self._store.multi_get([theirs])
            finally:
                _watcher.end()
        except (RuntimeError, OSError) as exc:
            self._stop(exc)
            return
        self._spent.append(theirs)  # its one reader is this rank
        error = self._compare(ticket, json.loads(raw))
        if error is not None:
            raise error
        ticket["matched"] = True

    def _compare(self, ticket: dict, card: dict) -> BaseException | None:
        """The error for a peer's side ``card`` that does not match this rank's (recorded, and
        the Flight Recorder's dump written), or None when it matches."""
        with self._compare_lock:
            if "error" not in ticket:
                ticket["error"] = self._first_compare(ticket, card)
            return ticket["error"]

    def _first_compare(self, ticket: dict, card: dict) -> BaseException | None:
        peer, mine = ticket["peer"], ticket["card"]
        state = card.get("state", "called")
        calls = [_rank_call(self._me, mine),
                 _rank_call(peer, card) if state == "called" else _rank_call(peer, card.get("last"), state, card)]
        calls.sort(key=lambda c: c.rank)
        if state != "called":
            reason = "missing"
        elif card["shapes"] != mine["shapes"]:
            reason = "shapes"
        elif card["dtype"] != mine["dtype"]:
            reason = "dtype"
        else:
            return None
        return self._p2p_error(ticket, reason, calls, cycle=bool(card.get("cycle")))

    def _p2p_error(self, ticket: dict, reason: str, calls: list[desync.RankCall], *, cycle: bool) -> BaseException:
        info, (source, destination, tag) = ticket["info"], ticket["channel"]
        what = desync.p2p_subject(source, destination, tag, ticket["n"])
        cause = desync.cause_of(reason, calls, p2p=True, cycle=cycle)
        # ranks that wait for each other are named as soon as they are seen to: no timeout passed
        waited = any(c.state == "missing" for c in calls) and cause != "p2p_order"
        timeout = self.timeout if waited else None
        message = desync.describe(info.group, info.seq, reason, cause, calls, timeout=timeout, what=what)
        if probes.listening("on_collective_desync"):
            probes.collective_desync(probes.DesyncInfo(info.group, tuple(info.ranks), self._me, info.seq, reason,
                                                       cause, tuple(calls), timeout, message,
                                                       (source, destination, tag, ticket["n"])))
        error = CollectiveTimeoutError if waited else CollectiveDesyncError
        _dump_on_error(timeout=waited)
        return error(message, group=info.group, seq=info.seq, reason=reason, cause=cause, ranks=(ticket["peer"],))

    def hold(self, work: _PostedWork) -> None:
        """A send posted before its receiver's side was seen: gloo gets it once the receiver's
        side is there and matches (a send of another size would abort the receiving process
        inside gloo). The watcher posts it then, or its wait does."""
        with self._held_lock:
            self._held.append(work)
        _watcher.ensure()

    def release(self) -> None:
        """(The watcher) post the held sends whose receivers' sides are there: matching ones to
        gloo, the others failed with the error their wait raises."""
        if not self._held:
            return
        with self._held_lock:
            held, self._held = self._held, []
        waiting = []
        side = self._side_store()
        for work in held:
            try:
                ready = self.peek(work.ticket, side)
            except (CollectiveDesyncError, CollectiveTimeoutError) as exc:
                work.fail(exc)
                continue
            if ready:
                work.start()
            elif not work.done:
                waiting.append(work)
        with self._held_lock:
            self._held = waiting + self._held

    # -- the watcher's side (its own thread and store connection) --------------------------

    def _side_store(self) -> Any:
        if self._side is None:
            self._side = self._store.clone()
        return self._side

    def look(self, targets: list[tuple[int, str, str | None]], *, waited: float) -> None:
        """For each ``(rank, key, key of its last entry)`` whose key is not written yet: write
        how the rank left when it did, "died" when its process is gone, "missing" once the
        timeout has passed (with where it is now, when it answers), or at once for a peer
        that waits to receive from this rank while this rank waits to receive from it (that
        never ends: after :data:`_CYCLE_SECONDS` it is asked); the reader then wakes."""
        side = self._side_store()
        timed_out = waited >= self.timeout
        for rank, key, before in targets:
            if side.check([key]):
                continue
            last = json.loads(side.get(before)) if before is not None and side.check([before]) else None
            last = last if last is not None and last.get("state", "called") == "called" else None
            left = self._state_key("left", rank)
            state: dict | None = json.loads(side.get(left)) if side.check([left]) else None
            if state is None and last is not None and last.get("space") == self._space:
                pid = int(last.get("pid", -1))
                if not _alive(pid):
                    state = {"state": "died", "exit_status": exit_status(pid)}
            if state is None and timed_out:
                state = {"state": "missing", **self._ask(side, rank)}
            elif state is None and waited >= _CYCLE_SECONDS and "/p2p/" in key and key not in self._asked:
                self._asked.add(key)
                answer = self._ask(side, rank)
                state = {"state": "missing", **answer} if answer.get("cycle") else None
            if state is not None:
                side.compare_set(key, "", json.dumps({"seq": None, **state, "last": last}))

    def _ask(self, side: Any, rank: int) -> dict:
        """Where ``rank`` is now, from its own watcher: ``{"stack": [...], "cycle": bool}``
        (``cycle``: it waits to receive from this rank), or {} when it does not answer in time.
        While it waits for the answer it answers this process's own question: two ranks that
        wait for each other ask each other at once."""
        root = _watcher.root(self)
        answer = _process_key("stack", rank)
        try:
            root.delete_key(answer)
            root.set(_process_key("ask", rank), str(self._me))
            deadline = time.monotonic() + _ANSWER_SECONDS
            while not root.check([answer]):
                if time.monotonic() > deadline:
                    return {}  # no answer: a process stuck outside Python, or gone
                _watcher.answer(self)
                time.sleep(_LOOK_SECONDS / 2)
            got = json.loads(root.get(answer))
        except (RuntimeError, OSError, ValueError):
            return {}
        waiting = got.get("waiting") or {}
        cycle = False
        if waiting.get("op") == "recv" and waiting.get("peer") == self._me:
            # it waits for a send of this rank that this rank has not posted: neither goes on
            mine = self._p2p_key((self._me, rank, int(waiting.get("tag", 0))), int(waiting.get("n", 1)), True)
            cycle = not side.check([mine])
        if cycle:
            # it waits for this rank's send, as this rank waits for its: say so on its side too
            # (it may be past its own question by the time it would ask)
            ident = self._thread if self._thread is not None else threading.main_thread().ident
            side.compare_set(mine, "", json.dumps(
                {"seq": None, "state": "missing", "cycle": True, "stack": thread_stack(ident),
                 "last": _watcher.waiting_in(ident)}))
        return {"stack": got.get("stack", []), "cycle": cycle}

    def sweep(self) -> None:
        """Delete the entries every rank that reads them has read."""
        spent, self._spent = self._spent, []
        if spent:
            side = self._side_store()
            for key in spent:
                side.delete_key(key)

    def leave(self) -> None:
        """At exit: tell ranks that wait for this one at its next collective, or for a send or
        receive of it, that it left, and how (with the exception that ended it, if one did)."""
        try:
            side = self._side if self._side is not None else self._store
            how = json.dumps({"seq": self._last + 1, **leaving()})
            side.set(self._state_key("left", self._me), how)
            side.compare_set(self._key(self._me, self._last + 1), "", how)
        except Exception:  # noqa: BLE001 - the store's host may have gone first; nothing waits then
            pass


# set while a compiled program's collective runs (runtime/distributed/compiled_collectives.py):
# its tensors are the host copies of the program's tpu arrays
_program = threading.local()


@contextlib.contextmanager
def for_program(device: str) -> Iterator[None]:
    """Collectives called inside run for a program on ``device``: the live check names that
    device, not the host copies' CPU."""
    prior = getattr(_program, "device", None)
    _program.device = device
    try:
        yield
    finally:
        _program.device = prior


class _Finish:
    """What a call does once it returned: its return reported (with the rank the others
    waited for, and how long), its Flight Recorder entry completed."""

    __slots__ = ("began", "entry", "group", "name", "seq")

    def __init__(self, group: TpuProcessGroup, name: str, seq: int, began: float | None, entry: dict | None) -> None:
        self.group, self.name, self.seq, self.began, self.entry = group, name, seq, began, entry

    def __call__(self, arrival: tuple[int, float] | None = None) -> None:
        if self.entry is not None and flight_recorder.recorder is not None:
            flight_recorder.recorder.completed(self.entry)
        if self.began is not None:
            last, waited = arrival if arrival is not None else (None, None)
            probes.collective_done(probes.CollectiveDone(
                self.name, self.group._group_name(), self.group._rank, self.seq, time.perf_counter() - self.began,
                last, waited,
            ))


class _PostedWork(dist.Work):
    """A send or receive posted to gloo: like gloo's own, it finishes when waited for. The
    wait first reads the peer's side from the live check (a peer that posts another size,
    left or died, or does not post in time is named), then waits for gloo and writes a
    received tensor back to its device. A send reaches gloo only once the receiver's side
    matches it (:meth:`_LiveCheck.hold`): ``post`` gives it to gloo."""

    def __init__(self, post: Callable[[], Any], copies: list[tuple[torch.Tensor, torch.Tensor]],
                 outputs: list[torch.Tensor], ticket: dict | None, check: _LiveCheck | None, finish: _Finish) -> None:
        super().__init__()
        self._post = post
        self._host_work: Any = None
        self._copies = copies
        self._outputs = outputs
        self.ticket = ticket
        self._check = check
        self._finish = finish
        self._error: BaseException | None = None
        self.done = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Give the call to gloo (once)."""
        with self._lock:
            if self._host_work is None:
                self._host_work = self._post()

    def fail(self, error: BaseException) -> None:
        """The peer's side does not match: the wait raises ``error``."""
        self._error = error

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.done:
            return True
        if self._error is not None:
            raise self._error
        if self.ticket is not None and self._check is not None:
            self._check.match(self.ticket)
        self.start()
        self._host_work.wait()
        with self._lock:
            if not self.done:
                _write_back([(d, h) for d, h in self._copies if any(d is o for o in self._outputs)])
                self.done = True
                self._finish()
        return True

    def is_completed(self) -> bool:
        if not self.done and self._host_work is not None and self._host_work.is_completed():
            self.wait()
        return self.done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        # a future of a posted call completes at its wait: waited for here
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


class TpuProcessGroup(dist.ProcessGroup):
    """A c10d process group for `tpu` tensors (and CPU ones) over a gloo group on the host.

    Made by ``torch.distributed`` for the backends ``tpu`` and ``tpu_dist``; not built by hand.
    """

    def __init__(self, host_group: dist.ProcessGroup, rank: int, size: int, name: str,
                 global_ranks: Sequence[int] = (), store: Any = None) -> None:
        super().__init__(rank, size)
        self._global_ranks = tuple(int(r) for r in global_ranks) or tuple(range(size))
        self._check = None
        if store is not None and size > 1 and config.collective_check:
            self._check = _LiveCheck(store, self._global_ranks[rank], self._global_ranks, config.collective_timeout)
        self._seq = 0
        self._p2p_seq = 0
        flight_recorder.configure(self._global_ranks[rank])
        # c10d keeps a group's name (and its sequence numbers) in its backends: the host
        # group's gloo backend is this group's CPU backend too
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                               host_group._get_backend(torch.device("cpu")))
        self._host = host_group
        self._rank = rank
        self._size = size
        self._backend_name = name

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return self._backend_name

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self._rank}, size={self._size}, backend={self._backend_name!r})"

    # -- the one path every collective takes ------------------------------------------------

    def _run(self, name: str, args: tuple, outputs: int | None = 0, reduce_op: Any = None) -> dist.Work:
        """Run host group method ``name`` on host copies of ``args``; write argument ``outputs``
        back into its device tensors. A send or receive is posted and returns at once, as on
        gloo: its work finishes it when waited for."""
        kind, factor = _reduce_kind(reduce_op)
        in_place = name.startswith("allreduce")
        device = self._device_of(name, args)
        if kind is not None:
            _check_reduce(kind, _flat(args[0 if in_place else 1]))
        p2p = name in P2P_OPS
        if p2p:  # counted apart, as c10d does: the peers' sequences differ by design
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        entry = self._flight_record(name, args, p2p) if flight_recorder.recorder is not None else None
        # read only while a probe listens: with none, a collective reads no clock
        began = time.perf_counter() if probes.listening("on_collective_done") else None
        arrival = ticket = None
        if self._check is not None and not p2p:
            # recorded first, so a rank that raises below has recorded the collective it stopped at
            info = self._info(name, args, kind)
            if probes.listening("on_collective"):
                probes.collective(info)
            arrival = self._check.check(info, device)
        elif probes.listening("on_collective"):
            probes.collective(self._info(name, args, kind))
        if self._check is not None and name in ("send", "recv"):
            ticket = self._check.post(self._info(name, args, kind), device, self._global_ranks[int(args[1])],
                                      int(args[2]))
        if entry is not None:
            flight_recorder.recorder.started(entry)
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        # the host copies are the engine's, reported as the collective: no transfer events.
        # The write-back below is reported (divergence tracing keeps its CPU shadow by it)
        with probes.quiet():
            host_args = [_to_host(a, copies) for a in args]
        if kind == _RedOp.PREMUL_SUM:
            if in_place:
                for t in _flat(host_args[0]):
                    t.mul_(factor)
            else:  # the inputs are the caller's (CPU ones are not copies): scale new tensors
                host_args[1] = _scaled(host_args[1], factor)
        wanted = [] if outputs is None else _flat(args[outputs])
        done = _Finish(self, name, seq, began, entry)
        if p2p:
            # a receive is given to gloo at once; a send once its receiver's side is seen to match
            ready = ticket is None or self._check is None or self._check.peek(ticket) or name != "send"
            work = _PostedWork(functools.partial(getattr(self._host, name), *host_args), copies, wanted, ticket,
                               self._check, done)
            if ready:
                work.start()
            else:
                self._check.hold(work)
            return work
        self._host_call(name, host_args)
        if kind == _RedOp.AVG:
            for t in _flat(host_args[0]):
                t.div_(self._size)
        if outputs is not None:
            _write_back([(d, h) for d, h in copies if any(d is o for o in wanted)])
        done(arrival)
        return _DoneWork(wanted)

    def _flight_record(self, name: str, args: tuple, p2p: bool) -> dict:
        """The Flight Recorder's entry of this call (scheduled)."""
        if name.startswith(("allreduce", "broadcast", "reduce")) and not name.startswith("reduce_scatter"):
            ins = outs = _flat(args[0])  # in place
        elif name == "send":
            ins, outs = _flat(args[0]), []
        elif name.startswith("recv"):
            ins, outs = [], _flat(args[0])
        elif name == "barrier":
            ins = outs = []
        else:
            outs, ins = _flat(args[0]), _flat(args[1])
        op = FLIGHT_RECORDER_NAMES[name]
        if name in ("send", "recv"):
            op += f" {self._rank}->{int(args[1])}" if name == "send" else f" {self._rank}<-{int(args[1])}"
        try:
            desc = self.group_desc
        except (AttributeError, RuntimeError):
            desc = "undefined"
        timeout_ms = int(self._check.timeout * 1000) if self._check is not None else 0
        return flight_recorder.recorder.record(
            (self._group_name(), desc or "undefined", self._global_ranks), op, (self._seq, self._p2p_seq, p2p),
            ([list(t.shape) for t in ins], [list(t.shape) for t in outs]),
            ([flight_recorder.dtype_name(t.dtype) for t in ins], [flight_recorder.dtype_name(t.dtype) for t in outs]),
            timeout_ms,
        )

    def _device_of(self, name: str, args: tuple) -> str:
        """The device type of the call's tensors (``"tpu"`` when any is, else ``"cpu"``).

        Raises:
            CollectiveDeviceError: a tensor is on a device the host engine cannot copy from.
        """
        device = ""
        for t in (t for a in args for t in _flat(a)):
            kind = t.device.type
            if kind not in ("tpu", "cpu"):
                hint = (" (a meta tensor has no data: create the module's parameters on tpu first, e.g. "
                        "model.to_empty(device=\"tpu\"))" if kind == "meta" else "")
                raise CollectiveDeviceError(
                    f"rank {self._global_ranks[self._rank]}: {name} got a tensor on {t.device}: the tpu process "
                    f"group runs collectives on tpu tensors (and CPU ones); move it with .to(\"tpu\"){hint}"
                )
            if device != "tpu":
                device = kind
        # a compiled program's collective runs on host copies of its tpu tensors
        return "tpu" if device == "cpu" and getattr(_program, "device", None) == "tpu" else device

    def _info(self, name: str, args: tuple, kind: Any) -> probes.CollectiveInfo:
        tensors = [t for a in args for t in _flat(a)]
        peer = None
        if name in ("send", "recv"):
            peer = int(args[1])
        elif hasattr(args[-1], "rootRank"):
            peer = int(args[-1].rootRank)
        return probes.CollectiveInfo(
            op=name,
            group=self._group_name(),
            ranks=self._global_ranks,
            rank=self._rank,
            seq=self._p2p_seq if name in P2P_OPS else self._seq,
            shapes=tuple(tuple(t.shape) for t in tensors),
            dtype=",".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors})),
            nbytes=sum(t.numel() * t.element_size() for t in tensors),
            reduce_op=None if kind is None else kind.name,
            peer=peer,
        )

    def _group_name(self) -> str:
        try:
            return self.group_name
        except RuntimeError:  # while c10d is still naming the group
            return "?"

    def _host_call(self, name: str, host_args: list) -> None:
        work = getattr(self._host, name)(*host_args)
        if work is not None:
            work.wait()

    # -- c10d's ProcessGroup methods ----------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = _options(opts, _c10d.AllreduceOptions)
        return self._run("allreduce", (tensors, _as_sum(opts, _c10d.AllreduceOptions)), reduce_op=opts.reduceOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _options(opts, _c10d.AllreduceCoalescedOptions)
        return self._run("allreduce_coalesced", (tensors, _as_sum(opts, _c10d.AllreduceCoalescedOptions)),
                         reduce_op=opts.reduceOp)

    def broadcast(self, tensors, opts=None):
        return self._run("broadcast", (tensors, _options(opts, _c10d.BroadcastOptions)))

    def reduce(self, tensors, opts=None):
        opts = _options(opts, _c10d.ReduceOptions)
        _check_reduce(opts.reduceOp, _flat(tensors))
        return self._run("reduce", (tensors, opts))

    def allgather(self, output_lists, inputs, opts=None):
        return self._run("allgather", (output_lists, inputs, _options(opts, _c10d.AllgatherOptions)))

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self._run("allgather_coalesced", (output_lists, inputs, _options(opts, _c10d.AllgatherOptions)))

    def all_gather_single(self, output, input, opts=None):
        return self._run("all_gather_single", (output, input, _options(opts, _c10d.AllgatherOptions)))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._run("all_gather_single_coalesced", (outputs, inputs, _options(opts, _c10d.AllgatherOptions)))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._reduce_scatter("reduce_scatter", outputs, input_lists, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter("reduce_scatter_single", output, input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter("reduce_scatter_single_coalesced", outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter(self, name: str, outputs, inputs, opts) -> dist.Work:
        opts = _options(opts, _c10d.ReduceScatterOptions)
        return self._run(name, (outputs, inputs, _as_sum(opts, _c10d.ReduceScatterOptions)),
                         reduce_op=opts.reduceOp)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return self._run("alltoall_base", (output, input, list(output_splits or []), list(input_splits or []),
                                           _options(opts, _c10d.AllToAllOptions)))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        return self._run("alltoall", (outputs, inputs, _options(opts, _c10d.AllToAllOptions)))

    def gather(self, output_lists, inputs, opts=None):
        return self._run("gather", (output_lists, inputs, _options(opts, _c10d.GatherOptions)))

    def scatter(self, outputs, input_lists, opts=None):
        return self._run("scatter", (outputs, input_lists, _options(opts, _c10d.ScatterOptions)))

    def barrier(self, opts=None):
        # a barrier of the host group: it has no device to choose
        barrier_opts = _c10d.BarrierOptions()
        barrier_opts.device = torch.device("cpu")
        return self._run("barrier", (barrier_opts,), outputs=None)

    def send(self, tensors, dst, tag=0):
        return self._run("send", (tensors, dst, tag), outputs=None)

    def recv(self, tensors, src, tag=0):
        return self._run("recv", (tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        return self._run("recv_anysource", (tensors, tag))


# c10d's entry points run eagerly inside compiled code (DDP's forward broadcasts its buffers,
# dist.* calls from a compiled function): dynamo must call them, not trace into them
for _name, _fn in list(vars(TpuProcessGroup).items()):
    if callable(_fn) and not _name.startswith("__") and _name not in ("_info", "_host_call"):
        setattr(TpuProcessGroup, _name, probes.hidden_from_dynamo(_fn))
del _name, _fn


def _options(opts: Any, cls: type) -> Any:
    return cls() if opts is None else opts


def _reduce_kind(reduce_op: Any) -> tuple[Any, float]:
    """(the reduce op's kind, its PREMUL_SUM factor); (None, 1.0) for a collective with none."""
    if reduce_op is None:
        return None, 1.0
    if isinstance(reduce_op, _RedOp):
        return reduce_op, 1.0
    factor = getattr(reduce_op, "factor", None) if reduce_op.op == _RedOp.PREMUL_SUM else None
    return reduce_op.op, float(factor) if factor is not None else 1.0


def _as_sum(opts: Any, cls: type) -> Any:
    """``opts`` for gloo: AVG and PREMUL_SUM become SUM (the rest of each is done on the host copies)."""
    kind, _ = _reduce_kind(opts.reduceOp)
    if kind not in _FLOAT_ONLY:
        return opts
    summed = cls()
    for field in ("timeout", "asyncOp"):
        if hasattr(opts, field):
            setattr(summed, field, getattr(opts, field))
    summed.reduceOp = dist.ReduceOp.SUM
    return summed


def _host_group(store: Any, rank: int, size: int, timeout: datetime.timedelta, group_name: str,
                global_ranks: Sequence[int]) -> dist.ProcessGroup:
    """A gloo process group on ``store``, as ``init_process_group("gloo")`` would build it."""
    gloo = ProcessGroupGloo(store, rank, size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(global_ranks)
    gloo.options.group_name = group_name
    gloo._set_sequence_number_for_group()
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return group


def _creator(name: str) -> Callable[[Any, Any], TpuProcessGroup]:
    def create(opts: Any, backend_options: Any = None) -> TpuProcessGroup:
        host = _host_group(opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.group_id,
                           opts.global_ranks_in_group)
        return TpuProcessGroup(host, opts.group_rank, opts.group_size, name, opts.global_ranks_in_group,
                               store=opts.store)

    create.__name__ = f"create_{name}_process_group"
    return create


def _this_rank(explicit: Any = None) -> str:
    if explicit in (None, -1):
        try:
            explicit = read_rank_env().rank
        except ConfigError:  # naming the rank in another error: a bad RANK is not that error
            explicit = None
    return f"rank {explicit}" if explicit is not None else "this process"


def _guard_init(init: Callable) -> Callable:
    """``init_process_group`` that names a backend the `tpu` device cannot use, and the fix,
    in one line (torch says "Unknown backend type", or fails deep in NCCL)."""

    @functools.wraps(init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            # no backend asks for the accelerator's, as on TorchTPU: the device's tpu_dist (which
            # runs CPU tensors too, through gloo), and its sub-groups the same; "gloo" keeps CPU's
            if backend is None or any(name in str(backend).lower().replace(":", ",").split(",")
                                      for name in BACKEND_NAMES):
                accelerator.claim()
            return init(backend, *args, **kwargs)
        except (AssertionError, RuntimeError, ValueError) as exc:
            if "Unknown backend type" in str(exc):
                why = "torch.distributed has no backend of that name"
            elif str(backend).lower() == "nccl" and not torch.cuda.is_available():
                why = "NCCL runs on CUDA GPUs, and this machine has none"
            else:
                raise
            raise LaunchError(
                f"{_this_rank(kwargs.get('rank'))}: init_process_group(backend={backend!r}): {why}. On the tpu "
                "device give \"tpu_dist\" or \"tpu\" (TorchTPU's backends), or no backend: init_process_group() "
                "picks tpu_dist; \"gloo\" is CPU's."
            ) from None

    init_process_group._tpu_debug_guard = True  # type: ignore[attr-defined]
    return init_process_group


def _guard_mesh() -> None:
    """``init_device_mesh`` that says, for a mesh bigger than the job, what to launch."""
    module = sys.modules["torch.distributed.device_mesh"]
    init = getattr(module, "init_device_mesh", None)
    if init is None or getattr(init, "_tpu_debug_guard", False):
        return

    @functools.wraps(init)
    def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        if device_type == "tpu":
            accelerator.claim()
        try:
            return init(device_type, mesh_shape, *args, **kwargs)
        except RuntimeError as exc:
            if "Mesh should not be bigger than default world size" not in str(exc):
                raise
            world, need = dist.get_world_size(), math.prod(mesh_shape)
            raise MeshError(
                f"{_this_rank(dist.get_rank())}: init_device_mesh({device_type!r}, {tuple(mesh_shape)}) needs "
                f"{need} ranks, and the job has {world}: start {need} processes (torchrun --nproc-per-node "
                f"{need}), or give a mesh shape whose sizes multiply to {world}"
            ) from None

    init_device_mesh._tpu_debug_guard = True  # type: ignore[attr-defined]
    module.init_device_mesh = init_device_mesh


def register_backends() -> None:
    """Register the c10d backends ``tpu`` and ``tpu_dist`` for the `tpu` device, once, and make
    ``tpu_dist`` its default (``init_process_group()`` with no backend on `tpu`)."""
    global _registered
    with _lock:
        if _registered:
            return
        for name in BACKEND_NAMES:
            if name.upper() not in dist.Backend._plugins:
                dist.Backend.register_backend(name, _creator(name), extended_api=True, devices=["tpu", "cpu"])
        # register_backend gives a device to the first backend that claims it: CPU stays
        # gloo's, and tpu gets TorchTPU's default even when "tpu" was registered first
        dist.Backend.default_device_backend_map["tpu"] = DEFAULT_BACKEND
        for module in (dist, sys.modules["torch.distributed.distributed_c10d"]):
            if not getattr(module.init_process_group, "_tpu_debug_guard", False):
                module.init_process_group = _guard_init(module.init_process_group)
        when_imported("torch.distributed.device_mesh", _guard_mesh)
        _name_tpu_tensors_on_other_groups()
        _registered = True


def _name_tpu_tensors_on_other_groups() -> None:
    """A `tpu` tensor given to a group of another backend (``init_process_group("gloo")``)
    raises one line naming the fix, not c10d's "No backend type associated with device type
    tpu". PyTorch's c10d ops reach their PrivateUse1 kernels only for such groups: the `tpu`
    process group runs its collectives in its own methods."""
    lib = torch.library.Library("c10d", "IMPL")
    ops = [n.removeprefix("c10d::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("c10d::")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replacing c10d's PrivateUse1 kernels is the point
        for op in ops:
            if "PrivateUse1: registered" in torch._C._dispatch_dump(f"c10d::{op}"):
                lib.impl(op, _on_other_group(op.strip("_")), "PrivateUse1")
    _libraries.append(lib)


_libraries: list[Any] = []  # kept alive: a Library's kernels go with it


def _on_other_group(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        group = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        try:
            backend = dist.ProcessGroup.unbox(group).name() if group is not None else "another"
        except (RuntimeError, TypeError, AttributeError):
            backend = "another"
        raise CollectiveDeviceError(
            f"{_this_rank()}: {name} got a tpu tensor on a process group of backend {backend!r}, which has none "
            f"for the tpu device ({backend} runs CPU tensors): make the group for tpu tensors with "
            "init_process_group() or init_process_group(\"tpu_dist\") (gloo runs underneath, on host copies), "
            f"or move the tensors to the CPU (.cpu()) for this {backend} group"
        )

    refuse.__name__ = f"{name}_on_a_group_without_tpu"
    return refuse
