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

The process group is a Python subclass of ``torch.distributed.ProcessGroup``
(c10d's C++ ``Backend`` has no Python constructor): c10d then uses it as the
whole group, so ``dist.*``, DDP's reducer and the functional collectives all
call its methods, with tensors of any device. Each call finishes before it
returns; its work object is complete, and its future holds the output tensors.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C._distributed_c10d import ProcessGroupGloo
from tpu_debug.runtime import probes

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "P2P_OPS", "TpuProcessGroup", "register_backends"]

BACKEND_NAMES = ("tpu", "tpu_dist")
DEFAULT_BACKEND = "tpu_dist"
#: the point-to-point calls, whose sequence numbers count apart from the group's collectives
P2P_OPS = ("send", "recv", "recv_anysource")
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


class TpuProcessGroup(dist.ProcessGroup):
    """A c10d process group for `tpu` tensors (and CPU ones) over a gloo group on the host.

    Made by ``torch.distributed`` for the backends ``tpu`` and ``tpu_dist``; not built by hand.
    """

    def __init__(self, host_group: dist.ProcessGroup, rank: int, size: int, name: str,
                 global_ranks: Sequence[int] = ()) -> None:
        super().__init__(rank, size)
        self._global_ranks = tuple(int(r) for r in global_ranks) or tuple(range(size))
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
        if kind is not None:
            _check_reduce(kind, _flat(args[0 if in_place else 1]))
        if name in P2P_OPS:  # counted apart, as c10d does: the peers' sequences differ by design
            self._p2p_seq += 1
        else:
            self._seq += 1
        if probes._routes.on_collective:
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
        if outputs is None:
            return _DoneWork([])
        wanted = _flat(args[outputs])
        _write_back([(d, h) for d, h in copies if any(d is o for o in wanted)])
        return _DoneWork(wanted)

    def _info(self, name: str, args: tuple, kind: Any) -> probes.CollectiveInfo:
        tensors = [t for a in args for t in _flat(a)]
        peer = None
        if name in ("send", "recv"):
            peer = int(args[1])
        elif hasattr(args[-1], "rootRank"):
            peer = int(args[-1].rootRank)
        try:
            group = self.group_name
        except RuntimeError:  # while c10d is still naming the group
            group = "?"
        return probes.CollectiveInfo(
            op=name,
            group=group,
            ranks=self._global_ranks,
            rank=self._rank,
            seq=self._p2p_seq if name in P2P_OPS else self._seq,
            shapes=tuple(tuple(t.shape) for t in tensors),
            dtype=",".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors})),
            nbytes=sum(t.numel() * t.element_size() for t in tensors),
            reduce_op=None if kind is None else kind.name,
            peer=peer,
        )

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
        return TpuProcessGroup(host, opts.group_rank, opts.group_size, name, opts.global_ranks_in_group)

    create.__name__ = f"create_{name}_process_group"
    return create


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
        _registered = True
