"""The `tpu` process group: a Python subclass of ``torch.distributed.ProcessGroup`` whose
c10d methods run each collective on the host engine, behind the live check, with its probes
and Flight Recorder entry."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from tpu_debug.core.records import CollectiveDone, CollectiveInfo
from tpu_debug.core.collective_kinds import FLIGHT_RECORDER_NAMES, of_c10d
from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed import flight_recorder
from tpu_debug.runtime.distributed.c10d.host_engine import (
    as_sum,
    check_reduce,
    flat,
    reduce_kind,
    scaled,
    to_host,
    write_back,
)
from tpu_debug.runtime.distributed.c10d.live_check import LiveCheck
from tpu_debug.runtime.distributed.c10d.work import DoneWork, PostedWork
from tpu_debug.runtime.distributed.config import config
from tpu_debug.runtime.distributed.errors import CollectiveDeviceError

__all__ = ["TpuProcessGroup", "for_program"]

_RedOp = dist.ReduceOp.RedOpType

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
            probes.collective_done(CollectiveDone(
                self.name, self.group._group_name(), self.group._rank, self.seq, time.perf_counter() - self.began,
                last, waited,
            ))


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
            self._check = LiveCheck(store, self._global_ranks[rank], self._global_ranks, config.collective_timeout)
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
        kind, factor = reduce_kind(reduce_op)
        collective = of_c10d(name)
        in_place = collective.in_place
        device = self._device_of(name, args)
        if kind is not None:
            check_reduce(kind, flat(args[0 if in_place else 1]))
        p2p = collective.point_to_point
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
        if self._check is not None and name in collective.peer_argument:
            ticket = self._check.post(self._info(name, args, kind), device, self._global_ranks[int(args[1])],
                                      int(args[2]))
        if entry is not None:
            flight_recorder.recorder.started(entry)
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        # the host copies are the engine's, reported as the collective: no transfer events.
        # The write-back below is reported (divergence tracing keeps its CPU shadow by it)
        with probes.quiet():
            host_args = [to_host(a, copies) for a in args]
        if kind == _RedOp.PREMUL_SUM:
            if in_place:
                for t in flat(host_args[0]):
                    t.mul_(factor)
            else:  # the inputs are the caller's (CPU ones are not copies): scale new tensors
                host_args[1] = scaled(host_args[1], factor)
        wanted = [] if outputs is None else flat(args[outputs])
        done = _Finish(self, name, seq, began, entry)
        if p2p:
            # a receive is given to gloo at once; a send once its receiver's side is seen to match
            ready = ticket is None or self._check is None or self._check.peek(ticket) or name not in collective.sends
            work = PostedWork(functools.partial(getattr(self._host, name), *host_args), copies, wanted, ticket,
                              self._check, done)
            if ready:
                work.start()
            else:
                self._check.hold(work)
            return work
        self._host_call(name, host_args)
        if kind == _RedOp.AVG:
            for t in flat(host_args[0]):
                t.div_(self._size)
        if outputs is not None:
            write_back([(d, h) for d, h in copies if any(d is o for o in wanted)])
        done(arrival)
        return DoneWork(wanted)

    def _flight_record(self, name: str, args: tuple, p2p: bool) -> dict:
        """The Flight Recorder's entry of this call (scheduled)."""
        kind = of_c10d(name)
        ins, outs = ([t for i in at for t in flat(args[i])] for at in kind.flight_recorder_arguments(name))
        op = FLIGHT_RECORDER_NAMES[name]
        if name in kind.peer_argument:
            op += f" {self._rank}->{int(args[1])}" if name in kind.sends else f" {self._rank}<-{int(args[1])}"
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
        for t in (t for a in args for t in flat(a)):
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

    def _info(self, name: str, args: tuple, kind: Any) -> CollectiveInfo:
        tensors = [t for a in args for t in flat(a)]
        collective = of_c10d(name)
        peer = None
        if name in collective.peer_argument:
            peer = int(args[1])
        elif hasattr(args[-1], "rootRank"):
            peer = int(args[-1].rootRank)
        return CollectiveInfo(
            op=name,
            group=self._group_name(),
            ranks=self._global_ranks,
            rank=self._rank,
            seq=self._p2p_seq if collective.point_to_point else self._seq,
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
        return self._run("allreduce", (tensors, as_sum(opts, _c10d.AllreduceOptions)), reduce_op=opts.reduceOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _options(opts, _c10d.AllreduceCoalescedOptions)
        return self._run("allreduce_coalesced", (tensors, as_sum(opts, _c10d.AllreduceCoalescedOptions)),
                         reduce_op=opts.reduceOp)

    def broadcast(self, tensors, opts=None):
        return self._run("broadcast", (tensors, _options(opts, _c10d.BroadcastOptions)))

    def reduce(self, tensors, opts=None):
        opts = _options(opts, _c10d.ReduceOptions)
        check_reduce(opts.reduceOp, flat(tensors))
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
        return self._run(name, (outputs, inputs, as_sum(opts, _c10d.ReduceScatterOptions)),
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
