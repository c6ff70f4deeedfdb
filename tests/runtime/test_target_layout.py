"""TPU layouts: the parser, the padded sizes, and both checked against the TPU compiler's own HLO."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from tpu_debug.runtime.target import compile_for_target, padded_bytes, padding_report, parse_layout
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tpu_debug.runtime.target.layout import TiledLayout

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("{1,0:T(8,128)}", TiledLayout((1, 0), ((8, 128),))),
        ("{1,0:T(8,128)(2,1)}", TiledLayout((1, 0), ((8, 128), (2, 1)))),
        ("{0,1:T(32,128)(4,1)}", TiledLayout((0, 1), ((32, 128), (4, 1)))),
        ("{0:T(512)(128)(4,1)}", TiledLayout((0,), ((512,), (128,), (4, 1)))),
        ("{:T(128)}", TiledLayout((), ((128,),))),
        ("{1,0:T(8,128)(8,1)E(4)}", TiledLayout((1, 0), ((8, 128), (8, 1)), element_bits=4)),
        ("{1,0:T(8,128)S(1)}", TiledLayout((1, 0), ((8, 128),), memory_space=1)),
        ("{:S(2)}", TiledLayout((), (), memory_space=2)),
        ("{2,1,0}", TiledLayout((2, 1, 0))),
        ("3,0,2,1:T(2,128)", TiledLayout((3, 0, 2, 1), ((2, 128),))),
    ],
)
def test_parse_layout(text, parsed):
    assert parse_layout(text) == parsed
    if text.startswith("{"):
        assert str(parsed) == text


@pytest.mark.parametrize(
    "dtype, shape, layout, expected",
    [
        ("f32", (64, 100), "{1,0:T(8,128)}", 64 * 128 * 4),  # 100 -> 128: 22% padding
        ("f32", (64, 128), "{1,0:T(8,128)}", 64 * 128 * 4),  # none
        ("f32", (3, 100), "{1,0:T(8,128)}", 8 * 128 * 4),  # 3 rows fill an 8-row tile
        ("f32", (3, 100), "{1,0:T(4,128)}", 4 * 128 * 4),
        ("f32", (1000, 100), "{0,1:T(8,128)}", 104 * 1024 * 4),  # dim 0 minor: 100 -> 104, 1000 -> 1024
        ("f32", (2, 3, 5, 7), "{3,0,2,1:T(2,128)}", 3 * 5 * 2 * 128 * 4),  # physical [3,5,2,7]
        ("f32", (), "{:T(128)}", 128 * 4),
        ("bf16", (7,), "{0:T(256)(128)(2,1)}", 256 * 2),
        ("bf16", (1, 1), "{1,0:T(2,128)(2,1)}", 2 * 128 * 2),
        ("s8", (128, 128), "{1,0:T(32,128)(4,1)}", 128 * 128),
        ("s8", (5, 3, 100), "{2,1,0:T(4,128)(4,1)}", 5 * 4 * 128),
        ("pred", (7,), "{0:T(512)(128)(4,1)}", 512),
        ("s4", (3, 100), "{1,0:T(8,128)(8,1)E(4)}", 8 * 128 // 2),
        ("f32", (10, 10), "{1,0}", 400),  # untiled (a CPU layout): no padding
    ],
)
def test_padded_bytes(dtype, shape, layout, expected):
    assert padded_bytes(dtype, shape, layout) == expected


def test_a_layout_not_understood_has_no_padded_size():
    assert padded_bytes("f32", (8, 8), "{1,0:T(*,128)}") is None
    assert padded_bytes("f32", (8, 8, 8), "{1,0:T(8,128)}") is None  # rank mismatch
    assert padded_bytes("x99", (8,), "{0:T(128)}") is None


_SHAPES = [(3, 100), (1000, 100), (128, 128), (7,), (5, 3, 100), (2, 3, 5, 7), (), (1, 1), (100, 3),
           (33, 129, 7)]


@requires_libtpu
@pytest.mark.parametrize("target", ["v5e", "v6e"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_, jnp.int4, jnp.int64])
def test_padded_parameters_add_up_to_the_compilers_argument_bytes(target, dtype):
    # the TPU compiler picks each parameter's layout (tiles shrink for small dims:
    # f32[3,100] gets T(4,128)); its buffer assignment then sizes the arguments. The sizes
    # this module computes from the printed layouts must add up to exactly that.
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape in _SHAPES]

    def fn(*xs):
        return [jnp.logical_not(x) if x.dtype == jnp.bool_ else x + x for x in xs]

    result = compile_for_target(fn, args, target, x64=True)
    assert result.ok, result.error
    params = padding_report(result.hlo).parameters
    assert len(params) == len(_SHAPES)
    assert sum(p.padded_bytes for p in params) == result.memory.argument_bytes
    for p in params:
        assert p.padded_bytes >= p.logical_bytes


def _layer(x, w):
    h = jnp.tanh(x @ w)
    return h, h.T @ x


def _param(report, name):
    return next(b for b in report.parameters if b.name.startswith(name))


@requires_libtpu
def test_a_100_wide_layer_wastes_22_percent_and_a_128_wide_one_none():
    waste = {}
    for width in (100, 128):
        args = (jax.ShapeDtypeStruct((64, width), jnp.float32),
                jax.ShapeDtypeStruct((width, width), jnp.float32))
        result = compile_for_target(_layer, args, "v5e")
        report = padding_report(result.hlo)
        x = _param(report, "x")
        assert str(x.layout) == "{1,0:T(8,128)}"  # what XLA picks for a [64, width] activation
        waste[width] = x.waste
        assert report.padded_bytes >= report.logical_bytes
    assert waste[100] == pytest.approx(1 - 100 / 128)
    assert waste[128] == 0


@requires_libtpu
def test_a_batch_of_3_is_padded_to_the_tiles_rows():
    args = (jax.ShapeDtypeStruct((3, 128), jnp.float32), jax.ShapeDtypeStruct((128, 128), jnp.float32))
    report = padding_report(compile_for_target(_layer, args, "v5e").hlo)
    x = _param(report, "x")
    rows = x.layout.tiles[0][0]  # XLA picks T(4,128) for 3 rows here; an 8-row tile is the most
    assert 3 <= rows <= 8
    assert x.padded_bytes == math.ceil(3 / rows) * rows * 128 * 4
    assert x.waste == pytest.approx(1 - 3 / rows)


@requires_libtpu
def test_worst_buffers_and_async_copies_counted_once():
    args = (jax.ShapeDtypeStruct((64, 100), jnp.float32), jax.ShapeDtypeStruct((100, 100), jnp.float32))
    result = compile_for_target(_layer, args, "v5e")
    report = padding_report(result.hlo)
    names = [b.name for b in report.buffers]
    assert len(names) == len(set(names))  # a copy-start's operand is not listed again
    assert not any(b.opcode.endswith("-start") for b in report.buffers)
    worst = report.worst(2)
    wasted = [b.padded_bytes - b.logical_bytes for b in worst]
    assert wasted and wasted == sorted(wasted, reverse=True)
    assert all(b.layout.memory_space == 0 for b in report.buffers)
    everything = padding_report(result.hlo, include_aliasing=True)
    assert len(everything.buffers) >= len(report.buffers)
