"""A single-host launch script as TorchTPU's examples write one: absl's main through
g3_multiprocessing.handle_main, the environment from singlehost_wrapper, the worker wrapped by
tpu_env_wrapper and started on each rank by PyTorch's elastic launcher (torchrun's engine)."""

import os

import rank_worker
import torch.multiprocessing as mp
from absl import flags
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch_tpu._internal.distributed.launchers import singlehost_wrapper
from torch_tpu.shims.g3_multiprocessing import g3_multiprocessing

_OUT = flags.DEFINE_string("out", None, "where each rank writes what it saw")
_RANKS = flags.DEFINE_integer("ranks", 2, "ranks to start")


def main(argv):
    del argv
    singlehost_wrapper.prepare_tpu_environment(world_size=_RANKS.value)
    world = int(os.environ["WORLD_SIZE"])
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", run_id="torchtpu-launch", max_restarts=0)
    elastic_launch(config, singlehost_wrapper.tpu_env_wrapper(rank_worker.worker, _OUT.value, world_size=world))()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    g3_multiprocessing.handle_main(main)
