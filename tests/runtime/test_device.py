"""The tpu device itself: registration, factories, movement, scalars, printing."""

from __future__ import annotations

import copy
import importlib.metadata
import os
import subprocess
import sys

import pytest
import torch

import tpu_debug
from tpu_debug import runtime


def test_install_is_idempotent():
    assert runtime.installed()
    assert runtime.install() is False


@pytest.mark.quick
def test_device_basics(tpu):
    t = torch.ones(2, 3, device="tpu")
    assert t.device == torch.device("tpu", 0)
    assert t.is_tpu and not torch.ones(1).is_tpu
    assert str(t.device) == "tpu:0"


def test_torch_tpu_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert torch.tpu.get_device_name().startswith("XLA ")
    torch.tpu.synchronize()


@pytest.mark.parametrize(
    "factory",
    [
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.ones(4, dtype=torch.int64, device=d),
        lambda d: torch.full((2, 2), 3.5, device=d),
        lambda d: torch.full((2,), 7, device=d),
        lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(1.0, 4.0, 0.5, device=d),
        lambda d: torch.arange(0, 10, 3, dtype=torch.float32, device=d),
        lambda d: torch.empty(0, 3, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.tensor(2.5, device=d),
        lambda d: torch.zeros_like(torch.ones(3, dtype=torch.bfloat16, device=d)),
        lambda d: torch.ones_like(torch.ones(3, device=d), dtype=torch.int32),
        lambda d: torch.full_like(torch.ones(2, 2, device=d), 9.0),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.linspace(0, 1, 5, device=d),
    ],
)
def test_factories_match_cpu(factory):
    ref = factory("cpu")
    out = factory("tpu")
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref)


def test_empty_has_right_metadata():
    t = torch.empty(3, 4, dtype=torch.float16, device="tpu")
    assert t.shape == (3, 4) and t.dtype == torch.float16 and t.device.type == "tpu"
    s = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert s.stride() == (1, 2)
    s.copy_(torch.arange(6.0).reshape(2, 3))
    torch.testing.assert_close(s.cpu(), torch.arange(6.0).reshape(2, 3))


@pytest.mark.quick
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
     torch.int16, torch.int8, torch.uint8, torch.bool],
)
def test_round_trip_every_dtype(dtype):
    src = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    d = src.to("tpu")
    assert d.dtype == dtype
    back = d.cpu()
    assert back.dtype == dtype
    torch.testing.assert_close(back, src)


def test_int64_and_float64_are_not_downcast():
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    torch.testing.assert_close((big.to("tpu") + 1).cpu(), big + 1)
    precise = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    torch.testing.assert_close((precise.to("tpu") * 3).cpu(), precise * 3)


def test_to_and_tpu_method_and_module_to():
    t = torch.randn(3)
    assert t.tpu().device.type == "tpu"
    assert t.to(torch.device("tpu")).device.type == "tpu"
    m = torch.nn.Linear(3, 2).to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())


def test_module_to_keeps_tied_weights_and_parameter_objects():
    """``module.to("tpu")`` moves each Parameter in place, as ``.to("cuda")`` does: a weight
    two modules share (an embedding tied to an LM head) stays one Parameter, an optimizer
    made before the move holds the moved parameters, and the tied weight's gradient sums both
    uses, as on CPU."""
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6, bias=False)
    head.weight = emb.weight
    cpu = torch.nn.ModuleDict({"emb": emb, "head": head})
    dev = copy.deepcopy(cpu)
    before = list(dev.parameters())
    opt = torch.optim.SGD(dev.parameters(), lr=0.1)
    dev.to("tpu")
    assert dev["head"].weight is dev["emb"].weight
    assert [p.device.type for p in opt.param_groups[0]["params"]] == ["tpu"]
    assert all(a is b for a, b in zip(dev.parameters(), before))
    ids = torch.tensor([[0, 3, 5, 3]])
    for model, x in ((cpu, ids), (dev, ids.to("tpu"))):
        model["head"](model["emb"](x)).log_softmax(-1).sum().backward()
    # a 4-term dot product and a softmax over 6 logits per row: float32 rounding only
    torch.testing.assert_close(dev["emb"].weight.grad.cpu(), cpu["emb"].weight.grad, rtol=1e-5, atol=1e-6)
    opt.step()
    dev.to("cpu")
    assert dev["head"].weight is dev["emb"].weight and dev["emb"].weight.device.type == "cpu"
    with torch.no_grad():
        expected = cpu["emb"].weight - 0.1 * cpu["emb"].weight.grad
    torch.testing.assert_close(dev["emb"].weight.detach(), expected, rtol=1e-5, atol=1e-6)


def test_to_dtype_on_device():
    t = torch.tensor([1.7, -2.2, 3.9])
    torch.testing.assert_close(t.to("tpu").to(torch.int32).cpu(), t.to(torch.int32))
    torch.testing.assert_close(t.to("tpu").double().cpu(), t.double())


def test_item_tolist_bool_float_int():
    t = torch.tensor([[1.5, -2.0], [0.0, 4.25]])
    d = t.to("tpu")
    assert d[0, 0].item() == 1.5 and isinstance(d[0, 0].item(), float)
    assert d.tolist() == t.tolist()
    assert bool(d[0, 0]) is True and bool(d[1, 0]) is False
    assert float(d[1, 1]) == 4.25 and int(d[0, 1]) == -2
    if d[0, 0] > 1:
        pass
    else:
        pytest.fail("comparison on tpu gave the wrong truth value")
    assert torch.tensor(7, device="tpu").item() == 7


def test_numpy_raises_like_cuda():
    with pytest.raises(TypeError, match=r"can't convert tpu:0 device type tensor to numpy\. Use Tensor\.cpu\(\)"):
        torch.ones(2, device="tpu").numpy()


def test_print_and_repr_show_values_and_device():
    d = torch.tensor([[1.0, 2.5], [3.0, -4.0]], device="tpu")
    text = repr(d)
    assert "device='tpu:0'" in text
    ref = repr(d.cpu())
    assert ref.removeprefix("tensor(").split(")")[0].strip() in text
    assert "device='tpu:0'" in str(torch.tensor([True, False], device="tpu"))
    assert "device='tpu:0'" in repr(torch.arange(3, device="tpu"))
    big = torch.arange(2000.0, device="tpu")
    assert "..." in repr(big)


def test_mixed_device_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="tpu") + torch.ones(3)


def test_cpu_scalar_tensor_mixes_like_cuda():
    out = torch.ones(3, device="tpu") + torch.tensor(2.0)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0))


def _without_lowering(monkeypatch, op):
    from tpu_debug.runtime import eager
    from tpu_debug.runtime.ops import registry

    if op in registry._LOWERINGS:
        monkeypatch.delitem(registry._LOWERINGS, op)
    # set, then removed: undoing both drops the plan the test makes without the lowering and
    # puts back the op's plan from before the test, or none, so a later test plans it again
    monkeypatch.setitem(eager._plans, op, None)
    monkeypatch.delitem(eager._plans, op)


@pytest.mark.quick
def test_missing_lowering_names_the_overload(monkeypatch):
    from tpu_debug.runtime import device

    op = torch.ops.aten.special_airy_ai.default
    _without_lowering(monkeypatch, op)
    with pytest.raises(NotImplementedError, match=r"aten::special_airy_ai has no tpu lowering or decomposition"):
        device.dispatch(op, (torch.ones(2, device="tpu"),), {})


def test_cpu_fallback_runs_on_cpu_and_counts(monkeypatch):
    from tpu_debug.runtime import device, probes

    seen = []

    class P:
        def on_fallback(self, info):
            seen.append(info.op)

    p = P()
    _without_lowering(monkeypatch, torch.ops.aten.special_airy_ai.default)
    probes.subscribe(p)
    monkeypatch.setattr(runtime.config, "cpu_fallback", True)
    try:
        x = torch.linspace(-2, 2, 5)
        out = device.dispatch(torch.ops.aten.special_airy_ai.default, (x.to("tpu"),), {})
    finally:
        probes.unsubscribe(p)
    torch.testing.assert_close(out.cpu(), torch.special.airy_ai(x))
    assert out.device.type == "tpu"
    assert seen == ["special_airy_ai"]


def test_config_env_is_strict():
    from tpu_debug.runtime.config import RuntimeConfig

    assert RuntimeConfig.from_env({"TPU_DEBUG_CPU_FALLBACK": "1"}).cpu_fallback is True
    with pytest.raises(ValueError, match=r"TPU_DEBUG_CPU_FALLBACK='maybe' is not a boolean"):
        RuntimeConfig.from_env({"TPU_DEBUG_CPU_FALLBACK": "maybe"})


def _fresh(code: str, env: dict[str, str]) -> list[str]:
    import os
    import textwrap

    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True,
                         text=True, timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_import_registers_the_device_and_changes_nothing_else_until_first_use():
    code = """
        import importlib.util, os
        import jax, torch
        from jax._src import xla_bridge
        platforms = jax.config.jax_platforms
        import tpu_debug
        from tpu_debug.runtime import config, lazy
        print(torch._C._is_multithreading_enabled(), jax.config.jax_platforms == platforms,
              xla_bridge.backends_are_initialized(), vars(config) == {}, lazy._state.hooked)
        config.cpu_fallback = True  # assigned before the first use: the variable does not undo it
        x = torch.ones(2, device="tpu") * 2
        # no TPU attached here: with libtpu installed, and no platform or plugin chosen, JAX is
        # asked for its CPU backend before it first probes (it would load libtpu otherwise)
        chosen = os.environ.get("JAX_PLATFORMS") or platforms or importlib.util.find_spec("jax_plugins")
        expected = "cpu" if importlib.util.find_spec("libtpu") and not chosen else platforms
        print(torch._C._is_multithreading_enabled(), jax.config.jax_platforms == expected)
        print(config.cpu_fallback, torch.tpu.eager_mode.value, lazy._state.hooked, x.sum().item())
    """
    env = {"TPU_DEBUG_CPU_FALLBACK": "0", "TPU_DEBUG_EAGER_MODE": "defer_and_fuse"}
    assert _fresh(code, env) == [
        "True True False True False",  # autograd, jax config, jax backends, environment: untouched
        "False True",
        "True defer_and_fuse True 4.0",  # the variables apply from the first op on
    ]


def test_a_bad_variable_fails_the_first_use_not_the_import():
    code = """
        import torch, tpu_debug
        from tpu_debug.core.errors import ConfigError
        print("imported")
        for _ in range(2):  # not marked as started: each use says it again
            try:
                torch.ones(2, device="tpu")
            except ConfigError as exc:
                print(exc)
    """
    message = "TPU_DEBUG_LAZY_GRAPH_LIMIT='none' is not a positive integer; use a count such as 1024"
    assert _fresh(code, {"TPU_DEBUG_LAZY_GRAPH_LIMIT": "none"}) == ["imported", message, message]


def test_import_in_fresh_process_registers_once():
    code = (
        "import torch, tpu_debug, tpu_debug.runtime as r;"
        "assert r.install() is False;"
        "print(torch.ones(2, device='tpu').sum().item())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"


def test_privateuse1_taken_is_refused():
    """Another backend owns PrivateUse1: what records refuses it with DeviceTakenError, and
    the torch.backends loader says so in one line instead of failing ``import torch``."""
    code = (
        "import torch\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "from tpu_debug._loader import load\n"
        "load()\n"
        "import tpu_debug\n"
        "try:\n"
        "    tpu_debug.trace\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.returncode == 0, out.stderr
    assert "DeviceTakenError PrivateUse1 is already registered as 'npu'" in out.stdout, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("tpu_debug: the 'tpu' device is not registered: PrivateUse1 is already registered")


def test_version_is_the_installed_distributions():
    # the distribution takes its version from tpu_debug.core.version when it is installed:
    # a mismatch means the installed metadata is stale (reinstall with pip install -e .)
    assert tpu_debug.__version__ == importlib.metadata.version("tpu-debug")


def test_deepcopy_of_tpu_tensors_and_modules():
    """copy.deepcopy clones storages (UntypedStorage.clone), a 4 MB tpu storage among them;
    the copy is independent of the original."""
    import copy

    torch.manual_seed(0)
    big = torch.randn(1000, 1000)
    t = big.to("tpu")
    u = copy.deepcopy(t)
    u.add_(1)
    torch.testing.assert_close(u.cpu(), big + 1)
    torch.testing.assert_close(t.cpu(), big)  # the original is untouched

    view = t[2:5, 3:]
    v = copy.deepcopy(view)  # a view keeps its geometry in the copy
    assert (v.shape, v.stride(), v.storage_offset()) == (view.shape, view.stride(), view.storage_offset())
    torch.testing.assert_close(v.cpu(), big[2:5, 3:])

    cpu = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    dev = copy.deepcopy(cpu).to("tpu")
    dup = copy.deepcopy(dev)
    x = torch.randn(8, 64)
    torch.testing.assert_close(dup(x.to("tpu")).cpu(), cpu(x))
    with torch.no_grad():
        dup[0].weight.zero_()
    torch.testing.assert_close(dev[0].weight.cpu(), cpu[0].weight)
    assert copy.deepcopy(torch.empty(3, 4, device="tpu")).cpu().shape == (3, 4)


def test_torch_save_of_tpu_tensors_loads_on_cpu():
    """A checkpoint saved from tpu tensors holds their values (storages report the
    payload's bytes and copy them to CPU); shared storage stays shared."""
    import io

    torch.manual_seed(0)
    w = torch.randn(4, 5)
    t = w.to("tpu")
    buf = io.BytesIO()
    torch.save({"w": t, "rows": t[1:3], "n": torch.arange(6).to("tpu")}, buf)
    buf.seek(0)
    state = torch.load(buf, map_location="cpu")
    torch.testing.assert_close(state["w"], w)
    torch.testing.assert_close(state["rows"], w[1:3])
    torch.testing.assert_close(state["n"], torch.arange(6))
    assert state["rows"].untyped_storage().data_ptr() == state["w"].untyped_storage().data_ptr()


def test_an_installed_libtpu_without_a_tpu_stays_out_of_local_runs():
    """With the libtpu wheel installed and no TPU on the PCI bus, the runtime runs on JAX's
    CPU backend without JAX loading libtpu (its start-up errors, its lock file)."""
    import importlib.util
    import os

    from jax._src import hardware_utils

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
    if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
        pytest.skip("a TPU is attached: JAX's own choice is the right one")
    code = (
        "import tpu_debug, torch, jax; torch.ones(2, device='tpu').mul(2).cpu(); "
        "print(jax.config.jax_platforms, jax.devices()[0].platform)"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "cpu"]
    assert "libtpu" not in out.stderr and "TPU_WORKER_HOSTNAMES" not in out.stderr
