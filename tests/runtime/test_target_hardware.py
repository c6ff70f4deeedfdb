"""The TPU generation table and target specs, checked against XLA's TPU compiler where it can say."""

from __future__ import annotations

import re

import pytest

from tpu_debug.runtime.target import GENERATIONS, TargetSpecError, compile_for_target, parse_target, roofline
from tpu_debug.runtime.target._libtpu import _find_libtpu

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


@pytest.mark.parametrize(
    "spec, name, topology, chips, devices",
    [
        ("v5e", "v5e", "v5e:1x1", 1, 1),
        ("v5e-1", "v5e-1", "v5e:1x1", 1, 1),
        ("v5e-8", "v5e-8", "v5e:2x4", 8, 8),
        ("v5litepod-8", "v5e-8", "v5e:2x4", 8, 8),
        ("V6E-4", "v6e-4", "v6e:2x2", 4, 4),
        ("v6e-8", "v6e-8", "v6e:2x4", 8, 8),
        ("v6e", "v6e", "v6e:1x1", 1, 1),
        # v5p and v4 suffixes count TensorCores, two per chip
        ("v5p-8", "v5p-8", "v5p:2x2x1", 4, 4),
        ("v5p", "v5p", "v5p:1x1x1", 1, 1),
        ("v4-8", "v4-8", "v4:2x2x1", 4, 8),
        ("v4", "v4", "v4:1x1x1", 1, 2),
        ("v5e:2x4", "v5e-8", "v5e:2x4", 8, 8),
        ("v5e:1x2", "v5e:1x2", "v5e:1x2", 2, 2),
        (" v5p:2x2x2 ", "v5p-16", "v5p:2x2x2", 8, 8),
    ],
)
def test_parse_target(spec, name, topology, chips, devices):
    target = parse_target(spec)
    assert (target.name, target.topology, target.chips, target.devices) == (name, topology, chips, devices)
    assert parse_target(target) is target


@pytest.mark.parametrize("spec, bounds", [
    ("v5e", (1, 1, 1)), ("v5e-4", (2, 2, 1)), ("v5e-8", (2, 4, 1)), ("v6e-256", (2, 4, 1)),
    ("v5e:1x2", (1, 2, 1)), ("v5p-8", (2, 2, 1)), ("v5p-128", (2, 2, 1)), ("v4", (1, 1, 1)),
])
def test_hosts_of_a_slice(spec, bounds):
    assert parse_target(spec).chips_per_host_bounds == bounds


def test_per_device_figures_split_a_v4_chip_between_its_cores():
    v4, v5e = parse_target("v4"), parse_target("v5e")
    assert v4.spec_hbm_bytes_per_device == 16 * 1024**3
    assert v4.peak_bf16_flops_per_device == 137.5e12
    assert v5e.spec_hbm_bytes_per_device == 16 * 1024**3 and v5e.peak_int8_ops_per_device == 393e12
    assert parse_target("v5p").peak_int8_ops_per_device is None  # the v5p page gives no int8 figure


@pytest.mark.parametrize("spec", ["v7", "tpu", "", "v5e-3", "v5p-1", "v4-4", "v5e:2x2x2", "v5p:2x2",
                                  "v5e:0x4", "v5e-8-1", "h100"])
def test_junk_target_names_what_is_accepted(spec):
    with pytest.raises(TargetSpecError, match="TPU") as info:
        parse_target(spec)
    assert repr(spec.strip().lower()) in str(info.value) or repr(spec) in str(info.value)
    message = str(info.value)
    assert "use a generation (v4, v5e, v5p, v6e)" in message or " one of " in message
    assert "\n" not in message


def test_junk_target_message_lists_generations_and_slices():
    with pytest.raises(TargetSpecError, match=re.escape(
        "unknown TPU target 'v7x-3': use a generation (v4, v5e, v5p, v6e) for one chip, v4-N with N cores "
        "in {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}; v5e-N with N chips in "
        "{1, 4, 8, 16, 32, 64, 128, 256};"
    )):
        parse_target("v7x-3")
    with pytest.raises(TargetSpecError, match=re.escape(
        "unknown TPU slice 'v5p-4': v5p-N counts cores, N one of 8, 16, 64,"
    )):
        parse_target("v5p-4")
    with pytest.raises(TargetSpecError, match="a TPU target is a string such as 'v5e-8', not int 8"):
        parse_target(8)


def test_every_figure_names_its_public_source():
    for g in GENERATIONS.values():
        assert g.source == f"https://cloud.google.com/tpu/docs/{g.name}"
        assert g.hbm_bytes > 0 and g.peak_bf16_flops > 0 and g.hbm_bandwidth > 0


@requires_libtpu
def test_every_slice_is_a_topology_the_tpu_compiler_accepts():
    from tpu_debug.runtime.target._libtpu import topology

    for g in GENERATIONS.values():
        for count in g.slices:
            target = parse_target(f"{g.name}-{count}")
            devices = topology(target)
            assert len(devices) == target.devices, target
            assert {d.platform for d in devices} == {"tpu"}
        assert len(topology(parse_target(g.name))) == g.devices_per_chip


_AVAILABLE = re.compile(r"exceeds available HBM")


@requires_libtpu
@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_hbm_matches_what_the_compiler_offers_one_device(generation):
    # a program far too big for any chip: the compiler's refusal states the HBM one device
    # offers. It keeps a little for itself (v5e: 15.75 of 16 GiB); v5p's 95.73 GiB is a
    # hair over the page's "95 GiB". So the table's figure is within 5% of the compiler's.
    import jax
    import jax.numpy as jnp

    target = parse_target(generation)
    x = jax.ShapeDtypeStruct((200_000, 200_000), jnp.float32)  # 149 GiB
    result = compile_for_target(lambda a: a + 1, (x,), target)
    assert result.fits is False and result.error.kind == "hbm_oom", result.error
    assert 0.95 <= result.error.available_bytes / target.spec_hbm_bytes_per_device <= 1.01


@requires_libtpu
@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_bf16_peak_agrees_with_the_compilers_cost_model(generation):
    # XLA's TPU cost model times a large bf16 matmul at its own idea of the peak: exactly
    # the published figure for v4 (per core), v5e and v6e; 394 of v5p's published 459
    # TFLOP/s. So the published peak is never below the compiler's, and within 20% of it.
    import jax
    import jax.numpy as jnp

    target = parse_target(generation)
    a = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    result = compile_for_target(lambda x, y: x @ y, (a, a), target)
    model = roofline(result)
    compiler_peak = result.cost.flops / result.cost.optimal_seconds
    assert 0.8 <= compiler_peak / model.peak_flops <= 1.0 + 1e-6, compiler_peak


@requires_libtpu
def test_targets_work_when_jax_loaded_libtpu_first():
    # any jax call on a machine with libtpu probes for a TPU backend and loads libtpu with
    # the environment of that moment; with the lock free (ALLOW_MULTIPLE_LIBTPU_LOAD makes
    # it so here) it loads before the target code can set anything, and assumes 2x2x1
    # hosts: every slice must still be described, a one-chip one included
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import jax\n"
        "jax.devices()\n"
        "from tpu_debug.runtime.target import GENERATIONS, compile_for_target, parse_target\n"
        "from tpu_debug.runtime.target._libtpu import topology\n"
        "for g in GENERATIONS.values():\n"
        "    for spec in [g.name, *(f'{g.name}-{n}' for n in g.slices)]:\n"
        "        t = parse_target(spec)\n"
        "        assert len(topology(t)) == t.devices, spec\n"
        "print(compile_for_target(lambda a: a + 1, (jax.ShapeDtypeStruct((8,), 'float32'),), 'v6e').ok)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    env.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_DEBUG_TARGET_CACHE="off")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
