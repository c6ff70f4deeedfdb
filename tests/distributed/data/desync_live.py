"""Ranks that stop calling the same collectives, caught live (run by tests/distributed/test_desync_live.py).

    torchrun --nproc-per-node N -m tpu_debug run ... desync_live.py PLANT OUT_DIR

Each rank writes ``OUT_DIR/rank<r>.json``: per plant, the error it raised (its type, its
text, its attributes), or None. The plants:

``mismatches`` (2 ranks) runs four plants one after the other, each on a fresh group
(a group whose ranks disagreed is of no further use): ``shapes``, an uneven last batch
(the last step's batch is smaller on rank 1); ``order``, the ranks call all_reduce and
broadcast in opposite orders; ``stuck``, rank 1 does not call a collective rank 0 waits
in, and stays alive (the check's timeout names it); ``hang``, a collective under
``if rank == 0``, while rank 1 goes on and leaves; ``device``, rank 0 all-reduces a CPU
tensor, rank 1 a `tpu` one (it runs before ``hang``, which ends rank 1).
After those, on fresh groups too: ``uneven_metric``, rank 1's loop runs once fewer and it
all-reduces the epoch's metric while rank 0 all-reduces its last batch; ``p2p_sizes``, a
send of 4 floats into a receive of 3; ``p2p_order``, both ranks receive before they
send; ``straggler``, rank 1 sleeps before each of 6 all-reduces.
``kill`` (2 ranks): rank 1 is killed (SIGKILL) after its second collective; rank 0's
third names it.
``raise`` (2 ranks): rank 1 raises after its second collective; rank 0's third names the
exception and its line.
``ok`` (4 ranks): a correct script with every kind of call the check must let through.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

PLANT, OUT = sys.argv[1], Path(sys.argv[2])
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
results: dict[str, dict | None] = {}


def caught(name: str, fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
        results[name] = {"type": type(exc).__name__, "text": str(exc),
                         **{k: getattr(exc, k, None) for k in ("group", "seq", "reason", "cause")},
                         "ranks": list(getattr(exc, "ranks", ()))}
    else:
        results[name] = None


def save() -> None:
    (OUT / f"rank{rank}.json").write_text(json.dumps(results))


def uneven_last_batch() -> None:
    group = dist.new_group(list(range(world)))
    for step in range(3):
        batch = torch.ones(4 if step < 2 or rank == 0 else 3, device="tpu")
        dist.all_reduce(batch, group=group)  # the batch's gradients


def opposite_order() -> None:
    group = dist.new_group(list(range(world)))
    a, b = torch.ones(4, device="tpu"), torch.zeros(4, device="tpu")
    if rank == 0:
        dist.all_reduce(a, group=group)  # rank 0 reduces first
        dist.broadcast(b, src=0, group=group)
    else:
        dist.broadcast(b, src=0, group=group)  # rank 1 broadcasts first
        dist.all_reduce(a, group=group)


def stuck() -> None:
    group = dist.new_group(list(range(world)))
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t, group=group)  # both ranks call this one
    if rank == 0:
        dist.all_reduce(t, group=group)  # rank 1 never calls this one
    else:
        time.sleep(float(os.environ["TPU_DEBUG_COLLECTIVE_TIMEOUT"]) + 1)  # alive, busy elsewhere


def rank_zero_only() -> None:
    group = dist.new_group(list(range(world)))
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t, group=group)
    dist.barrier(group=group)
    if rank == 0:
        dist.all_reduce(t, group=group)  # only rank 0 gets here


def mixed_devices() -> None:
    group = dist.new_group(list(range(world)))
    dist.all_reduce(torch.ones(4, device="cpu" if rank == 0 else "tpu"), group=group)  # rank 0 forgot .to("tpu")


def uneven_then_metric() -> None:
    group = dist.new_group(list(range(world)))
    for _ in range(3 if rank == 0 else 2):
        dist.all_reduce(torch.ones(4, device="tpu"), group=group)  # a batch's gradients
    dist.all_reduce(torch.ones(2, device="tpu"), group=group)  # the epoch's metric, after the loop


def p2p_sizes() -> None:
    group = dist.new_group(list(range(world)))
    if rank == 0:
        dist.send(torch.ones(4, device="tpu"), 1, group=group)  # rank 0 sends 4
    else:
        dist.recv(torch.zeros(3, device="tpu"), 0, group=group)  # rank 1 receives 3


def p2p_order() -> None:
    group = dist.new_group(list(range(world)))
    got = torch.zeros(4, device="tpu")
    dist.recv(got, 1 - rank, group=group)  # both ranks receive first
    dist.send(torch.ones(4, device="tpu"), 1 - rank, group=group)


def straggler() -> None:
    group = dist.new_group(list(range(world)))
    for _ in range(6):
        if rank == 1:
            time.sleep(0.2)  # rank 1 alone does more before each collective
        dist.all_reduce(torch.ones(2, device="tpu"), group=group)  # rank 0 waits here


if PLANT == "mismatches":
    caught("shapes", uneven_last_batch)
    caught("order", opposite_order)
    caught("stuck", stuck)
    caught("device", mixed_devices)
    caught("uneven_metric", uneven_then_metric)
    caught("p2p_sizes", p2p_sizes)
    caught("p2p_order", p2p_order)
    caught("straggler", straggler)
    caught("hang", rank_zero_only)
    save()
elif PLANT == "kill":
    if rank == 0:
        # rank 0 stands for a rank on another host, which no agent stops: torchrun's agent
        # here sends SIGTERM to the ranks left once it sees rank 1 gone, at any moment of
        # its monitor interval, possibly before rank 0's check has named the dead rank
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def killed() -> None:
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t)
        dist.all_reduce(t)  # rank 1's last collective
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)  # rank 0 waits for the dead rank here

    caught("kill", killed)
    save()
elif PLANT == "raise":
    def raised() -> None:
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t)
        dist.all_reduce(t)  # the last collective rank 1 calls before it raises
        if rank == 1:
            raise ValueError("a bad batch")  # rank 1 raises here
        dist.all_reduce(t)  # rank 0 waits for the rank that raised here

    if rank == 1:
        raised()  # uncaught: the process ends with it, as a script's error does
    caught("raise", raised)
    save()
elif PLANT == "ok":
    def correct() -> None:
        x = torch.arange(4.0, device="tpu") + rank
        dist.all_reduce(x)
        gathered = torch.empty(4 * world, device="tpu")
        dist.all_gather_into_tensor(gathered, x)
        out = torch.empty(4 // world if 4 % world == 0 else 1, device="tpu")
        dist.reduce_scatter_tensor(out, torch.ones(out.numel() * world, device="tpu"))
        dist.broadcast(x, src=world - 1)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        if rank == 2:
            time.sleep(1.5)  # a late rank: the others wait for it at the next collective
        dist.barrier()
        # point to point pairs two ranks, in a ring: each rank's p2p count differs from its peers'
        if rank % 2 == 0:
            dist.send(torch.full((3,), float(rank), device="tpu"), dst=(rank + 1) % world)
        got = torch.empty(3, device="tpu")
        dist.recv(got, src=(rank - 1) % world)
        if rank % 2 == 1:
            dist.send(torch.full((3,), float(rank), device="tpu"), dst=(rank + 1) % world)
        # asynchronous point to point: a ring of isend/irecv, and of batch_isend_irecv
        ring = [dist.isend(x, (rank + 1) % world), dist.irecv(torch.empty(4, device="tpu"), (rank - 1) % world)]
        for work in ring:
            work.wait()
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world),
               dist.P2POp(dist.irecv, torch.empty(4, device="tpu"), (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        # sub-groups whose members differ, each with its own sequence
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = pairs[rank // 2]
        for _ in range(3):
            dist.all_reduce(x, group=mine)
        if rank < 2:  # only the first pair calls more: a collective of a group is its members' only
            dist.all_gather_into_tensor(torch.empty(8, device="tpu"), x, group=mine)
        splits = [1] * world
        dist.all_to_all_single(torch.empty(world, device="tpu"), torch.arange(float(world), device="tpu"),
                               splits, splits)
        objects = [None] * world
        dist.all_gather_object(objects, {"rank": rank})
        for step in range(3):  # the same line in a loop, every rank alike
            dist.all_reduce(torch.ones(2, device="tpu") * step)

    caught("ok", correct)
    save()
dist.destroy_process_group()
