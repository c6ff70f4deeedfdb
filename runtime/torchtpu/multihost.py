"""``torch_tpu._internal.distributed.launchers.multihost_wrapper``: the variables a multi-host
TorchTPU launch sets on each host before ``torchrun`` starts its ranks.

``prepare_tpu_environment()`` reads the hosts from ``TPU_WORKER_HOSTNAMES`` (comma-separated;
a TPU VM slice's metadata, or set by hand) and this host's index from ``JOB_COMPLETION_INDEX``
(a Kubernetes indexed job's), and sets what ``torchrun`` reads for a multi-node launch:
``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` (the first host) and ``MASTER_PORT`` (29500), the
last two only where unset. It also sets TorchTPU's ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one
``host:port`` per device, ports from ``TORCH_TPU_BASE_PORT``, 8070, and
``TORCH_TPU_DEVICES_PER_HOST`` devices per host, 8) for scripts that read it; the ranks here
meet through torchrun's store, so nothing of this runtime reads it.

``python -m torch_tpu._internal.distributed.launchers.multihost_wrapper`` prints those variables
as ``KEY=value`` lines for a shell to ``eval``, as TorchTPU's multi-host launch scripts do
(``eval $(python3 -m ...multihost_wrapper)``, then ``torchrun --nnodes=$NNODES ...``).
"""

from __future__ import annotations

import os

from tpu_debug.runtime.torchtpu.launcher import print_environment

__all__ = ["prepare_tpu_environment"]


def prepare_tpu_environment() -> dict[str, str]:
    """Set (and return) the variables above.

    Raises:
        ValueError: ``TPU_WORKER_HOSTNAMES`` or ``JOB_COMPLETION_INDEX`` is not set.
    """
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if not hosts:
        raise ValueError("No TPU_WORKER_HOSTNAMES found. Set it to this slice's hosts, comma-separated.")
    index = os.environ.get("JOB_COMPLETION_INDEX")
    if index is None:
        raise ValueError("No JOB_COMPLETION_INDEX found in environment. Set it to this host's index in "
                         "TPU_WORKER_HOSTNAMES.")
    port = int(os.environ.get("TORCH_TPU_BASE_PORT", "8070"))
    per_host = int(os.environ.get("TORCH_TPU_DEVICES_PER_HOST", "8"))
    env = {
        "NNODES": str(len(hosts)),
        "NODE_RANK": str(int(index)),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR") or hosts[0],
        "MASTER_PORT": os.environ.get("MASTER_PORT") or "29500",
    }
    if "TORCH_TPU_SLICEBUILDER_ADDRESSES" not in os.environ:
        env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = ",".join(f"{h}:{port + i}" for h in hosts for i in range(per_host))
    os.environ.update(env)
    return env


def main() -> int:
    return print_environment(prepare_tpu_environment())


if __name__ == "__main__":
    raise SystemExit(main())
