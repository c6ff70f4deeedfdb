"""``torch.autocast("tpu", ...)``: the casting policy of PyTorch's CPU autocast, on `tpu`.

PyTorch gives a PrivateUse1 backend an autocast dispatch key (``AutocastPrivateUse1``)
but no kernels and no fallthrough for it, so without these registrations every
op run inside ``torch.autocast("tpu")`` fails in the dispatcher. The policy is
CPU autocast's, so a `tpu` program under autocast computes in the same dtypes as
the same program under ``torch.autocast("cpu")``, the reference every result here
is checked against. The ops come from the dispatcher itself: every aten op that
has an ``AutocastCPU`` kernel gets one here, in one of CPU autocast's three
classes:

- lower precision (matrix products and convolutions): floating-point `tpu`
  arguments are cast to the autocast dtype;
- promote (``cat``, ``stack``, ``index_copy``): arguments are cast to the widest
  floating-point dtype among them;
- float32 (losses, reductions such as ``prod``, linear algebra, FFTs, some
  pooling and padding): reduced-precision arguments are cast to float32.

Every other op falls through and runs in the dtypes it is given. CPU autocast
also caches the cast of a float32 leaf weight within one autocast region; this
casts it at each use, which changes the op count, not the values.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["LOWER_PRECISION", "PROMOTE", "register_kernels"]

#: CPU autocast's lower-precision class; every other op with an AutocastCPU kernel is
#: in its float32 class except PROMOTE's.
LOWER_PRECISION = frozenset({
    "_addmm_activation", "_convolution", "_native_multi_head_attention", "addbmm", "addmm",
    "baddbmm", "bmm", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "linalg_vecdot", "linear", "matmul", "mkldnn_rnn_layer",
    "mm", "prelu", "scaled_dot_product_attention",
})
PROMOTE = frozenset({"cat", "stack", "index_copy"})

_DEVICE = "tpu"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _on_device_float(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == _DEVICE


def _map(fn: Callable[[torch.Tensor], torch.Tensor], value: object) -> object:
    """``fn`` applied to every `tpu` floating-point tensor in an argument (lists too:
    ``cat`` and ``stack`` take a tensor list)."""
    if _on_device_float(value):
        return fn(value)
    if isinstance(value, (list, tuple)) and any(_on_device_float(v) for v in value):
        return type(value)(_map(fn, v) for v in value)
    return value


def _to(dtype: torch.dtype, keep: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t if keep(t) or t.dtype == dtype else t.to(dtype)


def _lower(args: tuple, kwargs: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    # float64 stays float64, as on CPU: autocast only lowers float32 work
    return _to(torch.get_autocast_dtype(_DEVICE), lambda t: t.dtype == torch.float64)


def _float32(args: tuple, kwargs: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    return _to(torch.float32, lambda t: t.dtype == torch.float64)


def _promote(args: tuple, kwargs: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    widest: torch.dtype | None = None

    def note(t: torch.Tensor) -> torch.Tensor:
        nonlocal widest
        widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
        return t

    for value in (*args, *kwargs.values()):
        _map(note, value)
    return _to(widest, lambda t: False) if widest is not None else (lambda t: t)


def _kernel(op: torch._ops.OpOverload, policy: Callable) -> Callable:
    def autocast_kernel(*args, **kwargs):
        cast = policy(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args = tuple(_map(cast, a) for a in args)
            kwargs = {k: _map(cast, v) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    autocast_kernel.__name__ = f"autocast_{op._schema.name.split('::')[1]}"
    return autocast_kernel


def _policy(name: str) -> Callable:
    if name in LOWER_PRECISION:
        return _lower
    if name in PROMOTE:
        return _promote
    return _float32


def _cpu_autocast_ops() -> list[torch._ops.OpOverload]:
    """Every aten overload that has an AutocastCPU kernel in this PyTorch."""
    out = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastCPU"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and (overload or "default") in packet.overloads():
            out.append(getattr(packet, overload or "default"))
    return out


def register_kernels(shield: Callable[[Callable], Callable]) -> list:
    """Register the autocast kernels and the fallthrough for every other op; returns the
    ``torch.library.Library`` objects that hold them (they unregister when collected).
    ``shield`` wraps each kernel as the device's own kernels are wrapped."""
    lib = torch.library.Library("aten", "IMPL")
    for op in _cpu_autocast_ops():
        lib.impl(op, shield(_kernel(op, _policy(op._schema.name.split("::")[1]))), "AutocastPrivateUse1")
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    return [lib, fallthrough]
