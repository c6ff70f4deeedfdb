"""The live check: before a collective enters gloo, each rank checks that the others of its
group call the same one (see "Hangs and desyncs" in docs/distributed.md).

It publishes what it is about to call (op, sizes, dtype, reduction, root, its user's line)
in the group's c10d store and reads the others' entries for the same sequence number.
Another collective, other sizes, a rank that ended or died, or one that does not arrive
within ``TPU_DEBUG_COLLECTIVE_TIMEOUT`` seconds raise :class:`CollectiveDesyncError` /
:class:`CollectiveTimeoutError` on every rank that sees it, naming each rank's call and line
and the fix by cause, instead of gloo's 30-minute wait.

The entries live in the group's own store (c10d prefixes it with the group's name), one key
per rank and sequence number. A rank publishes its entry (a store write without a reply) and
reads the others' with one multi_get, which the store answers once they all exist: no
polling. Its own entry of two collectives back is then of no further use: every other rank
has read it (each has published the previous collective, after reading this rank's entries
before it); the watcher thread (:mod:`.rank_watcher`) deletes such entries, off the
collective's path, so the store holds a few entries per rank and group however long the job
runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

from tpu_debug.core.records import CollectiveInfo, DesyncInfo
from tpu_debug.core import desync
from tpu_debug.core.collective_kinds import SENDS
from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed import flight_recorder
from tpu_debug.runtime.distributed.c10d.rank_watcher import KEY, process_space, tell_at_exit, watcher
from tpu_debug.runtime.distributed.errors import CollectiveDesyncError, CollectiveTimeoutError
from tpu_debug.runtime.distributed.rank_state import leaving, user_site

__all__ = ["HeldSend", "LiveCheck"]


class HeldSend(Protocol):
    """A send posted before its receiver's side was seen (``work.PostedWork``)."""

    ticket: dict
    done: bool

    def start(self) -> None: ...
    def fail(self, error: BaseException) -> None: ...


def _dump_on_error(*, timeout: bool) -> None:
    """A check raises: write the Flight Recorder's dump when it records and is asked to."""
    if flight_recorder.recorder is not None:
        flight_recorder.recorder.dump_on_error(timeout=timeout)


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


class LiveCheck:
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
        self.space = process_space()
        self._pid = os.getpid()
        self._agreed: set[tuple[str | None, int | None]] = set()  # lines whose calls the ranks agreed on
        self._last = 0  # the last sequence number this rank published
        self._spent: list[str] = []  # entries every rank that reads them has read (the watcher deletes them)
        self._channels: dict[tuple[int, int, int], int] = {}  # (source, destination, tag) -> calls posted
        self._held: list[HeldSend] = []  # sends not given to gloo yet (see hold)
        self.asked: set[str] = set()  # the sends and receives waited for whose peer was asked if it waits too
        self._held_lock = threading.Lock()
        # a held send's receiver side is compared by the watcher (release) and by the send's
        # wait (match), possibly at once: one comparison per ticket, one recorded desync
        self._compare_lock = threading.Lock()
        self.thread: int | None = None  # the thread that called last: the one the others ask about
        self._off = False
        # a group made again under the same name (destroy_process_group, then init_process_group
        # on the same store) must not read the entries its previous life left: each rank counts
        # the lives of this group's name in the store, and every rank makes the same groups
        try:
            self._life = int(store.add(f"{KEY}/lives/{me}", 1))
        except (RuntimeError, OSError):  # a store without counters: the group runs unchecked
            self._life, self._off = 0, True
        tell_at_exit(self)

    def _key(self, rank: int, seq: int) -> str:
        return f"{KEY}/{self._life}/{rank}/{seq}"

    def p2p_key(self, channel: tuple[int, int, int], n: int, send: bool) -> str:
        source, destination, tag = channel
        return f"{KEY}/{self._life}/p2p/{source}/{destination}/{tag}/{n}/{'send' if send else 'recv'}"

    def state_key(self, kind: str, rank: int) -> str:
        # "now": a rank's latest send or receive; "left": how it left
        return f"{KEY}/{self._life}/{kind}/{rank}"

    def _card(self, info: CollectiveInfo, device: str, peer: int | None) -> dict:
        file, line, function = user_site(3)
        watcher.caller = self.thread = threading.get_ident()
        return {"seq": info.seq, "op": info.op, "shapes": [str(list(s)) for s in info.shapes], "dtype": info.dtype,
                "reduce_op": info.reduce_op, "peer": peer, "file": file, "line": line, "function": function,
                "pid": self._pid, "space": self.space, "device": device, "t": time.time_ns()}

    def _stop(self, exc: BaseException) -> None:
        # without its store a group cannot be checked; gloo still tells a broken group
        self._off = True
        warnings.warn(f"tpu_debug: the live collective check of this process group stopped: its store "
                      f"failed ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=4)

    def check(self, info: CollectiveInfo, device: str = "") -> tuple[int, float] | None:
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
            watcher.begin(self, [(r, self._key(r, seq), self._key(r, seq - 1)) for r in self._others], mine)
            try:
                raw = store.multi_get([self._key(r, seq) for r in self._others])
            finally:
                watcher.end()
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
            probes.collective_desync(DesyncInfo(info.group, tuple(info.ranks), self._me, seq, reason, cause,
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

    def post(self, info: CollectiveInfo, device: str, peer: int, tag: int) -> dict | None:
        """Publish this rank's send to, or receive from, global rank ``peer`` (no wait): the
        ticket :meth:`match` reads the peer's side with, when the call is waited for."""
        if self._off:
            return None
        send = info.op in SENDS
        channel = (self._me, peer, tag) if send else (peer, self._me, tag)
        n = self._channels[channel] = self._channels.get(channel, 0) + 1
        card = self._card(info, device, peer) | {"n": n, "tag": tag}
        try:
            text = json.dumps(card)
            self._store.set(self.p2p_key(channel, n, send), text)
            self._store.set(self.state_key("now", self._me), text)
        except (RuntimeError, OSError) as exc:
            self._stop(exc)
            return None
        return {"info": info, "card": card, "channel": channel, "n": n, "peer": peer,
                "theirs": self.p2p_key(channel, n, not send)}

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
            watcher.begin(self, [(peer, theirs, self.state_key("now", peer))], mine)
            try:
                (raw,) = self._store.multi_get([theirs])
            finally:
                watcher.end()
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
            probes.collective_desync(DesyncInfo(info.group, tuple(info.ranks), self._me, info.seq, reason,
                                                       cause, tuple(calls), timeout, message,
                                                       (source, destination, tag, ticket["n"])))
        error = CollectiveTimeoutError if waited else CollectiveDesyncError
        _dump_on_error(timeout=waited)
        return error(message, group=info.group, seq=info.seq, reason=reason, cause=cause, ranks=(ticket["peer"],))

    def hold(self, work: HeldSend) -> None:
        """A send posted before its receiver's side was seen: gloo gets it once the receiver's
        side is there and matches (a send of another size would abort the receiving process
        inside gloo). The watcher posts it then, or its wait does."""
        with self._held_lock:
            self._held.append(work)
        watcher.ensure()

    def release(self) -> None:
        """(The watcher) post the held sends whose receivers' sides are there: matching ones to
        gloo, the others failed with the error their wait raises."""
        if not self._held:
            return
        with self._held_lock:
            held, self._held = self._held, []
        waiting = []
        side = self.side_store()
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

    def side_store(self) -> Any:
        if self._side is None:
            self._side = self._store.clone()
        return self._side

    def sweep(self) -> None:
        """Delete the entries every rank that reads them has read."""
        spent, self._spent = self._spent, []
        if spent:
            side = self.side_store()
            for key in spent:
                side.delete_key(key)

    def leave(self) -> None:
        """At exit: tell ranks that wait for this one at its next collective, or for a send or
        receive of it, that it left, and how (with the exception that ended it, if one did)."""
        with contextlib.suppress(Exception):  # the store's host may have gone first; nothing waits then
            side = self._side if self._side is not None else self._store
            how = json.dumps({"seq": self._last + 1, **leaving()})
            side.set(self.state_key("left", self._me), how)
            side.compare_set(self._key(self._me, self._last + 1), "", how)

