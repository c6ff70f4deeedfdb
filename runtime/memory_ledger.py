"""Live device memory: the payloads `tpu` tensors hold, their bytes, while a probe listens.

A `tpu` tensor's data is a payload on its storage (``runtime/tensor.py``). While
a probe with ``on_alloc`` or ``on_free`` is subscribed, a :class:`Ledger` keeps
a weak registry of the storages holding payloads and tells the probes each
change (``probes.allocated``/``probes.freed``); with no such probe, setting a
payload costs one test of a module global and nothing is registered.

What a device holds is buffers, not storages: two storages can hold one
payload (a compiled graph returns an input it passed through, saved for
backward, as a tensor of its own; ``UntypedStorage.clone`` shares the immutable
payload until a write replaces it). Each payload's bytes are charged to one
storage holding it, its owner (the first); when the owner goes while another
storage still holds the payload, the charge moves to that one. A write that
replaces the whole payload of a storage that alone holds it (every in-place op)
keeps the charge where it is, so probes hear nothing of it.

The storages' weak-reference callbacks run wherever the last reference goes (any
thread, inside a garbage collection, inside another change): they only queue the
storage, and the ledger applies the queue before its next change and when
:func:`drain` is called (a probe reading live bytes at a step boundary).
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import threading
import weakref
from typing import Any

import numpy as np

from tpu_debug.core.hooks import deliver
from tpu_debug.runtime import probes, tensor
from tpu_debug.core.records import AllocInfo, FreeInfo, LoweredNode

__all__ = ["Ledger", "active", "counting", "drain", "listen", "live_bytes", "made_by", "replay", "stop_counting"]


class _Buffer:
    """One payload object and the storages holding it (``holders[0]`` is charged)."""

    __slots__ = ("key", "ref", "nbytes", "holders")

    def __init__(self, payload: Any, nbytes: int) -> None:
        self.key = id(payload)
        self.ref = _weak(payload)
        self.nbytes = nbytes
        self.holders: list[_Holder] = []

    def holds(self, payload: Any) -> bool:
        return self.ref is not None and self.ref() is payload


class _Holder:
    """One storage: its serial id (probes know storages by it), weak reference, buffer."""

    __slots__ = ("sid", "key", "ref", "buffer")

    def __init__(self, sid: int, key: int, ref: weakref.ref) -> None:
        self.sid = sid
        self.key = key  # id() of the storage, while it lives
        self.ref = ref
        self.buffer: _Buffer | None = None


def _weak(payload: Any) -> weakref.ref | None:
    try:
        return weakref.ref(payload)
    except TypeError:  # a payload type without weak references: never shared
        return None


@functools.cache
def _dtype_facts(dtype: Any) -> tuple[int, str]:
    # np.dtype() and its name cost microseconds, paid at every payload set while tracking
    numpy_dtype = np.dtype(dtype)
    return numpy_dtype.itemsize, str(numpy_dtype)


def _nbytes(payload: Any) -> int:
    return int(payload.size) * _dtype_facts(payload.dtype)[0]


def _describe(payload: Any) -> tuple[tuple[int, ...], str]:
    shape = getattr(payload, "logical", None) or payload.shape  # an unwritten storage's tensor shape
    return tuple(int(d) for d in shape), _dtype_facts(payload.dtype)[1]


class Ledger:
    """Storages holding payloads, and the bytes charged to each (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, _Holder] = {}  # id(storage) -> its holder
        self._holders: dict[int, _Holder] = {}  # serial id -> holder
        self._buffers: dict[int, _Buffer] = {}  # id(payload) -> buffer
        self._dead: collections.deque[int] = collections.deque()  # serial ids of storages gone
        self._sids = itertools.count(1)
        self.live_bytes = 0
        # what an allocator counts (torch.accelerator's statistics): the most held at once, and
        # the bytes that came and went; a charge moving between holders of one payload is neither
        self.peak_bytes = 0
        self.allocated_bytes = 0
        self.freed_bytes = 0

    def _charge(self, delta: int) -> None:
        self.live_bytes += delta
        if delta > 0:
            self.allocated_bytes += delta
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        else:
            self.freed_bytes -= delta

    # -- changes ---------------------------------------------------------------------

    def note(self, storage: Any, payload: Any, existing: bool = False) -> None:
        """``storage`` now holds ``payload`` (the runtime calls this after setting it)."""
        if probes._quiet and threading.get_ident() in probes._quiet:
            return  # a probe's own device work: not the program's memory
        with self._lock:
            if self._dead:
                self._drain()
            holder = self._by_id.get(id(storage))
            if holder is not None and holder.ref() is not storage:
                # the id of a storage that went without its callback applied yet: apply it now
                self._holders.pop(holder.sid, None)
                if holder.buffer is not None:
                    self._leave(holder, holder.buffer, dead=True)
                holder = None
            buffer = self._buffers.get(id(payload))
            if buffer is not None and not buffer.holds(payload):
                buffer = None  # an id reused by a new payload: the old entry is stale
            if holder is None:
                self._new_holder(storage, payload, buffer, existing)
                return
            old = holder.buffer
            if old is buffer:
                return
            if buffer is None and len(old.holders) == 1:
                self._rekey(holder, old, payload)  # the storage's own payload, replaced
                return
            self._leave(holder, old, dead=False)
            self._join(holder, payload, buffer, new=False, existing=False)

    def _new_holder(self, storage: Any, payload: Any, buffer: _Buffer | None, existing: bool) -> None:
        sid = next(self._sids)
        holder = _Holder(sid, id(storage), weakref.ref(storage, functools.partial(_queue, self._dead, sid)))
        self._by_id[id(storage)] = holder
        self._holders[sid] = holder
        self._join(holder, payload, buffer, new=True, existing=existing)

    def _join(self, holder: _Holder, payload: Any, buffer: _Buffer | None, *, new: bool, existing: bool) -> None:
        charged = 0
        if buffer is None:
            buffer = _Buffer(payload, _nbytes(payload))
            self._buffers[buffer.key] = buffer
            self._charge(buffer.nbytes)
            charged = buffer.nbytes
        buffer.holders.append(holder)
        holder.buffer = buffer
        # (torch.accelerator's counting tracks with no probe to tell: nothing to describe)
        if (charged or new) and probes._routes.on_alloc:
            shape, dtype = _describe(payload)
            node = getattr(_made, "node", None) if new else None
            probes.allocated(AllocInfo(holder.sid, charged, shape, dtype, new=new, existing=existing, node=node))

    def _rekey(self, holder: _Holder, buffer: _Buffer, payload: Any) -> None:
        if self._buffers.get(buffer.key) is buffer:
            del self._buffers[buffer.key]
        buffer.key = id(payload)
        buffer.ref = _weak(payload)
        self._buffers[buffer.key] = buffer
        nbytes = _nbytes(payload)
        delta, buffer.nbytes = nbytes - buffer.nbytes, nbytes
        if delta:
            self._charge(delta)
            if delta > 0 and probes._routes.on_alloc:
                shape, dtype = _describe(payload)
                probes.allocated(AllocInfo(holder.sid, delta, shape, dtype, new=False))
            elif delta < 0:
                probes.freed(FreeInfo(holder.sid, -delta, dead=False))

    def _leave(self, holder: _Holder, buffer: _Buffer, *, dead: bool) -> None:
        charged = buffer.holders[0] is holder
        buffer.holders.remove(holder)
        holder.buffer = None
        if not buffer.holders:
            if self._buffers.get(buffer.key) is buffer:
                del self._buffers[buffer.key]
            self._charge(-buffer.nbytes)
            probes.freed(FreeInfo(holder.sid, buffer.nbytes, dead=dead))
        elif charged:  # the bytes stay on the device, charged to the next holder
            probes.freed(FreeInfo(holder.sid, buffer.nbytes, dead=dead))
            heir = buffer.holders[0]
            ref = buffer.ref() if buffer.ref is not None else None
            shape, dtype = _describe(ref) if ref is not None else ((), "")
            probes.allocated(AllocInfo(heir.sid, buffer.nbytes, shape, dtype, new=False))
        elif dead:
            probes.freed(FreeInfo(holder.sid, 0, dead=True))

    def _drain(self) -> None:
        while self._dead:
            sid = self._dead.popleft()
            holder = self._holders.pop(sid, None)
            if holder is None:
                continue
            if self._by_id.get(holder.key) is holder:
                del self._by_id[holder.key]
            if holder.buffer is not None:
                self._leave(holder, holder.buffer, dead=True)

    # -- reading ---------------------------------------------------------------------

    def drain(self) -> int:
        """Apply the storages freed since the last change; returns the live bytes."""
        with self._lock:
            if self._dead:
                self._drain()
            return self.live_bytes

    def reset_peak(self) -> None:
        """The peak starts again from the bytes held now."""
        with self._lock:
            if self._dead:
                self._drain()
            self.peak_bytes = self.live_bytes

    def reset_accumulated(self) -> None:
        """The bytes allocated and freed count again from zero."""
        with self._lock:
            self.allocated_bytes = self.freed_bytes = 0

    def serial(self, storage: Any) -> int | None:
        """The serial id probes know ``storage`` by (``AllocInfo.storage``), None when it holds
        no payload the ledger registered."""
        with self._lock:
            holder = self._by_id.get(id(storage))
            return holder.sid if holder is not None and holder.ref() is storage else None

    def replay(self, route: Any) -> None:
        """Tell the probes of ``route`` every storage held now (``existing``), as if allocated."""
        with self._lock:
            if self._dead:
                self._drain()
            for buffer in list(self._buffers.values()):
                payload = buffer.ref() if buffer.ref is not None else None
                shape, dtype = _describe(payload) if payload is not None else ((), "")
                for i, holder in enumerate(buffer.holders):
                    info = AllocInfo(holder.sid, buffer.nbytes if i == 0 else 0, shape, dtype,
                                     new=True, existing=True)
                    deliver(route, (info,), probes.probe_errors)

    def scan(self) -> None:
        """Register every `tpu` tensor's storage alive now (``existing``): what was allocated
        before anyone listened (the model a script built before its trace began)."""
        import torch

        payload_attr = tensor.PAYLOAD_ATTR
        seen: set[int] = set()
        tensor_type = torch.Tensor
        for obj in gc.get_objects():
            # type(), not isinstance: isinstance reads __class__, which some lazy module
            # objects answer with a deprecation warning
            if not issubclass(type(obj), tensor_type):
                continue
            try:
                if obj.device.type != "tpu":
                    continue
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a fake or sparse tensor: no storage of ours
                continue
            payload = getattr(storage, payload_attr, None)
            if payload is None or id(storage) in seen:
                continue
            seen.add(id(storage))
            self.note(storage, payload, existing=True)


_made = threading.local()


def made_by(node: LoweredNode | None) -> None:
    """The storages given payloads on this thread from now on hold values ``node`` computed
    (a compiled graph's output), until ``made_by(None)``: probes hear it in ``AllocInfo.node``."""
    _made.node = node


def _queue(dead: collections.deque, sid: int, _ref: Any) -> None:
    dead.append(sid)  # deque.append is atomic: safe from any thread, inside any call


_ledger: Ledger | None = None
_switch = threading.Lock()


def active() -> Ledger | None:
    """The ledger while memory is tracked, else None."""
    return _ledger


def live_bytes() -> int | None:
    """Bytes the `tpu` tensors hold now, while memory is tracked (None otherwise)."""
    ledger = _ledger
    return ledger.drain() if ledger is not None else None


def drain() -> None:
    """Apply the frees queued since the last change (before reading a step's end)."""
    ledger = _ledger
    if ledger is not None:
        ledger.drain()


def listen(on: bool) -> None:
    """Start tracking (and register what exists now) or stop; the probes call this when
    the first probe with ``on_alloc``/``on_free`` subscribes and the last one goes."""
    global _ledger
    with _switch:
        if not on:
            tensor._track = None
            _ledger = None
            return
        if _ledger is not None:
            return
        ledger = _ledger = Ledger()
        tensor._track = ledger.note
    ledger.scan()


def replay(route: Any) -> None:
    """A probe subscribed while tracking was already on: tell it what is held now."""
    ledger = _ledger
    if ledger is not None:
        ledger.replay(route)


def _joined(route: Any) -> None:
    if _ledger is None:
        listen(True)  # registers what exists now, telling every memory probe
    else:
        replay(route)


# torch.accelerator's memory statistics (runtime/accelerator.py) keep tracking on once asked for,
# as a device's allocator counts for as long as the process runs; without any probe, so the
# runtime's paths stay those of an unobserved run
_counting = False


def _left() -> None:
    if not _counting:
        listen(False)


# the probes start and stop tracking as memory probes come and go
probes.track_memory(_joined, _left)


def counting() -> Ledger:
    """The ledger, tracking from the first call on for the rest of the process (the `tpu`
    tensors alive then are its first allocation and peak), after the frees queued so far:
    its ``live_bytes``, ``peak_bytes``, ``allocated_bytes`` and ``freed_bytes`` are what a
    device allocator's statistics count.

    Example::

        memory_ledger.counting().reset_peak()
        step()
        memory_ledger.counting().peak_bytes
    """
    global _counting
    _counting = True
    listen(True)
    ledger = _ledger
    ledger.drain()
    return ledger


def stop_counting() -> None:
    """Counting ends (tracking too unless a memory probe listens); the next :func:`counting`
    starts again from the tensors alive then."""
    global _counting
    _counting = False
    if not (probes._routes.on_alloc or probes._routes.on_free):
        listen(False)

