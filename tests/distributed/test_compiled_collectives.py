"""Functional collectives and PyTorch's parallel APIs inside ``torch.compile`` on `tpu`.

The reference is PyTorch itself: ``data/compiled_collectives_cases.py`` runs two ranks on
`tpu` with ``init_process_group()`` and the ``tpu_debug`` backend, and on CPU with ``gloo``
and the same functions uncompiled (what a compiled program must compute); every result is
compared.

Collectives are compared exactly: their inputs are small integers (exact in every dtype
and every reduction order) and both sides run gloo's collective on the host. Training is
compared within float32 rounding (``rtol=1e-5``): the collectives are gloo's on both
sides, but each rank's forward and backward run as XLA CPU kernels in one program on
`tpu` and as PyTorch's CPU kernels in the reference, which sum a matmul's or a layer
norm's products in different orders (measured: at most 2.4e-7 apart after 3 steps).
"""

from __future__ import annotations

import re
import sys

import pytest
import torch
import torch.distributed._functional_collectives as fc
from dist_helpers import DATA, assert_exactly_gloos, assert_trained_as_gloo, ranks_on_both_devices

CASES = DATA / "compiled_collectives_cases.py"
COLLECTIVES = [
    "all_reduce.sum", "all_reduce.max", "all_reduce.min", "all_reduce.product", "all_reduce.avg",
    "all_reduce.int64.sum", "all_reduce.int64.bxor", "all_gather_tensor", "all_gather_tensor.int64",
    "reduce_scatter_tensor", "all_to_all_single", "all_to_all_single.uneven", "broadcast", "chained",
]
TRAINING = ["fsdp_compiled", "tp_sp_compiled", "tp_sp_eager", "ddp_compiled_autograd"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Each device's results, per rank: the `tpu` run and the gloo reference run side by side."""
    # each run forks its two ranks, which meet on a free port of their own
    return ranks_on_both_devices([sys.executable, str(CASES)], tmp_path_factory.mktemp("compiled_collectives"))


@pytest.mark.parametrize("case", COLLECTIVES)
def test_compiled_functional_collective_equals_gloo(ranks, case):
    assert_exactly_gloos(ranks, f"funcol.{case}")


@pytest.mark.parametrize("what", TRAINING)
def test_training_equals_gloo(ranks, what):
    assert_trained_as_gloo(ranks, what)


def test_compiled_collectives_are_recorded_at_the_users_line(ranks):
    lines = CASES.read_text().splitlines()
    for rank in range(2):
        calls = ranks["tpu"][rank]["recorded"]
        # the eager all_reduce, then the compiled step's two collectives, called twice
        all_reduce = ("allreduce", ("[8]",), "SUM", (0, 1))
        # funcol's all-gather reaches the group as its coalesced all_gather_into_tensor
        all_gather = ("all_gather_single_coalesced", ("[16]", "[8]"), None, (0, 1))
        assert [(op, shapes, reduce_op, group) for op, _, shapes, _, reduce_op, group, *_ in calls] == [
            all_reduce, *[all_reduce, all_gather] * 2]
        seqs = [seq for _, seq, *_ in calls]
        assert seqs == list(range(seqs[0], seqs[0] + 5))  # one sequence with the eager calls
        assert {call[3] for call in calls} == {"float32"}
        assert all(file == str(CASES) for *_, file, _, _ in calls)
        # each compiled collective at the line inside the compiled function that called it
        assert [(lines[line - 1].strip().split(" = ")[-1].split("(")[0], function)
                for *_, line, function in calls] == [
            ("dist.all_reduce", "_recorded"),
            *[("fc.all_reduce", "step"), ("return fc.all_gather_tensor", "step")] * 2,
        ]


def test_a_collectives_error_is_raised_as_itself(one_rank):
    # the process group refuses AVG of integers inside the host callback; the program's call
    # raises that error, not XLA's report of a failed callback
    step = torch.compile(lambda n: fc.all_reduce(n + 1, "avg", one_rank), backend="tpu_debug")
    with pytest.raises(TypeError, match=re.escape(
        "ReduceOp.AVG on a torch.int64 tensor: the tpu backend averages floating point tensors only; "
        "reduce with ReduceOp.SUM and divide"
    )):
        step(torch.arange(4, device="tpu"))


def test_dry_run_gives_the_collectives_shapes(one_rank):
    from tpu_debug.runtime.dry_mode import dry_mode
    from tpu_debug.runtime.target import parse_target

    def step(x):
        y = fc.all_gather_tensor(x @ x, 0, one_rank)
        return fc.all_reduce(y, "sum", one_rank) + 1

    with dry_mode(parse_target("v5e")) as mode:
        out = torch.compile(step, backend="tpu_debug")(torch.ones(8, 8, device="tpu"))
        assert out.shape == (8, 8)  # a group of one gathers one piece
        programs = mode.collect(timeout=240)
    # the graph's program compiled for the TPU target with its collectives as stand-ins
    assert [(p.error, p.result is not None) for p in programs if p.mode == "compiled"] == [(None, True)]


def test_a_desync_in_a_compiled_graph_is_said_once_on_the_tpu_device(ranks):
    # raised as itself from the program's call, without JAX's log of the failed callback
    # first, and naming the device the graph runs on, not the host copies' CPU
    (line,) = [i for i, src in enumerate(CASES.read_text().splitlines(), 1) if "lambda x: fc.all_reduce(x * 2" in src]
    for rank in range(2):
        got = ranks["tpu"][rank]["desync_compiled"]
        assert (got["type"], got["logged"]) == ("CollectiveDesyncError", 0)
        header, *calls = got["text"].splitlines()[:3]
        assert header.startswith("group 0, collective #") and header.endswith(": the ranks differ (shapes)")
        assert calls == [f"  rank 0: allreduce([4]; float32, SUM) at {CASES.name}:{line} in <lambda>",
                         f"  rank 1: allreduce([3]; float32, SUM) at {CASES.name}:{line} in <lambda>"]
