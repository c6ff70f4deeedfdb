"""The lowering registry (runtime/ops/registry.py, runtime/ops/__init__.py): registration
errors, loading the op families, and the ``precision`` flag that keys eager executables
by the float32 matmul precision."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tpu_debug.core.errors import LoweringError, NoLoweringError, TpuDebugError
from tpu_debug.runtime import eager, ops
from tpu_debug.runtime.config import RuntimeConfig, config
from tpu_debug.runtime.ops import registry

aten = torch.ops.aten


@pytest.fixture
def table(monkeypatch):
    """A private copy of the registry's table, so registrations made here do not leak."""
    monkeypatch.setattr(registry, "_LOWERINGS", dict(registry._LOWERINGS))
    return registry._LOWERINGS


# ---- registration errors ---------------------------------------------------------------------


def test_registering_an_overload_twice_names_both_functions(table):
    before = table[aten.neg.default]

    def my_neg(x):
        return -x

    with pytest.raises(LoweringError, match=r"aten\.neg\.default already lowered by "
                       r"tpu_debug\.runtime\.ops\.elementwise\.neg; .*\.my_neg registers it again"):
        registry.lower(aten.neg.default)(my_neg)
    assert table[aten.neg.default] is before



def test_a_composite_kernel_and_a_lowering_refuse_each_other(table, monkeypatch):
    monkeypatch.setattr(registry, "_COMPOSITES", dict(registry._COMPOSITES))
    split = aten.tensor_split.tensor_indices_or_sections

    def my_split(x, points, dim=0):
        return ()

    with pytest.raises(LoweringError, match=r"aten\.tensor_split\.tensor_indices_or_sections already lowered "
                       r"by tpu_debug\.runtime\.ops\.shape\.tensor_split_tensor; .*\.my_split registers it again"):
        registry.lower(split)(my_split)
    with pytest.raises(LoweringError, match=r"aten\.neg\.default already lowered by "
                       r"tpu_debug\.runtime\.ops\.elementwise\.neg; .*\.my_split registers it again"):
        registry.composite(aten.neg.default)(my_split)
    assert split not in table and aten.neg.default not in registry._COMPOSITES

def test_a_packet_is_refused_and_nothing_is_registered(table):
    free = aten.nonzero_numpy.default  # an overload with no lowering of its own
    assert free not in table

    def fn(x):
        return x

    with pytest.raises(LoweringError, match=r"is not an aten overload; name the overloads it lowers"):
        registry.lower(free, aten.add)(fn)
    assert free not in table  # all or nothing: the valid overload was not registered either


def test_an_unknown_flag_is_refused():
    with pytest.raises(LoweringError, match=r"unknown flag\(s\) precison; the flags are .*precision"):
        registry.lower(aten.neg.default, precison=True)


def test_registry_errors_are_tpu_debug_errors():
    assert issubclass(LoweringError, TpuDebugError)
    # a missing lowering stays a NotImplementedError, as DESIGN.md promises
    assert issubclass(NoLoweringError, TpuDebugError) and issubclass(NoLoweringError, NotImplementedError)


def test_an_unsupported_argument_raises_no_lowering_error():
    with pytest.raises(NoLoweringError, match=r"segment_reduce has no tpu lowering for reduce='median'"):
        registry.lookup(aten.segment_reduce.default).fn(
            jnp.ones((4,)), "median", lengths=jnp.asarray([2, 2])
        )


# ---- loading the families -------------------------------------------------------------------


def test_every_family_is_a_module_that_loads():
    ops.load()
    # `fit` registers lowerings of its own custom ops (runtime/target) when a fit has run in
    # this process: they are not op families
    fns = [low.fn for low in ops.registered().values()] + list(ops.composites().values())
    modules = {fn.__module__.rsplit(".", 1)[1] for fn in fns if fn.__module__.startswith(ops.__name__ + ".")}
    # every lowering or composite kernel of aten's ops lives in a listed family, and every listed
    # family but prims (registered when dynamo runs) holds some
    assert modules <= set(ops.FAMILIES)
    assert set(ops.FAMILIES) - modules <= {"prims"}


def test_a_missing_family_fails_loudly(monkeypatch):
    monkeypatch.setattr(ops, "FAMILIES", ops.FAMILIES + ("no_such_family",))
    monkeypatch.setattr(ops, "_loaded", False)
    with pytest.raises(ModuleNotFoundError, match=r"tpu_debug\.runtime\.ops\.no_such_family"):
        ops.load()


# ---- the precision flag -----------------------------------------------------------------------


def _arrays(*shapes):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


# (overload, a call of its lowering function on float32 arrays)
_READS_PRECISION = [
    (aten.mm.default, lambda f: f(*_arrays((3, 4), (4, 2)))),
    (aten.bmm.default, lambda f: f(*_arrays((2, 3, 4), (2, 4, 2)))),
    (aten.mm.dtype, lambda f: f(*_arrays((3, 4), (4, 2)), torch.float32)),
    (aten.bmm.dtype, lambda f: f(*_arrays((2, 3, 4), (2, 4, 2)), torch.float32)),
    (aten.addmm.default, lambda f: f(*_arrays((3, 2), (3, 4), (4, 2)))),
    (aten.addmm.dtype, lambda f: f(*_arrays((3, 2), (3, 4), (4, 2)), torch.float32)),
    (aten.baddbmm.default, lambda f: f(*_arrays((2, 3, 2), (2, 3, 4), (2, 4, 2)))),
    (aten.baddbmm.dtype, lambda f: f(*_arrays((2, 3, 2), (2, 3, 4), (2, 4, 2)), torch.float32)),
    (aten.addbmm.default, lambda f: f(*_arrays((3, 2), (2, 3, 4), (2, 4, 2)))),
    (aten.addmv.default, lambda f: f(*_arrays((3,), (3, 4), (4,)))),
    (aten.mv.default, lambda f: f(*_arrays((3, 4), (4,)))),
    (aten.dot.default, lambda f: f(*_arrays((4,), (4,)))),
    (aten.vdot.default, lambda f: f(*_arrays((4,), (4,)))),
    (aten.convolution.default, lambda f: f(*_arrays((1, 2, 5, 5), (3, 2, 3, 3)), None, [1, 1], [0, 0], [1, 1],
                                           False, [0, 0], 1)),
    (aten.convolution_backward.default,
     lambda f: f(*_arrays((1, 3, 3, 3), (1, 2, 5, 5), (3, 2, 3, 3)), [3], [1, 1], [0, 0], [1, 1], False,
                 [0, 0], 1, [True, True, True])),
    (aten._foreach_mm.default, lambda f: f(*([a] for a in _arrays((3, 4), (4, 2))))),
]
_READS_NOTHING = [
    (aten.max_pool2d_with_indices.default, lambda f: f(*_arrays((1, 2, 4, 4)), [2, 2])),
    (aten._foreach_add.List, lambda f: f(*([a] for a in _arrays((3,), (3,))))),
    (aten.add.Tensor, lambda f: f(*_arrays((3,), (3,)))),
    (aten.addr.default, lambda f: f(*_arrays((3, 4), (3,), (4,)))),
    (aten.native_layer_norm.default, lambda f: f(*_arrays((2, 4)), [4], None, None, 1e-5)),
    (aten._cdist_forward.default, lambda f: f(*_arrays((30, 3), (30, 3)), 2.0, None)),
    (aten.linalg_cross.default, lambda f: f(*_arrays((3,), (3,)))),
]


@pytest.mark.parametrize("numerics", ["cpu", "tpu"])
@pytest.mark.parametrize("op,call", _READS_PRECISION + _READS_NOTHING,
                         ids=[str(op) for op, _ in _READS_PRECISION + _READS_NOTHING])
def test_precision_flag_is_set_on_exactly_the_lowerings_that_read_it(op, call, numerics, monkeypatch):
    """The flag must match what the function does: a lowering that reads the precision
    without the flag would serve an executable compiled for another precision."""
    reads = []
    for name in ("effective_precision", "product_passes"):
        original = getattr(RuntimeConfig, name)
        def spy(self, _original=original, _name=name):
            reads.append(_name)
            return _original(self)

        monkeypatch.setattr(RuntimeConfig, name, spy)
    monkeypatch.setattr(config, "numerics", numerics)
    lowering = registry.lookup(op)
    call(lowering.fn)
    expected = op in {o for o, _ in _READS_PRECISION}
    assert bool(reads) == expected
    assert lowering.precision == expected


@pytest.fixture
def precision_restored():
    torch_before, config_before = torch.get_float32_matmul_precision(), config.matmul_precision
    yield
    torch.set_float32_matmul_precision(torch_before)
    config.matmul_precision = config_before


def _compiles(prefix):
    return sum(1 for s in eager.cache_stats() if s.op.startswith(prefix))


def test_changing_precision_recompiles_products_only(precision_restored):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    img = torch.randn(1, 2, 6, 6)
    xs, ys = [torch.randn(5), torch.randn(2, 3)], [torch.randn(5), torch.randn(2, 3)]

    def run():
        got_mm = torch.mm(a.to("tpu"), b.to("tpu"))
        got_pool = F.max_pool2d(img.to("tpu"), 2)
        got_add = torch._foreach_add([x.to("tpu") for x in xs], [y.to("tpu") for y in ys])
        # CPU XLA computes float32 products in full precision at every setting, so the
        # results match CPU to float32 rounding of an 8-term dot product
        torch.testing.assert_close(got_mm.cpu(), a @ b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_pool.cpu(), F.max_pool2d(img, 2), rtol=0, atol=0)
        for got, x, y in zip(got_add, xs, ys):
            torch.testing.assert_close(got.cpu(), x + y, rtol=0, atol=0)

    torch.tpu.precision.set("highest")
    eager.clear_cache()
    run()
    assert (_compiles("mm"), _compiles("max_pool2d"), _compiles("_foreach_add")) == (1, 1, 1)
    torch.tpu.precision.set("high")
    run()
    assert _compiles("mm") == 2  # a new executable for the new precision
    assert (_compiles("max_pool2d"), _compiles("_foreach_add")) == (1, 1)
    torch.tpu.precision.set("highest")
    run()
    assert (_compiles("mm"), _compiles("max_pool2d"), _compiles("_foreach_add")) == (2, 1, 1)
