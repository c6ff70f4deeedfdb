"""``torch.accelerator``'s memory functions on the `tpu` device (runtime/accelerator.py over
runtime/memory_ledger.py's allocator statistics).

The oracles are sizes PyTorch states itself: a 1 MiB float32 tensor, and the ``nbytes()`` of
the storages a module's parameters hold; and the ledger's own live bytes.
"""

from __future__ import annotations

import gc
import os

import jax
import pytest
import torch
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime import accelerator, memory_ledger, probes

MIB = 1 << 20
acc = torch.accelerator


@pytest.fixture(autouse=True, scope="module")
def _counting_stopped_after():
    """Counting, once asked for, goes on for the rest of the process (as an allocator's): the
    tests of this file stop it at its end, so later tests find memory tracking as they left it."""
    yield
    memory_ledger.stop_counting()


@pytest.fixture(autouse=True)
def _device_used(tpu):
    torch.ones(1, device=tpu)  # the first kernel claims PyTorch's accelerator
    gc.collect()


def test_a_mebibyte_tensor_raises_allocated_by_its_bytes_and_its_free_keeps_the_peak(tpu):
    base = acc.memory_allocated()
    x = torch.ones(MIB // 4, dtype=torch.float32, device=tpu)
    assert acc.memory_allocated() - base == MIB
    assert acc.max_memory_allocated() >= base + MIB
    del x
    assert acc.memory_allocated() == base
    assert acc.max_memory_allocated() >= base + MIB
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == base


def test_a_module_s_parameters_count_their_storages_bytes(tpu):
    base = acc.memory_allocated()
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(tpu)
    held = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert held == 4 * (64 * 32 + 32 + 32 * 8 + 8)
    assert acc.memory_allocated() - base == held
    del model
    assert acc.memory_allocated() == base


def test_the_peak_is_the_most_held_at_once_inside_a_step(tpu):
    x = torch.ones(MIB // 4, device=tpu)
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    for _ in range(3):
        y = x * 2  # a second mebibyte while x lives
        del y
    assert acc.memory_allocated() == before
    assert acc.max_memory_allocated() == before + MIB


def test_the_figures_are_the_ledger_s_and_reserved_is_what_is_allocated(tpu):
    x = torch.ones(1000, device=tpu)
    stats = acc.memory_stats()
    assert sorted(stats) == sorted(f"{kind}_bytes.all.{field}" for kind in ("allocated", "reserved")
                                   for field in ("allocated", "current", "freed", "peak"))
    assert stats["allocated_bytes.all.current"] == memory_ledger.live_bytes() == acc.memory_allocated()
    assert stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"] == \
        stats["allocated_bytes.all.current"]
    assert acc.memory_reserved() == acc.memory_allocated()
    assert acc.max_memory_reserved() == acc.max_memory_allocated()
    del x


def test_reset_accumulated_zeroes_the_totals_and_keeps_current_and_peak(tpu):
    x = torch.ones(MIB // 4, device=tpu)
    acc.reset_accumulated_memory_stats()
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    assert stats["allocated_bytes.all.current"] == acc.memory_allocated() >= MIB
    y = torch.ones(MIB // 4, device=tpu)
    del y
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == MIB
    del x


def test_counting_goes_on_when_another_memory_probe_comes_and_goes(tpu):
    acc.memory_allocated()
    # the ledger counts without a probe: the runtime's paths stay those of an unobserved run
    assert probes._probes == ()

    class Other:
        def on_alloc(self, info):
            pass

    other = Other()
    probes.subscribe(other)
    probes.unsubscribe(other)
    assert memory_ledger.active() is not None
    base = acc.memory_allocated()
    x = torch.ones(MIB // 4, device=tpu)
    assert acc.memory_allocated() - base == MIB
    del x


def test_caches_have_nothing_to_release_and_the_process_survives():
    before = acc.memory_allocated()
    acc.empty_cache()
    acc.empty_host_cache()  # PyTorch's C++ entry point crashes the process on a Python backend
    assert acc.memory_allocated() == before


def test_memory_info_is_the_device_capacity_or_on_cpu_the_host_s():
    free, total = acc.get_memory_info()
    assert 0 < free <= total
    if jax.local_devices()[0].memory_stats() is None:
        assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_device_arguments_name_tpu_0():
    assert acc.memory_allocated("tpu:0") == acc.memory_allocated(0) == acc.memory_allocated(torch.device("tpu", 0))
    with pytest.raises(TpuArgumentError, match=r"^tpu:1 requested; the eager runtime runs on tpu:0 \(use "
                                               r"tpu_debug.runtime.distributed for multi-device meshes\)$"):
        acc.max_memory_allocated(1)
    with pytest.raises(ValueError, match=r"^cuda doesn't match the current accelerator tpu.$"):
        acc.memory_allocated("cuda")


def test_before_the_script_uses_tpu_they_answer_as_without_an_accelerator(monkeypatch):
    monkeypatch.setattr(accelerator, "_claimed", False)
    message = (r"^Cannot access accelerator device when none is available. \(the tpu device becomes "
               r"PyTorch's accelerator when the script first uses it: make a tpu tensor first\)$")
    for call in (acc.memory_allocated, acc.max_memory_allocated, acc.memory_stats, acc.reset_peak_memory_stats,
                 acc.empty_cache, acc.empty_host_cache):
        with pytest.raises(RuntimeError, match=message):
            call()
