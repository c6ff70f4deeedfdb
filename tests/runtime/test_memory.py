"""Memory tracking (runtime/memory_ledger.py): the bytes `tpu` tensors hold, each payload once.

The oracle is PyTorch on CPU: the same program run on CPU tensors holds storages whose
``nbytes()`` add up to what the ledger says the `tpu` tensors hold.
"""

from __future__ import annotations

import contextlib
import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime import memory_ledger as memory
from tpu_debug.runtime import probes, tensor


class Heard:
    """A memory probe that keeps its own total from the notifications alone."""

    def __init__(self) -> None:
        self.live = 0
        self.storages: dict[int, int] = {}
        self.new = 0
        self.existing = 0

    def on_alloc(self, info):
        if info.new:
            self.new += 1
            self.existing += info.existing
            self.storages[info.storage] = 0
        elif info.storage not in self.storages:
            raise AssertionError(f"bytes charged to unknown storage {info.storage}")
        self.storages[info.storage] += info.nbytes
        self.live += info.nbytes

    def on_free(self, info):
        self.storages[info.storage] -= info.nbytes
        self.live -= info.nbytes
        assert self.storages[info.storage] >= 0
        if info.dead:
            del self.storages[info.storage]


@contextlib.contextmanager
def tracking(*, freeze: bool = True):
    """Memory tracked around the block, from a collected heap (another test's garbage
    collected during the block would move the baseline). With ``freeze``, what exists once
    the probe has heard it is frozen out of the collector for the block: ``live()``'s
    collections walk only what the block made, not the whole heap of a worker that ran
    hundreds of tests before (about a second each). (A probe subscribing inside a frozen
    block would not find the frozen tensors: ``gc.get_objects()`` leaves them out.)"""
    gc.collect()
    heard = Heard()
    probes.subscribe(heard)
    if freeze:
        gc.freeze()
    try:
        yield heard
    finally:
        if freeze:
            gc.unfreeze()
        probes.unsubscribe(heard)


def live() -> int:
    # an op that raised and caught an error inside (a meta kernel PyTorch lacks, say) leaves
    # a reference cycle through its frames, holding its arguments until a collection
    gc.collect()
    return memory.live_bytes()


def test_nothing_is_registered_without_a_memory_probe():
    assert memory.active() is None and tensor._track is None
    with tracking():
        assert memory.active() is not None and tensor._track is not None
    assert memory.active() is None and tensor._track is None


def test_live_bytes_follow_allocations_and_frees():
    with tracking() as heard:
        base = live()
        x = torch.zeros(256, 1024, device="tpu")  # 1 MiB
        assert live() - base == x.untyped_storage().nbytes() == 256 * 1024 * 4
        y = x * 2
        v = y.view(-1)[::2]  # a view holds its base's storage: no new bytes
        assert live() - base == 2 * 256 * 1024 * 4
        x.add_(1)  # an in-place op replaces the payload of a storage that alone holds it
        assert live() - base == 2 * 256 * 1024 * 4
        del y
        assert live() - base == 2 * 256 * 1024 * 4  # the view keeps the storage
        del v
        assert live() - base == 256 * 1024 * 4
        del x
        assert live() == base
        assert heard.live == live()  # the probe's own sum from the notifications agrees


def test_a_shared_payload_is_charged_once_until_a_write_splits_it():
    with tracking() as heard:
        base = live()
        x = torch.ones(1000, device="tpu", dtype=torch.float64)
        twin = copy.deepcopy(x)  # UntypedStorage.clone shares the immutable payload
        assert live() - base == 8000
        x.mul_(3)  # x gets a payload of its own; the old one stays with the twin
        assert live() - base == 16000
        del x
        assert live() - base == 8000
        twin_storage = twin.untyped_storage()
        del twin
        assert live() - base == 8000  # the storage object still holds it
        del twin_storage
        assert live() == base
        assert heard.live == live()


def test_a_probe_subscribing_late_hears_what_is_held_as_existing():
    x = torch.zeros(1000, device="tpu")
    with tracking(freeze=False) as first:
        second = Heard()
        probes.subscribe(second)
        try:
            assert second.existing >= 1 and first.existing >= 1
            assert second.live == first.live == live()
            assert any(n == 4000 for n in second.storages.values())
        finally:
            probes.unsubscribe(second)
    del x


def test_a_training_step_holds_what_pytorch_on_cpu_holds():
    """Parameters, gradients, AdamW state and the batch, eagerly and with a compiled step
    (whose forward returns parameters it saves for backward as tensors of their own)."""

    def train(device, compiled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        x = torch.randn(32, 64).to(device)
        y = torch.randint(0, 10, (32,)).to(device)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss.detach()

        if compiled:
            import tpu_debug

            step = tpu_debug.compile(step)
        for _ in range(2):
            step(x, y)
            opt.step()
        held = [*model.parameters(), *(p.grad for p in model.parameters()), x, y]
        # AdamW's step counts stay on the host unless capturable: not the device's
        held += [t for s in opt.state.values() for k, t in s.items() if k != "step"]
        storages = {t.untyped_storage().data_ptr() if device == "cpu" else id(t.untyped_storage()):
                    t.untyped_storage().nbytes() for t in held if t.device.type == device}
        return sum(storages.values()), (model, opt, x, y)

    for compiled in (False, True):
        expected, _cpu = train("cpu", False)
        with tracking() as heard:
            base = live()
            got, keep = train("tpu", compiled)
            assert got == expected
            assert live() - base == expected, f"compiled={compiled}"
            assert heard.live == live()
            del keep


@pytest.fixture(scope="module")
def traced_step():
    """One SGD step traced by the memory tracer: (its summary, its steps), read by each phase's test."""
    from tpu_debug.tracers.recording.memory_tracker import MemoryTracer

    gc.collect()
    tracer = MemoryTracer()
    tracer.start()
    probes.subscribe(tracer)
    try:
        w = torch.zeros(512, 512, device="tpu", requires_grad=True)  # 1 MiB, line A
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        loss = (w * 2).sum()
        loss.backward()
        opt.step()  # the momentum buffer: allocated by the optimizer
        del loss
        summary = tracer.close()
    finally:
        probes.unsubscribe(tracer)
    return summary, tracer.steps


@pytest.mark.parametrize("phase", ["backward", "optimizer"])
def test_the_memory_tracer_tells_phases_and_lines(phase, traced_step):
    summary, steps = traced_step
    holders = summary.holders
    assert holders, "the peak has holders"
    lines = {(h.line, h.phase) for h in holders if h.file == __file__}
    assert any(p == phase for _, p in lines), lines
    first_step = steps[0]
    assert first_step.peak_bytes >= first_step.live_bytes
    assert summary.peak_bytes == max(s.peak_bytes for s in steps)
