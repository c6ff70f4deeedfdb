"""JAX functions and Pallas kernels as PyTorch ops: ``torch.tpu.pallas.jax_op``.

``jax_op("ns::name", fn)`` makes a ``torch.library`` custom op of a JAX function (one
that calls ``pl.pallas_call``, or plain ``jax.numpy``), as TorchTPU's does: its schema
comes from ``fn``'s annotations (``jax.Array`` arguments are tensors, ``int``/``float``/
``bool``/``str`` arguments are static), its fake kernel from ``jax.eval_shape`` of ``fn``,
and the result is a ``CustomOpDef`` (``register_autograd``, ``register_fake`` work on it).

On ``tpu`` tensors the op is one more op of the runtime: the function is registered as the
op's lowering (``runtime/ops/registry.py``) and the device's fallback kernel runs it, so
eagerly it runs as one cached executable,
in DEFER_AND_FUSE mode it joins the fused program, and in a ``torch.compile`` graph the
FX node calling it is lowered into the graph's one program.

Where the kernel runs: ``fn`` is traced with ``jax.lax.platform_dependent``, whose CPU
branch runs the Pallas kernels in Pallas' interpret mode (``interpret=True``: the kernel
body becomes plain XLA ops, so a kernel written for a TPU runs on a laptop unchanged) and
whose other branch is the kernel as written. A program lowered for a TPU therefore holds
the Mosaic kernel: the TPU target's compile (``tpu-debug run --target``) lowers a program
holding an interpreted kernel (a function named :data:`INTERPRETED_KERNEL`) again for the
TPU, as it does a program with a CPU-only custom call. The
function is traced with 64-bit types off, as JAX's defaults are (the runtime itself
traces with them on), so a kernel sees the index types it was written for.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch
from torch._library.custom_ops import CustomOpDef
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype
from tpu_debug.runtime.ops.registry import lower

__all__ = ["INTERPRETED_KERNEL", "get_pallas_mesh", "jax_op"]

# the name of the function holding an interpreted kernel in a program lowered for CPU
INTERPRETED_KERNEL = "tpu_debug_interpreted_kernel"

_TENSOR = (jax.Array, torch.Tensor)
_STATIC = {bool: "bool", int: "SymInt", float: "float", str: "str"}


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without ``Optional``/``Annotated``, whether it was optional)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _sequence_of(annotation: Any) -> Any | None:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, collections.abc.Sequence) and args:
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        if all(a == args[0] for a in args):
            return args[0]
    return None


def _arg_type(name: str, annotation: Any, where: str) -> str:
    base, optional = _unwrap(annotation)
    if base in _TENSOR:
        kind = "Tensor"
    elif base in _STATIC:
        kind = _STATIC[base]
    elif (elem := _sequence_of(base)) in _TENSOR:
        kind = "Tensor[]"
    elif elem in (int, float, bool):
        kind = f"{_STATIC[elem]}[]"
    else:
        raise TpuArgumentError(
            f"{where}: argument {name!r} is annotated {annotation!r}; jax_op takes jax.Array (a tensor), "
            "a sequence of them, or int, float, bool, str (static): annotate it with one of those"
        )
    return f"{kind}?" if optional else kind


def _return_type(annotation: Any, where: str) -> str:
    if annotation is None or annotation is type(None):
        return "()"
    base, _ = _unwrap(annotation)
    if base in _TENSOR:
        return "Tensor"
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis) and all(a in _TENSOR for a in args):
        return "(" + ", ".join("Tensor" for _ in args) + ")"
    if _sequence_of(base) in _TENSOR:
        return "Tensor[]"
    raise TpuArgumentError(
        f"{where}: the return annotation {annotation!r} is not jax.Array, a tuple of them or a list of them: "
        "annotate what the function returns"
    )


def _signature(fn: Callable) -> inspect.Signature:
    """``fn``'s signature with its annotations evaluated: in its module's names, and for a
    function whose module imports jax only locally (string annotations under
    ``from __future__ import annotations``), with jax, torch and typing's names too."""
    fn = inspect.unwrap(fn)
    try:
        return inspect.signature(fn, eval_str=True)
    except NameError:
        names = {"jax": jax, "torch": torch, "typing": typing, "Tuple": tuple, "List": list,
                 "Sequence": collections.abc.Sequence, "Optional": typing.Optional, "Array": jax.Array,
                 **getattr(fn, "__globals__", {})}
        return inspect.signature(fn, globals=names, eval_str=True)


def _schema(fn: Callable, where: str) -> tuple[str, inspect.Signature]:
    signature = _signature(fn)
    params = []
    for p in signature.parameters.values():
        if p.annotation is inspect.Parameter.empty:
            raise TpuArgumentError(f"{where}: argument {p.name!r} has no annotation; jax_op builds the op's "
                                   "schema from them: annotate it (jax.Array for a tensor)")
        text = f"{_arg_type(p.name, p.annotation, where)} {p.name}"
        if p.default is not inspect.Parameter.empty:
            text += f"={p.default!r}" if p.default is not None else "=None"
        params.append(("*, " if p.kind is inspect.Parameter.KEYWORD_ONLY and not any(
            x.startswith("*") for x in params) else "") + text)
    if signature.return_annotation is inspect.Signature.empty:
        raise TpuArgumentError(f"{where}: the function has no return annotation (jax.Array, tuple[jax.Array, ...])")
    return f"({', '.join(params)}) -> {_return_type(signature.return_annotation, where)}", signature


def _interpreted(fn: Callable) -> Callable:
    """``fn`` with every ``pallas_call`` it makes in Pallas' interpret mode."""

    def run(*args, **kwargs):
        from jax._src import config as jax_config

        prior = jax_config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
        try:
            return fn(*args, **kwargs)
        finally:
            jax_config.pallas_tpu_interpret_mode_context_manager.set_local(prior)

    return run


def _per_platform(fn: Callable) -> Callable:
    """JAX arrays (and static values) in, ``fn``'s result out: the kernel interpreted where the
    program runs on CPU, as written elsewhere (see the module)."""

    def lowering(*args, **kwargs):
        arrays = [i for i, a in enumerate(args) if isinstance(a, jax.Array | jax.core.Tracer)]

        def call(body):
            def branch(*operands):
                full = list(args)
                for i, value in zip(arrays, operands):
                    full[i] = value
                with jax.enable_x64(False):
                    return body(*full, **kwargs)

            return branch

        operands = [args[i] for i in arrays]
        interpreted = call(_interpreted(fn))
        interpreted.__name__ = INTERPRETED_KERNEL
        # a function of its own in the CPU lowering, by that name: the TPU target tracer
        # lowers such a program again for the TPU (tracers/reading/target_findings.py), which takes the other branch
        return jax.lax.platform_dependent(*operands, cpu=jax.jit(interpreted, inline=False), default=call(fn))

    return lowering


def _as_tuple(out: Any) -> Any:
    return tuple(out) if isinstance(out, list) else out


def _jax_args(args: Sequence[Any]) -> list[Any]:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(jax.ShapeDtypeStruct(tuple(a.shape), to_jax_dtype(a.dtype)))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
            out.append([jax.ShapeDtypeStruct(tuple(x.shape), to_jax_dtype(x.dtype)) for x in a])
        else:
            out.append(a)
    return out


def _fake(fn: Callable) -> Callable:
    """The op's fake kernel: ``fn``'s output shapes and dtypes (``jax.eval_shape``), on the
    first tensor argument's device."""

    def fake(*args, **kwargs):
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("meta"))
        jargs = _jax_args(args)
        arrays = [i for i, a in enumerate(jargs) if isinstance(a, jax.ShapeDtypeStruct | list)]

        def traced(*operands):
            full = list(jargs)
            for i, value in zip(arrays, operands):
                full[i] = value
            with jax.enable_x64(False):
                return _interpreted(fn)(*full, **kwargs)

        shapes = jax.eval_shape(traced, *[jargs[i] for i in arrays])
        made = jax.tree_util.tree_map(
            lambda s: torch.empty(s.shape, dtype=to_torch_dtype(s.dtype), device=device), shapes)
        return _as_tuple(made)

    return fake


def _cpu_kernel(fn: Callable) -> Callable:
    """The op on CPU tensors: ``fn`` run by JAX on the host (Pallas kernels interpreted)."""
    jitted = {}

    def kernel(*args, **kwargs):
        def to_jax(a):
            return jax.numpy.asarray(a.detach().numpy()) if isinstance(a, torch.Tensor) else a

        jargs = [[to_jax(x) for x in a] if isinstance(a, list) else to_jax(a) for a in args]
        statics = tuple(i for i, a in enumerate(jargs) if not isinstance(a, jax.Array | list))
        key = (statics, tuple(jargs[i] for i in statics), tuple(sorted(kwargs.items())))
        if key not in jitted:
            jitted[key] = jax.jit(lambda *a: _interpreted(fn)(*a, **kwargs), static_argnums=statics)
        with jax.enable_x64(False):
            out = jitted[key](*jargs)
        return _as_tuple(jax.tree_util.tree_map(lambda x: torch.from_numpy(np.array(x)), out))

    return kernel


def jax_op(name: str, fn: Callable | None = None, /, *, donate_argnums: Sequence[int] | None = None,
           mesh: jax.sharding.Mesh | None = None, input_partition_specs: Any = None,
           output_partition_specs: Any = None) -> CustomOpDef | Callable[[Callable], CustomOpDef]:
    """Register JAX function ``fn`` (it may call Pallas kernels) as PyTorch op ``name``.

    Args:
        name: ``"namespace::op"``.
        fn: the JAX function, every argument and the return annotated (``jax.Array`` for
            tensors; ``int``, ``float``, ``bool``, ``str`` arguments are static). None:
            ``jax_op(name)`` is a decorator.
        donate_argnums: accepted as TorchTPU takes it; arguments are not donated here
            (the runtime's buffers are immutable JAX arrays, so nothing is saved).
        mesh, input_partition_specs, output_partition_specs: a kernel over several
            devices (TorchTPU's SPMD kernels); refused here, see Raises.

    Returns:
        The ``CustomOpDef`` (callable like a function; ``register_autograd`` gives it a
        backward), or a decorator making one.

    Raises:
        TpuArgumentError: a name without one ``::``, an argument or return this schema
            cannot express, or a ``mesh`` (a kernel over several devices).

    Example::

        def add(x: jax.Array, y: jax.Array) -> jax.Array:
            return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

        add_op = torch.tpu.pallas.jax_op("mine::add", add)
        add_op(torch.ones(8, device="tpu"), torch.ones(8, device="tpu"))
    """
    if not isinstance(name, str) or name.count("::") != 1:
        raise TpuArgumentError(f"jax_op name {name!r} must be 'namespace::op' (one '::')")
    if mesh is not None or input_partition_specs is not None or output_partition_specs is not None:
        raise TpuArgumentError(
            f"jax_op({name!r}, mesh=...): a kernel over several devices runs on a TPU slice with TorchTPU; "
            "tpu_debug's runtime calls a kernel on one device: drop mesh and the partition specs"
        )

    def make(fn: Callable) -> CustomOpDef:
        where = f"jax_op({name!r}, {getattr(fn, '__name__', fn)!r})"
        schema, _signature = _schema(fn, where)
        # the CPU kernel only: on `tpu` tensors the device's fallback kernel runs the op through
        # its lowering, as it runs every aten op (runtime/device.py)
        op = torch.library.custom_op(name, _cpu_kernel(fn), mutates_args=(), device_types="cpu", schema=schema)
        op.register_fake(_fake(fn))
        lower(op._opoverload, static_scalars=True)(_per_platform(fn))
        return op

    return make if fn is None else make(fn)


def get_pallas_mesh(axis_names: Sequence[str] | str, mesh_shape: Sequence[int] | None = None,
                    process_group: Any = None) -> jax.sharding.Mesh:
    """A JAX mesh with one device per rank of ``torch.distributed`` (TorchTPU's signature).

    Args:
        axis_names: the mesh's axis names.
        mesh_shape: its shape; needed with more than one axis (its product is the world size).
        process_group: accepted as TorchTPU takes it; the world's ranks are used.

    Raises:
        TpuArgumentError: ``torch.distributed`` is not initialized, the shape and names
            disagree, or the ranks' devices are not in this process's JAX runtime (run the
            ranks with ``tpu-debug run --nproc N``, which joins them in one).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise TpuArgumentError("get_pallas_mesh needs torch.distributed initialized: call "
                               "dist.init_process_group() first")
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    world = dist.get_world_size()
    shape = (world,) if mesh_shape is None else tuple(mesh_shape)
    if len(shape) != len(names) or int(np.prod(shape)) != world:
        raise TpuArgumentError(f"get_pallas_mesh: axis names {names} and shape {shape} must agree, and the shape's "
                               f"product must be the world size ({world})")
    devices = jax.devices()
    if len(devices) != world:
        raise TpuArgumentError(
            f"get_pallas_mesh: {world} ranks but this process's JAX runtime has {len(devices)} device(s): "
            "launch the ranks with `tpu-debug run --nproc N`, which puts every rank's device in one runtime"
        )
    return jax.sharding.Mesh(np.array(devices).reshape(shape), axis_names=names)
