"""Start a case script's ranks as forks of the script, with torchrun's ``env://`` variables.

Forked, not spawned: each rank starts with the script's torch (and, through the device's
autoload, tpu_debug) already imported instead of importing them again. The script must not
have touched a device or started a thread before :func:`start`, so each rank starts its
backend as a fresh process does.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch.multiprocessing as mp


def start(rank_main: Callable[..., None], world: int, *args) -> None:
    """Run ``rank_main(rank, *args)`` in ``world`` forked ranks that meet on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(rank_main, port, world, args), nprocs=world, start_method="fork")


def _rank(rank: int, rank_main: Callable[..., None], port: int, world: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    rank_main(rank, *args)
