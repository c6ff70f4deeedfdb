"""The HBM a target offers a program is the TPU compiler's figure, not the spec sheet's.

The reference is always XLA's TPU compiler itself: a JAX program compiled in the test
(deviceless, for the target's topology) is accepted or refused, and the figure or fit
verdict under test must agree with that.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

import tpu_debug
from tpu_debug.runtime.target import hbm_capacity, parse_target
from tpu_debug.runtime.target._libtpu import _find_libtpu, topology

GiB = 1024**3
pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


def _compiler_accepts(spec: str, shapes: list[tuple[tuple[int, ...], jnp.dtype]]) -> bool:
    """Whether XLA's TPU compiler accepts a program holding these arrays (reading a little
    of the first), compiled straight through JAX for one device of ``spec``."""
    device = topology(parse_target(spec))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes]
    try:
        # every array kept as an argument (jit drops unused ones by default)
        jax.jit(lambda *xs: xs[0][:8], keep_unused=True).lower(*args).compile()
    except jax.errors.JaxRuntimeError as exc:
        assert "RESOURCE_EXHAUSTED" in str(exc) and "HBM" in str(exc), exc
        return False
    return True


@pytest.mark.parametrize("spec", ["v5e", "v6e", "v4"])
def test_the_capacity_is_where_the_compiler_starts_refusing(spec):
    target = parse_target(spec)
    usable, source = hbm_capacity(target)
    assert source == "compiler"
    # one float32 array of (n, 128), n a multiple of 8: no tile padding. 64 KiB either side
    # of the figure covers the program's code (~40 KB) and the figure's 4 KiB step
    below, above = (usable - 64 * 1024) // 512 // 8 * 8, (usable + 64 * 1024) // 512 // 8 * 8
    assert _compiler_accepts(spec, [((below, 128), jnp.float32)])
    assert not _compiler_accepts(spec, [((above, 128), jnp.float32)])
    assert usable < target.spec_hbm_bytes_per_device


# totals between the compiler's limit and the spec sheet's (16 GiB v5e, 32 GiB v6e), and
# just under the compiler's limit
@pytest.mark.parametrize("spec, total_gib, dtype", [
    ("v5e", 15.9, torch.float32), ("v5e", 15.9, torch.bfloat16), ("v5e", 15.6, torch.float32),
    ("v6e", 31.6, torch.float32), ("v6e", 31.6, torch.bfloat16), ("v6e", 31.0, torch.bfloat16),
])
def test_a_dry_runs_fit_verdict_is_the_compilers(spec, total_gib, dtype):
    itemsize = torch.empty((), dtype=dtype).element_size()
    # three (rows, 1024) tensors, rows a multiple of 64: whole TPU tiles in either dtype
    rows = int(total_gib * GiB / 3 / (1024 * itemsize)) // 64 * 64
    shapes = [(rows, 1024)] * 3

    def step():
        held = [torch.empty(shape, dtype=dtype, device="tpu") for shape in shapes]
        del held  # returned, the outputs would be materialized on the host by a failing assert's repr

    result = tpu_debug.dry_run(step, target=spec)
    fits, rendered = result.fits, result.render()
    jax_dtype = jnp.float32 if dtype == torch.float32 else jnp.bfloat16
    accepted = _compiler_accepts(spec, [(shape, jax_dtype) for shape in shapes])
    assert fits is accepted
    spec_fits = 3 * rows * 1024 * itemsize <= parse_target(spec).spec_hbm_bytes_per_device
    assert spec_fits  # so the spec sheet's figure would have said "fits" every time
    if total_gib in (15.9, 31.6):
        assert not accepted and "does NOT fit" in rendered


def test_v4_figures_say_they_are_one_tensorcores():
    # the deviceless v4 topology has a device per TensorCore, two per chip; a v4 VM's JAX shows
    # one megacore device per chip, so the figures say which device they are for
    v4, v5e = parse_target("v4"), parse_target("v5e")
    assert len(topology(v4)) == 2 and len(topology(v5e)) == 1
    assert v4.device_kind.startswith("TensorCore, 1/2 chip") and "megacore" in v4.device_kind
    assert v5e.device_kind == "chip"
    assert v4.spec_hbm_bytes_per_device == 16 * GiB  # half of the chip's 32 GiB
