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
import datetime
import functools
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C._distributed_c10d import ProcessGroupGloo
from tpu_debug.core import desync
from tpu_debug.core.collective_kinds import P2P_OPS
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.post_import import when_imported
from tpu_debug.core.rank_env import read_rank_env
from tpu_debug.core.sources import library_roots
from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed.config import config
from tpu_debug.runtime.distributed.errors import (
    CollectiveDesyncError,
    CollectiveDeviceError,
    CollectiveTimeoutError,
    LaunchError,
    MeshError,
)

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "TpuProcessGroup", "register_backends"]

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
_exit_marks: list[Any] = []  # the live checks of this process, told at exit
_exit_lock = threading.Lock()


def _mark_exit() -> None:
    """Tell the other ranks this process has left its groups (they stop waiting for it)."""
    # the watcher first: a daemon thread still inside a store call when the interpreter
    # finalizes is unwound through C++ and aborts the process
    _watcher.stop()
    for check in _exit_marks:
        check.leave()


_verdicts: dict[CodeType, bool] = {}


def _is_library(code: CodeType) -> bool:
    """Whether ``code`` is library code (torch, jax, tpu_debug, the standard library, an
    installed package, code a library generated): decided once per code object."""
    verdict = _verdicts.get(code)
    if verdict is None:
        file = code.co_filename
        if file.startswith("<"):
            verdict = not file.startswith(("<stdin>", "<ipython-input-"))
        else:
            real = os.path.realpath(file)
            verdict = (any(real.startswith(r) for r in library_roots())
                       or f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real)
        _verdicts[code] = verdict
    return verdict


def _user_site() -> tuple[str | None, int | None, str | None]:
    """(file, line, function) of the innermost frame of the user's code calling in."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_library(frame.f_code):
            return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname
        frame = frame.f_back
    return None, None, None


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


def _rank_call(rank: int, card: dict | None, state: str = "called") -> desync.RankCall:
    if card is None:
        return desync.RankCall(rank, state)
    return desync.RankCall(rank, state, card["op"], card["seq"], tuple(card["shapes"]), card["dtype"],
                           card["reduce_op"], card["peer"], card["file"], card["line"], card["function"],
                           card.get("device", ""))


class _Watcher:
    """One daemon thread per process: it writes, for the ranks a reader has waited for more
    than :data:`_LOOK_SECONDS`, whether they died or are missing after the timeout, so the
    reader's blocking read returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[_LiveCheck, int, float]] = {}  # thread id -> (check, seq, start)
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def begin(self, check: _LiveCheck, seq: int) -> None:
        with self._lock:
            self._waits[threading.get_ident()] = (check, seq, time.monotonic())
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="tpu_debug-collective-watcher", daemon=True)
                self._thread.start()

    def end(self) -> None:
        with self._lock:
            self._waits.pop(threading.get_ident(), None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(_LOOK_SECONDS)
            if self._stopped:
                return
            with self._lock:
                waits = list(self._waits.values())
            now = time.monotonic()
            for check, seq, start in waits:
                if now - start >= _LOOK_SECONDS:
                    try:
                        check.look(seq, timed_out=now - start >= check.timeout)
                    except Exception:  # noqa: BLE001 - a store gone: the reader's own read fails and says so
                        pass
            with _exit_lock:
                checks = list(_exit_marks)
            for check in checks:
                try:
                    check.sweep()
                except Exception:  # noqa: BLE001 - entries left behind cost a few bytes in the store
                    pass


_watcher = _Watcher()


class _LiveCheck:
    """One group's check, on one rank: publish this rank's call, read the others' for the same
    sequence number, raise when they differ or do not come."""

    def __init__(self, store: Any, me: int, ranks: Sequence[int], timeout: float) -> None:
        self._store = store
        self._side: Any = None  # the watcher's own connection: a store client serves one request at a time
        self._me = me
        self._others = [r for r in ranks if r != me]
        self.timeout = timeout
        self._space = _process_space()
        self._pid = os.getpid()
        self._agreed: set[tuple[str | None, int | None]] = set()  # lines whose calls the ranks agreed on
        self._last = 0  # the last sequence number this rank published
        self._spent: list[int] = []  # this rank's entries every other rank has read (the watcher deletes them)
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

    def check(self, info: probes.CollectiveInfo, device: str = "") -> None:
        """Raise unless every rank of the group calls this collective, alike (``device``: the
        device type of its tensors).

        Raises:
            CollectiveDesyncError: another rank calls another collective here, or ended or died.
            CollectiveTimeoutError: a rank did not call it within the timeout.
        """
        if self._off:
            return
        file, line, function = _user_site()
        seq = info.seq
        mine = {"seq": seq, "op": info.op, "shapes": [str(list(s)) for s in info.shapes], "dtype": info.dtype,
                "reduce_op": info.reduce_op, "peer": info.peer, "file": file, "line": line, "function": function,
                "pid": self._pid, "space": self._space, "device": device}
        store = self._store
        try:
            store.set(self._key(self._me, seq), json.dumps(mine))
            self._last = seq
            _watcher.begin(self, seq)
            try:
                raw = store.multi_get([self._key(r, seq) for r in self._others])
            finally:
                _watcher.end()
            if seq > 2:
                self._spent.append(seq - 2)
        except (RuntimeError, OSError) as exc:  # c10d's DistError is a RuntimeError
            # without its store a group cannot be checked; gloo still tells a broken group
            self._off = True
            import warnings

            warnings.warn(f"tpu_debug: the live collective check of this process group stopped: its store "
                          f"failed ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=2)
            return
        cards = dict(zip(self._others, (json.loads(v) for v in raw), strict=True))
        calls = [_rank_call(self._me, mine)]
        for r, card in cards.items():
            state = card.get("state", "called")
            calls.append(_rank_call(r, card) if state == "called" else _rank_call(r, self._previous(r, seq), state))
        calls.sort(key=lambda c: c.rank)
        reason = desync.differ(calls)
        site = (file, line)
        if reason is None:
            if len(self._agreed) < 4096:
                self._agreed.add(site)
            return
        cause = desync.cause_of(reason, calls, repeated=site in self._agreed)
        waited = any(c.state == "missing" for c in calls)
        timeout = self.timeout if waited else None
        message = desync.describe(info.group, seq, reason, cause, calls, timeout=timeout)
        if probes.listening("on_collective_desync"):
            probes.collective_desync(probes.DesyncInfo(info.group, tuple(info.ranks), self._me, seq, reason, cause,
                                                       tuple(calls), timeout, message))
        others = tuple(c.rank for c in calls if c.rank != self._me and (c.state != "called" or reason != "missing"))
        error = CollectiveTimeoutError if waited else CollectiveDesyncError
        raise error(message, group=info.group, seq=seq, reason=reason, cause=cause, ranks=others)

    def _previous(self, rank: int, seq: int) -> dict | None:
        """``rank``'s entry of collective ``seq - 1`` (its last one, when it has not called ``seq``)."""
        key = self._key(rank, seq - 1)
        if seq > 1 and self._store.check([key]):
            card = json.loads(self._store.get(key))
            return card if card.get("state", "called") == "called" else None
        return None

    # -- the watcher's side (its own thread and store connection) --------------------------

    def look(self, seq: int, *, timed_out: bool) -> None:
        """For each rank that has not published ``seq``: write "died" when its process is gone,
        "missing" once the timeout has passed (the reader then wakes)."""
        if self._side is None:
            self._side = self._store.clone()
        side = self._side
        for rank in self._others:
            key = self._key(rank, seq)
            if side.check([key]):
                continue
            state = None
            before = self._key(rank, seq - 1)
            if seq > 1 and side.check([before]):
                last = json.loads(side.get(before))
                if last.get("space") == self._space and not _alive(int(last.get("pid", -1))):
                    state = "died"
            if state is None and timed_out:
                state = "missing"
            if state is not None:
                side.compare_set(key, "", json.dumps({"seq": seq, "state": state}))

    def sweep(self) -> None:
        """Delete this rank's entries that every other rank has read."""
        spent, self._spent = self._spent, []
        if spent:
            if self._side is None:
                self._side = self._store.clone()
            for seq in spent:
                self._side.delete_key(self._key(self._me, seq))

    def leave(self) -> None:
        """At exit: tell ranks that wait for this one at its next collective that it ended."""
        try:
            side = self._side if self._side is not None else self._store
            side.compare_set(self._key(self._me, self._last + 1), "",
                             json.dumps({"seq": self._last + 1, "state": "ended"}))
        except Exception:  # noqa: BLE001 - the store's host may have gone first; nothing waits then
            pass


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
        back into its device tensors."""
        kind, factor = _reduce_kind(reduce_op)
        in_place = name.startswith("allreduce")
        device = self._device_of(name, args)
        if kind is not None:
            _check_reduce(kind, _flat(args[0 if in_place else 1]))
        if name in P2P_OPS:  # counted apart, as c10d does: the peers' sequences differ by design
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._seq += 1
            seq = self._seq
        # read only while a probe listens: with none, a collective reads no clock
        began = time.perf_counter() if probes.listening("on_collective_done") else None
        if self._check is not None and name not in P2P_OPS:
            # recorded first, so a rank that raises below has recorded the collective it stopped at
            info = self._info(name, args, kind)
            if probes.listening("on_collective"):
                probes.collective(info)
            self._check.check(info, device)
        elif probes.listening("on_collective"):
            probes.collective(self._info(name, args, kind))
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
        self._host_call(name, host_args)
        if kind == _RedOp.AVG:
            for t in _flat(host_args[0]):
                t.div_(self._size)
        wanted = [] if outputs is None else _flat(args[outputs])
        if outputs is not None:
            _write_back([(d, h) for d, h in copies if any(d is o for o in wanted)])
        if began is not None:
            probes.collective_done(probes.CollectiveDone(
                name, self._group_name(), self._rank, seq, time.perf_counter() - began,
            ))
        return _DoneWork(wanted)

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
        return device

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
        _registered = True
