"""``torch_tpu._internal.distributed.launchers.singlehost_wrapper``: the environment a
single-host TorchTPU launch sets before ``torchrun`` starts the ranks.

``python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper`` prints
``KEY=value`` lines for a shell to ``eval`` (TorchTPU's launch scripts do
``eval $(python3 -m ...singlehost_wrapper)`` and then ``torchrun --nproc_per_node=$WORLD_SIZE``):

- ``WORLD_SIZE``: the ``WORLD_SIZE`` already set, else the number of devices the runtime
  has on this host (1 on a CPU host; ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
  gives N). Each rank of this runtime drives its own device, so any count runs.
- ``TORCH_TPU_TOPOLOGY``: that count as a ``Nx1x1`` topology.

``TORCH_TPU_SLICEBUILDER_ADDRESSES`` is not printed: TorchTPU's slice builder has no
counterpart here (the ranks meet through torchrun's store).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerWrapper", "prepare_tpu_environment", "print_environment", "tpu_env_wrapper"]


def _world_size(world_size: int | None) -> int:
    if world_size is not None:
        return int(world_size)
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    import torch

    return torch.tpu.device_count()


def prepare_tpu_environment(world_size: int | None = None) -> dict[str, str]:
    """Set (and return) the variables a launch's ranks read; see the module."""
    count = _world_size(world_size)
    env = {"WORLD_SIZE": str(count), "TORCH_TPU_TOPOLOGY": os.environ.get("TORCH_TPU_TOPOLOGY", f"{count}x1x1")}
    os.environ.update(env)
    return env


class WorkerWrapper:
    """A picklable callable running ``func(*args, *more, **kwargs)`` in each rank."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.__name__ = getattr(func, "__name__", repr(func))
        self.__qualname__ = getattr(func, "__qualname__", self.__name__)

    def __call__(self, *more: Any) -> Any:
        return self.func(*self.args, *more, **self.kwargs)


def tpu_env_wrapper(func: Callable[..., Any], *args: Any, world_size: int | None = None,
                    **kwargs: Any) -> WorkerWrapper:
    """Prepare the environment (in the launching process), and wrap ``func`` for the ranks."""
    prepare_tpu_environment(world_size)
    return WorkerWrapper(func, *args, **kwargs)


def print_environment(env: dict[str, str]) -> int:
    """Print ``env`` as ``KEY=value`` lines, for a launch script's ``eval``; the exit status."""
    for key, value in env.items():
        print(f"{key}={value}")
    return 0


def main() -> int:
    return print_environment(prepare_tpu_environment())


if __name__ == "__main__":
    raise SystemExit(main())
