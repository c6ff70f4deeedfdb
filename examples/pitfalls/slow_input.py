"""Pitfall: a DataLoader that loads each batch on the training thread makes every step wait for it.

A ``DataLoader`` with ``num_workers=0`` (the default) runs the dataset's
``__getitem__`` and the collate function inside ``next()``, on the thread that
also runs the step: while a batch is read and decoded (here: a sleep standing
in for a disk read), the device has nothing to do. ``tpu-debug run`` on this
script splits each step's time into parts (the report's Steps section: input,
compile, sync, ..., host), finds most of it waiting for input, and says so as
a finding, with the loader's line and its settings. ``--fixed`` reads each batch
once, before the loop, and keeps it in memory (the data fits): the loader then hands
out batches it already holds. The finding's other fix, worker processes
(``num_workers=N``), helps as much once the step takes longer than a read divided
among the workers, which depends on the machine.

    python examples/pitfalls/slow_input.py [--steps 8] [--fixed]
    tpu-debug run examples/pitfalls/slow_input.py
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device

READ = 0.08  # seconds to read and decode one batch


def read_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``i`` of random regression data, as slow to read as a batch from a disk."""
    time.sleep(READ)
    g = torch.Generator().manual_seed(i)
    return torch.randn(64, 256, generator=g), torch.randn(64, 1, generator=g)


class Batches(torch.utils.data.Dataset):
    """Batches read from the disk at each ``__getitem__``, or, ``cached``, once when made."""

    def __init__(self, count: int, *, cached: bool = False) -> None:
        self.count = count
        self.cache = [read_batch(i) for i in range(count)] if cached else None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache[i] if self.cache is not None else read_batch(i)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help="read the batches once, before the loop")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # one batch per item: batch_size=None hands the dataset's batches through as they are
    loader = torch.utils.data.DataLoader(Batches(args.steps + 1, cached=args.fixed), batch_size=None)
    running = torch.zeros((), device="tpu")
    for x, y in loader:
        x, y = x.to("tpu"), y.to("tpu")
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        running += loss.detach()
    print(f"mean loss over {len(loader)} steps: {running.item() / len(loader):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
