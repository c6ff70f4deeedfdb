"""A view's storage offset is an operand of the programs that read and write it, not
part of their key: ``x[i].add_(1)`` for every ``i`` compiles once, and gives PyTorch's
CPU result at every offset, eagerly and through ``torch.compile``."""

from __future__ import annotations

import collections

import pytest
import torch
from tpu_debug.runtime import eager, probes
from tpu_debug.runtime import tensor as tpu_tensor

import tpu_debug


class _Compiles:
    """A probe counting the compiles it hears, by (mode, op or graph)."""

    def __init__(self) -> None:
        self.count: collections.Counter = collections.Counter()

    def on_compile(self, info) -> None:
        self.count[(info.mode, info.name)] += 1


@pytest.fixture
def compiles():
    eager.clear_cache()
    probe = _Compiles()
    probes.subscribe(probe)
    yield probe.count
    probes.unsubscribe(probe)


def _programs(jitted) -> int:
    """Programs a jax.jit function holds (the view reads and writes outside executables)."""
    return jitted._cache_size()


# view -> (one view per offset, all of one shape and strides): (name, make(t, k))
# on a 6x8 base; k takes 4 values
VIEWS = {
    "select": lambda t, k: t[k],
    "slice": lambda t, k: t[k : k + 2],
    "column slice": lambda t, k: t[:, k : k + 3],  # strided: rows of 3, 8 apart
    "step slice": lambda t, k: t[k, ::2],
    "narrow": lambda t, k: t.narrow(1, k, 4),
    "diagonal": lambda t, k: t.diagonal(k),  # 6 elements for offsets 0..2 of a 6x8
    "transposed": lambda t, k: t[k : k + 2].t(),  # a permuted contiguous block
    "as_strided": lambda t, k: t.as_strided((3, 2), (4, 2), 2 * k + 1),
    "select 0-d": lambda t, k: t[1, k],
}
OFFSETS = {"diagonal": (0, 1, 2, 1)}


def _offsets(name):
    return OFFSETS.get(name, (0, 3, 1, 2))


BASE = torch.arange(48, dtype=torch.float32).reshape(6, 8) / 7


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_eager_reads_and_writes_at_every_offset_compile_once(name, compiles):
    make = VIEWS[name]
    cpu, dev = BASE.clone(), BASE.to("tpu")
    for k in _offsets(name):
        # read: an op on the view; write: an in-place op through it, then a copy into it
        torch.testing.assert_close((make(dev, k) * 3).cpu(), make(cpu, k) * 3, rtol=0, atol=0)
        make(cpu, k).mul_(-2).add_(0.25)
        make(dev, k).mul_(-2).add_(0.25)
        make(cpu, k).copy_(make(cpu, k) + 0.5)
        make(dev, k).copy_(make(dev, k) + 0.5)
        # exact: each element goes through the same float32 operations on both sides
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
    for op in ("mul.Tensor", "mul_.Tensor", "add_.Tensor", "add.Tensor"):
        assert compiles[("eager", op)] == 1, (op, dict(compiles))


def test_row_loop_compiles_one_program_and_one_write():
    x_cpu = torch.zeros(16, 8)
    x = x_cpu.to("tpu")
    writes = _programs(tpu_tensor._strided_write)
    probe = _Compiles()
    eager.clear_cache()
    probes.subscribe(probe)
    try:
        for i in range(16):
            x[i].add_(1)
            x_cpu[i].add_(1)
    finally:
        probes.unsubscribe(probe)
    torch.testing.assert_close(x.cpu(), x_cpu, rtol=0, atol=0)
    assert dict(probe.count) == {("eager", "add_.Tensor"): 1}
    assert _programs(tpu_tensor._strided_write) <= writes + 1


def test_host_copy_of_views_at_every_offset_reuses_one_read():
    host = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    dev = host.to("tpu")
    for i in range(8):  # warm: the two read programs of this shape exist
        dev[:, i].cpu(), dev[i, 1:5].cpu()
    reads = _programs(tpu_tensor._strided_read)
    for i in range(8):
        torch.testing.assert_close(dev[:, i].cpu(), host[:, i], rtol=0, atol=0)
        torch.testing.assert_close(dev[i, 1:5].cpu(), host[i, 1:5], rtol=0, atol=0)
    assert _programs(tpu_tensor._strided_read) == reads


def test_view_pattern_keeps_shape_changing_parts_only():
    pattern = tpu_tensor.view_pattern
    assert pattern((4,), (1,), 32) == ("slice",)
    assert pattern((4, 8), (8, 1), 32) == ("whole",)
    assert pattern((4, 1), (1, 99), 32) == ("slice",)  # a size-1 dimension's stride moves nothing
    assert pattern((2, 4), (1, 2), 32) == ("permuted", (1, 0))
    assert pattern((4, 3), (8, 1), 32) == ("strided", (8, 1))
    assert pattern((0, 3), (8, 1), 32) == ("slice",)


# -- compiled mode ------------------------------------------------------------------


def _bump_and_read(v):
    v.mul_(2).add_(1)
    return v.sum(), v * 3


@pytest.mark.parametrize("name", ["select", "column slice", "diagonal", "transposed", "as_strided"])
def test_compiled_view_inputs_at_every_offset(name, compiles):
    make = VIEWS[name]
    fn = torch.compile(_bump_and_read, backend="tpu_debug", dynamic=False)
    cpu, dev = BASE.clone(), BASE.to("tpu")
    reads, writes = _programs(tpu_tensor._strided_read), _programs(tpu_tensor._strided_write)
    for k in _offsets(name):
        want = _bump_and_read(make(cpu, k))
        got = fn(make(dev, k))
        # the same float32 operations on each element; a sum of 6-12 of them may
        # associate differently (a few ulps of values below 50)
        torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0)
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
    graphs = [n for m, n in compiles if m == "compiled"]
    assert len(graphs) == 1 and compiles[("compiled", graphs[0])] == 1, dict(compiles)
    # the view is read into the program and its new value written back: one program each
    assert _programs(tpu_tensor._strided_read) <= reads + 1
    assert _programs(tpu_tensor._strided_write) <= writes + 1


def _write_row(x, i):
    x[i].add_(1)
    return x.narrow(0, i, 2).sum(dim=0)


def test_compiled_offsets_from_a_python_int(compiles):
    fn = torch.compile(_write_row, backend="tpu_debug")
    cpu, dev = BASE.clone(), BASE.to("tpu")
    for i in (0, 3, 1, 4):
        torch.testing.assert_close(fn(dev, i).cpu(), _write_row(cpu, i), rtol=0, atol=0)
    torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)


def test_recompile_advice_does_not_blame_offsets(tmp_path):
    x = torch.arange(256, dtype=torch.float32).reshape(16, 16).to("tpu")
    eager.clear_cache()
    with tpu_debug.trace(logdir=tmp_path / "runs", storm_threshold=2) as session:
        for i in range(8):
            x[i] * 2  # one program
        for step in (1, 2, 3, 4):
            x[:2, ::step][:, :4] * 2  # another gather each time
    groups = {g.identity: g for g in session.recompiles.groups()}
    mul = groups["mul.Tensor"]
    assert (mul.compiles, mul.storm) == (5, True)
    assert mul.changing.what == "arg 0 'self' view"
    assert mul.advice == (
        (
            "arg 0 'self' is a view read in different ways (strided (16, 1), strided (16, 2), strided (16, 3)): "
            "each way (a contiguous slice, a permuted block, a gather with its own strides) is its own program; "
            "take the view the same way each step, or make it .contiguous() before the op (where the view "
            "starts does not matter)"
        ),
    )
