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
the same one, and names each rank's call and line and the fix when they do not
(:mod:`.live_check`, with its watcher thread in :mod:`.rank_watcher`).

The process group is a Python subclass of ``torch.distributed.ProcessGroup``
(c10d's C++ ``Backend`` has no Python constructor): c10d then uses it as the
whole group, so ``dist.*``, DDP's reducer and the functional collectives all
call its methods, with tensors of any device. Each call finishes before it
returns; its work object is complete, and its future holds the output tensors
(:mod:`.work`); a send or receive finishes when waited for, as on gloo.

The parts: :mod:`.process_group` (the group, and the one path every call takes),
:mod:`.host_engine` (host copies, write-back, the gloo group), :mod:`.live_check`,
:mod:`.rank_watcher`, :mod:`.work`, and :mod:`.registration` (the backends, and the
guards of ``init_process_group`` and ``init_device_mesh``).
"""

from __future__ import annotations

from tpu_debug.runtime.distributed.c10d.process_group import TpuProcessGroup, for_program
from tpu_debug.runtime.distributed.c10d.registration import BACKEND_NAMES, DEFAULT_BACKEND, register_backends

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "TpuProcessGroup", "for_program", "register_backends"]
