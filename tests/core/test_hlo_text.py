"""The HLO reader (``core/hlo_text.py``) against the compiler, never against itself.

References, none of them the reader's own output:
- XLA's CPU compile of a JAX program in this process: the arrays JAX passed and got back
  (shapes, dtypes), the compiled program's ``memory_analysis()`` and ``cost_analysis()``,
  and Python's own line numbers for the metadata's stack frames;
- XLA's sharding and tile-assignment code in jaxlib (``xla_client.HloSharding``: its parser
  ``from_string`` and its iota ``iota_tile``), for the device lists the iota forms stand for
  (replica groups ``[2,4]<=[4,2]T(1,0)`` are the same iota tile assignment, read in groups of
  its last dimension, as XLA's ``IotaReplicaGroupList`` defines them);
- with libtpu, XLA's TPU compiler on a deviceless v5e-8: the groups each collective must
  have follow from the mesh the test built (the devices that differ only along the axes the
  collective spans), the parameters' shardings from JAX's own ``NamedSharding``, and their
  padded sizes add up to the compiler's argument bytes.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import xla_client as xc
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tpu_debug.core.hlo_text import parse_module, parse_replica_groups, parse_sharding
from tpu_debug.runtime.target._libtpu import _find_libtpu

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)

# XLA's names of the element types the programs below use (xla_data.proto's PrimitiveType)
_HLO_TYPE = {np.dtype(np.float32): "f32", np.dtype(jnp.bfloat16): "bf16", np.dtype(np.bool_): "pred",
             np.dtype(np.int32): "s32", np.dtype(np.int8): "s8"}


def _step(x, w, mask, i):
    y = x @ w.astype(jnp.float32)  # LINE dot
    return jnp.where(mask, y, 0.0).sum(axis=0), i * 2, (y, x[::2].astype(jnp.int8))


_ARGS = (jnp.ones((8, 16), jnp.float32), jnp.ones((16, 4), jnp.bfloat16), jnp.ones((8, 4), jnp.bool_),
         jnp.arange(3, dtype=jnp.int32))


@pytest.fixture(scope="module")
def cpu():
    compiled = jax.jit(_step).lower(*_ARGS).compile()
    return compiled, parse_module(compiled.as_text())


@pytest.mark.quick
def test_parameters_and_results_are_the_arrays_jax_passed_and_got(cpu):
    compiled, module = cpu
    entry = module.entry
    params = sorted((i for i in entry.instructions if i.opcode == "parameter"), key=lambda i: i.parameter_number)
    assert [(p.shape.array.dtype, p.shape.array.dims) for p in params] == [
        (_HLO_TYPE[a.dtype], a.shape) for a in _ARGS]
    outputs = jax.tree.leaves(jax.eval_shape(_step, *_ARGS))
    assert [(a.dtype, a.dims) for a in entry.root.shape.arrays] == [(_HLO_TYPE[o.dtype], o.shape) for o in outputs]
    assert entry.root.shape.is_tuple and module.devices == 1
    # what the compiler's buffer assignment gives the arguments, byte for byte
    assert sum(p.shape.nbytes for p in params) == compiled.memory_analysis().argument_size_in_bytes


def test_the_dots_metadata_leads_to_the_line_that_traced_it(cpu):
    _, module = cpu
    (dot,) = [i for i in module.instructions() if i.opcode == "dot"]
    assert dot.metadata.op_name.endswith("dot_general")
    source = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(source, 1) if text.endswith("# LINE dot"))
    assert dot.metadata.stack_frame_id and module.stack(dot.metadata.stack_frame_id)[0] == (__file__, line, "_step")


def test_every_operand_and_called_computation_is_defined(cpu):
    _, module = cpu
    instructions = list(module.instructions())
    assert len(instructions) == module.text.count(" = ") and module.entry is module.computations[-1]
    for ins in instructions:
        body = module.computation(ins.computation)
        assert all(body.get(name) is not None for name in ins.operands), ins
        assert all(module.computation(name) is not None for name in ins.called), ins
        assert module.text.splitlines()[ins.line].strip().startswith(("ROOT ", "%" + ins.name))


def test_a_dots_flops_are_the_compilers():
    from tpu_debug.core.hlo_text import matmul_flops

    compiled = jax.jit(lambda a, b: a @ b).lower(jnp.ones((8, 16)), jnp.ones((16, 4))).compile()
    module = parse_module(compiled.as_text())
    ((body, dot),) = [(c, i) for c in module.computations for i in c.instructions if i.opcode == "dot"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert matmul_flops(dot, body) == cost["flops"] == 2 * 8 * 16 * 4


# -- the iota forms, against XLA's own tile assignments -------------------------------------------

_IOTAS = [(dims, reshape, perm)
          for reshape in ((8,), (2, 4), (4, 2), (2, 2, 2), (2, 3, 2), (3, 4))
          for perm in itertools.permutations(range(len(reshape)))
          for dims in ((math.prod(reshape) // 2, 2), (2, math.prod(reshape) // 2), (1, math.prod(reshape)))]


def _iota_text(dims, reshape, perm) -> str:
    """As XLA prints an iota: a one-dimensional layout has no transpose."""
    text = f"[{','.join(map(str, dims))}]<=[{','.join(map(str, reshape))}]"
    return text + (f"T({','.join(map(str, perm))})" if len(reshape) > 1 else "")


def test_iota_replica_groups_are_xlas_tile_assignments():
    for dims, reshape, perm in _IOTAS:
        text = _iota_text(dims, reshape, perm)
        # XLA's parser reads the same iota as a sharding's tile assignment: its devices, row-major
        devices = xc.HloSharding.from_string("{devices=" + text + "}").tile_assignment_devices()
        groups = parse_replica_groups(text)
        assert groups.form == "iota", text
        assert groups.groups == tuple(tuple(devices[i:i + dims[-1]]) for i in range(0, len(devices), dims[-1])), text
        assert (groups.size(0), groups.count(0)) == (dims[-1], dims[0]), text


@pytest.mark.quick
def test_shardings_are_read_as_xla_reads_them():
    texts = [f"{{devices={_iota_text(d, r, p)}}}" for d, r, p in _IOTAS[::5]] + [
        "{devices=[2,2]0,3,1,2}", "{replicated}", "{maximal device=3}", "{manual}",
        "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[2,2,2]<=[2,4]T(1,0) last_tile_dims={manual}}",
        "{devices=[1,2,4]<=[2,2,2]T(2,1,0) last_tile_dims={manual, replicated}}",
    ]
    for text in texts:
        xla, mine = xc.HloSharding.from_string(text), parse_sharding(text)
        kind = ("replicated" if xla.is_replicated() else "maximal" if xla.is_maximal() else
                "manual" if xla.is_manual() else "tiled")
        assert mine.kind == kind, text
        devices = tuple(xla.tile_assignment_devices())
        if kind != "tiled":
            assert mine.devices == devices, text
            continue
        assert mine.tiles == tuple(xla.tile_assignment_dimensions()), text
        trailing = len(xla.subgroup_types()) or int(xla.replicate_on_last_tile_dim())
        assert len(mine.last_tile_dims) == trailing, text
        # the devices of one data tile: XLA puts replicas of a tile in an order of its own
        # (its parser sorts them), which says nothing; the sets of each tile must agree
        n = math.prod(mine.tiles[len(mine.data_tiles):])
        assert [set(mine.devices[i:i + n]) for i in range(0, len(devices), n)] == [
            set(devices[i:i + n]) for i in range(0, len(devices), n)], text
        if not trailing:
            assert mine.devices == devices, text
    pair = parse_sharding("{{replicated}, {devices=[2]0,1}}")
    assert [e.kind for e in pair.elements] == ["replicated", "tiled"] and pair.kind == "tuple"


# -- the TPU compiler's collectives, against the mesh the test built -----------------------------


def _mesh_groups(shape: tuple[int, ...], axes: tuple[int, ...]) -> set[tuple[int, ...]]:
    """The groups of devices (positions in the mesh, row-major) that differ only along ``axes``,
    each in the order of those axes (the first named the slowest)."""
    rest = [a for a in range(len(shape)) if a not in axes]
    ids = np.arange(math.prod(shape)).reshape(shape).transpose(rest + list(axes))
    return {tuple(int(d) for d in row) for row in ids.reshape(-1, math.prod(shape[a] for a in axes))}


# (mesh shape, axis names, input spec, output spec, the axes the one collective spans, it gathers
# in their order); XLA prints these in all three forms of replica groups
_GSPMD = [
    ((2, 4), ("x", "y"), lambda a: a.sum(axis=0), P("x", "y"), P("y"), (0,), False),
    ((2, 4), ("x", "y"), lambda a: a.sum(axis=1), P("x", "y"), P("x"), (1,), False),
    ((2, 4), ("x", "y"), lambda a: a * 2, P("x", "y"), P(None, "y"), (0,), True),
    ((2, 2, 2), ("x", "y", "z"), lambda a: a.sum(axis=0), P(("x", "z"), "y"), P("y"), (0, 2), False),
    ((2, 2, 2), ("x", "y", "z"), lambda a: a * 2, P(("z", "x"), "y"), P(None, "y"), (2, 0), True),
    ((2, 2, 2), ("x", "y", "z"), lambda a: a * 2, P("x", ("z", "y")), P("x", None), (2, 1), True),
]


@pytest.fixture
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


@requires_libtpu
def test_replica_groups_of_the_tpu_compiler_are_the_meshs(_private_cache):
    from tpu_debug.runtime.target import compile_for_target, target_mesh

    forms = set()
    for shape, names, fn, spec, out, axes, ordered in _GSPMD:
        mesh = target_mesh("v5e-8", shape, names)
        arg = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=NamedSharding(mesh, spec))
        result = compile_for_target(jax.jit(fn, out_shardings=NamedSharding(mesh, out)), (arg,), "v5e-8")
        assert result.ok, result.error
        module = parse_module(result.hlo)
        (collective,) = [i for i in module.instructions() if i.replica_groups is not None]
        groups = collective.replica_groups
        forms.add(groups.form)
        expected = _mesh_groups(shape, axes)
        if ordered:  # a gather's group lists its shards' devices in order
            assert set(groups.resolved(module.devices)) == expected, (groups.text, spec)
        else:
            assert {frozenset(g) for g in groups.resolved(module.devices)} == {frozenset(g) for g in expected}
        # the parameter: XLA's sharding of it as JAX gives it, and its per-device shape
        (param,) = [i for i in module.entry.instructions if i.opcode == "parameter"]
        xla = NamedSharding(mesh, spec)._to_xla_hlo_sharding(2)
        assert param.sharding.tiles == tuple(xla.tile_assignment_dimensions())
        assert param.sharding.devices == tuple(xla.tile_assignment_devices())
        assert param.shape.array.dims == NamedSharding(mesh, spec).shard_shape((64, 512))
    # the compiler printed each form here: each was read against what the mesh says
    assert forms == {"mesh", "iota"}, forms


def _shard_map_body(a, b):
    total = jax.lax.psum(a, "y")
    gathered = jax.lax.all_gather(b, "x", tiled=True)
    swapped = jax.lax.ppermute(b, "x", perm=[(0, 1), (1, 0)])
    return total, gathered, swapped


@requires_libtpu
def test_explicit_groups_pairs_and_padded_parameters_of_a_shard_map(_private_cache):
    from tpu_debug.runtime.target import compile_for_target, target_mesh
    from tpu_debug.runtime.target.layout import padded_bytes

    mesh = target_mesh("v5e-8", (2, 4), ("x", "y"))
    fn = jax.shard_map(_shard_map_body, mesh=mesh, in_specs=(P("x", "y"), P("x", None)),
                       out_specs=(P("x", "y"), P(None, None), P("x", None)), check_vma=False)
    args = (jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=NamedSharding(mesh, P("x", "y"))),
            jax.ShapeDtypeStruct((32, 100), jnp.bfloat16, sharding=NamedSharding(mesh, P("x", None))))
    result = compile_for_target(jax.jit(fn), args, "v5e-8")
    assert result.ok, result.error
    module = parse_module(result.hlo)
    found = {}
    for ins in module.instructions():
        if ins.replica_groups is not None or ins.source_target_pairs is not None:
            found[ins.opcode.removesuffix("-start")] = ins
    assert found["all-reduce"].replica_groups.form == "list"
    assert set(found["all-reduce"].replica_groups.groups) == _mesh_groups((2, 4), (1,))
    assert set(found["all-gather"].replica_groups.groups) == _mesh_groups((2, 4), (0,))
    # ppermute over x: each device sends to the device of the other x with its y
    positions = np.arange(8).reshape(2, 4)
    assert set(found["collective-permute"].source_target_pairs) == {
        (int(positions[s, y]), int(positions[t, y])) for s, t in [(0, 1), (1, 0)] for y in range(4)}
    # per device: a quarter of a's columns and half its rows; half of b's rows, whole rows
    params = sorted((i for i in module.entry.instructions if i.opcode == "parameter"),
                    key=lambda i: i.parameter_number)
    assert [p.shape.array.dims for p in params] == [(32, 128), (16, 100)]
    assert all(p.shape.array.layout.tiles for p in params)
    # the tiles' padded sizes (b's 100 columns take 128) are what the compiler gives the arguments
    padded = sum(padded_bytes(a.dtype, a.dims, a.layout) for p in params for a in p.shape.arrays)
    assert padded == result.memory.argument_bytes
    assert padded > sum(p.shape.nbytes for p in params)


@requires_libtpu
def test_a_pallas_kernels_custom_call_printed_over_several_lines_is_one_instruction(_private_cache):
    # a splash attention kernel prints its kernel metadata as a JSON object with newlines; the
    # lines after the first start at column 0, one of them with "}}", as a computation's end
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from tpu_debug.runtime.target import compile_for_target

    def attend(q, k, v):
        kernel = sk.make_splash_mha(sm.MultiHeadMask([sm.CausalMask((512, 512))] * 2), head_shards=1,
                                    q_seq_shards=1)
        return kernel(q, k, v).sum()

    x = jax.ShapeDtypeStruct((2, 512, 128), jnp.bfloat16)
    hlo = compile_for_target(attend, (x, x, x), "v5e").hlo
    assert any(line.startswith("}}") for line in hlo.splitlines())
    module = parse_module(hlo)
    # every instruction the compiler printed, the sum after the kernel too, in its computation
    printed = [line.split("=", 1)[0].split("%", 1)[1].strip() for line in hlo.splitlines()
               if line.startswith("  ") and " = " in line and "%" in line.split("=", 1)[0]]
    assert sorted(i.name for i in module.instructions()) == sorted(printed)
    (kernel,) = [i for i in module.instructions() if i.opcode == "custom-call" and "splash" in i.name]
    assert kernel.attr("custom_call_target") == '"tpu_custom_call"'
    assert module.entry.root is not None and module.entry.root.opcode != "custom-call"
