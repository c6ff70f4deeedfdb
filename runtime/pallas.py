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

__all__ = ["INTERPRETED_KERNEL", "JAX_TO_TORCH_DTYPE_MAP", "JaxCallable", "get_pallas_mesh", "jax_op",
           "torch_signature"]

# the name of the function holding an interpreted kernel in a program lowered for CPU
INTERPRETED_KERNEL = "tpu_debug_interpreted_kernel"

_TENSOR = (jax.Array, torch.Tensor)


def _dtype_map() -> dict[Any, torch.dtype]:
    out = {}
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "bfloat16", "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"):
        dtype = jax.numpy.dtype(name)
        try:
            out[dtype] = to_torch_dtype(dtype)
        except (KeyError, TypeError, ValueError):
            continue
    return out


#: a JAX array's dtype -> the tensor dtype the op gives it (TorchTPU's name)
JAX_TO_TORCH_DTYPE_MAP = _dtype_map()
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


def _arg_type(annotation: Any) -> str | None:
    """The schema type of an argument annotated ``annotation`` (None: one jax_op cannot take)."""
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
        return None
    return f"{kind}?" if optional else kind


def _return_type(annotation: Any) -> str | None:
    """The schema return type of ``annotation`` (None: one jax_op cannot return)."""
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
    return None


def _torch_annotation(annotation: Any) -> Any:
    """``annotation`` with JAX arrays spelled as PyTorch tensors (what the op takes)."""
    base, optional = _unwrap(annotation)
    if base in _TENSOR:
        out: Any = torch.Tensor
    elif _sequence_of(base) in _TENSOR:
        origin, args = typing.get_origin(base), typing.get_args(base)
        out = tuple[tuple(torch.Tensor for _ in args)] if origin is tuple and Ellipsis not in args else list[torch.Tensor]
    else:
        out = base
    return out | types.NoneType if optional else out


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


def torch_signature(signature: inspect.Signature) -> inspect.Signature:
    """The op's signature: ``signature`` with PyTorch tensors where it has JAX arrays."""
    params = [p.replace(annotation=_torch_annotation(p.annotation)) for p in signature.parameters.values()]
    returns = signature.return_annotation
    base, _ = _unwrap(returns)
    if base in _TENSOR:
        returns = torch.Tensor
    elif typing.get_origin(base) is tuple:
        returns = tuple[tuple(torch.Tensor if a in _TENSOR else a for a in typing.get_args(base))]
    return signature.replace(parameters=params, return_annotation=returns)


def _schema(fn: Callable, where: str) -> tuple[str, inspect.Signature]:
    """The op's schema and ``fn``'s signature; the errors use TorchTPU's words, so a check
    written against TorchTPU's messages holds here."""
    signature = _signature(fn)
    missing = [p.name for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty]
    if missing:
        raise TpuArgumentError(f"Missing argument type annotation for JAX function {where}: argument(s) "
                               f"{', '.join(map(repr, missing))}; jax_op builds the op's schema from the "
                               "annotations: annotate each (jax.Array for a tensor)")
    params, bad = [], []
    for i, p in enumerate(signature.parameters.values()):
        kind = _arg_type(p.annotation)
        if kind is None:
            bad.append((i, p))
            continue
        text = f"{kind} {p.name}"
        if p.default is not inspect.Parameter.empty:
            text += f"={p.default!r}" if p.default is not None else "=None"
        params.append(("*, " if p.kind is inspect.Parameter.KEYWORD_ONLY and not any(
            x.startswith("*") for x in params) else "") + text)
    if bad:
        listed = ", ".join(f"{p.name!r} annotated {p.annotation!r}" for _, p in bad)
        raise TpuArgumentError(
            f"Arguments at indices {[i for i, _ in bad]} are invalid in {where}: {listed}; jax_op takes jax.Array "
            "(a tensor), a sequence of them, or int, float, bool, str (static): annotate them with one of those")
    if signature.return_annotation is inspect.Signature.empty:
        raise TpuArgumentError(f"The return annotation is invalid in {where}: there is none; annotate what the "
                               "function returns (jax.Array, tuple[jax.Array, ...])")
    returns = _return_type(signature.return_annotation)
    if returns is None:
        raise TpuArgumentError(
            f"The return annotation is invalid in {where}: {signature.return_annotation!r} is not jax.Array, a "
            "tuple of them or a list of them: annotate what the function returns")
    return f"({', '.join(params)}) -> {returns}", signature


# function -> whether Pallas' interpreter lowers it (see _interpreted): asked once per function,
# at its first arguments, since what the interpreter cannot lower is how a kernel copies
_plain_interpretable: dict[Callable, bool] = {}


def _spec(a: Any) -> Any:
    return jax.ShapeDtypeStruct(a.shape, a.dtype) if isinstance(a, jax.Array | jax.core.Tracer) else a


def _interpretable(fn: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether Pallas' interpreter (``interpret=True``) lowers ``fn`` (it makes kernels XLA ops
    when the program is lowered, so it is asked to lower one)."""
    from jax._src import config as jax_config

    if fn in _plain_interpretable:
        return _plain_interpretable[fn]
    specs = [_spec(a) for a in args]
    statics = tuple(i for i, a in enumerate(specs) if not isinstance(a, jax.ShapeDtypeStruct))
    mode = jax_config.pallas_tpu_interpret_mode_context_manager
    prior = mode.swap_local(True)
    try:
        jax.jit(lambda *a: fn(*a, **kwargs), static_argnums=statics).lower(*specs)
        ok = True
    except (TypeError, ValueError, NotImplementedError):
        ok = False
    finally:
        mode.set_local(prior)
    _plain_interpretable[fn] = ok
    return ok


def _interpreted(fn: Callable) -> Callable:
    """``fn`` with every ``pallas_call`` it makes interpreted on the host.

    Pallas' interpreter (``interpret=True``) makes a kernel plain XLA ops; it needs every
    slice a kernel copies to have a static size. A kernel that copies slices of a size it
    computes (tokamax's backward kernels pad their last block so) is run by JAX's TPU
    interpreter instead (``pltpu.InterpretParams``: HBM, VMEM, DMAs and semaphores simulated
    through host callbacks), which the first one cannot lower. Those host callbacks cannot sit
    beside a Mosaic kernel in a program lowered for several platforms, so such a kernel runs
    here but has no ``--target`` compile."""

    def run(*args, **kwargs):
        from jax._src import config as jax_config
        from jax.experimental.pallas import tpu as pltpu

        mode = jax_config.pallas_tpu_interpret_mode_context_manager
        prior = mode.swap_local(True if _interpretable(fn, args, kwargs) else pltpu.InterpretParams())
        try:
            return fn(*args, **kwargs)
        finally:
            mode.set_local(prior)

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


class JaxCallable:
    """A JAX function as the op's kernel on CPU tensors (TorchTPU's name for the callable a
    ``jax_op`` wraps): the tensors become JAX arrays on the host, the function runs there
    (its Pallas kernels interpreted), and its results come back as tensors.
    ``__signature__`` is the function's, with PyTorch tensors where it takes JAX arrays.

    Args:
        name: the op's name.
        jit_fn: the function (or ``jax.jit`` of it).
        trace_key: accepted as TorchTPU takes it (a key of its kernel cache).
        mesh, input_partition_specs, static_argnums, donate_argnums: accepted as TorchTPU
            takes them; a kernel runs on one device here (see :func:`jax_op`).
    """

    def __init__(self, name: str, jit_fn: Callable, trace_key: Any = None, mesh: Any = None,
                 input_partition_specs: Any = None, static_argnums: Any = None, donate_argnums: Any = None) -> None:
        self.name = name
        self.fn = inspect.unwrap(jit_fn)
        self.trace_key = trace_key
        self.__signature__ = torch_signature(_signature(self.fn))
        self._jitted: dict[tuple, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        def to_jax(a):
            return jax.numpy.asarray(a.detach().numpy()) if isinstance(a, torch.Tensor) else a

        jargs = [[to_jax(x) for x in a] if isinstance(a, list) else to_jax(a) for a in args]
        statics = tuple(i for i, a in enumerate(jargs) if not isinstance(a, jax.Array | list))
        key = (statics, tuple(jargs[i] for i in statics), tuple(sorted(kwargs.items())))
        if key not in self._jitted:
            self._jitted[key] = jax.jit(lambda *a: _interpreted(self.fn)(*a, **kwargs), static_argnums=statics)
        with jax.enable_x64(False):
            out = self._jitted[key](*jargs)
        return _as_tuple(jax.tree_util.tree_map(lambda x: torch.from_numpy(np.array(x)), out))


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
        kernel = JaxCallable(name, fn)
        op = torch.library.custom_op(name, kernel, mutates_args=(), device_types="cpu", schema=schema)
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
