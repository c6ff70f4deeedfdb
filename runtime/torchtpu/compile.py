"""``torch_tpu._internal.compile`` (with ``._backend``, ``.compiler``, ``.debug``,
``.split_compiler``, ``.dynamic_compiler``): TorchTPU's ``torch.compile`` backend and what it
compiles with.

- :class:`TpuBackend` is the ``"tpu"`` backend as an object: ``torch.compile(model,
  backend=TpuBackend())`` (vLLM-TorchTPU's compiler and TorchTPU's Qwen3 example pass one),
  or called directly on an FX graph and its example inputs, it returns the compiled callable
  of the runtime's compiled mode (AOTAutograd, one XLA program per graph and input signature:
  ``runtime/compiled.py``). Importing this module makes the ``"tpu"`` name that object, as
  TorchTPU's module does, so ``torch.compile(..., backend="tpu", options={...})`` reads its
  options: ``debug_callback`` receives a :class:`TpuCompileDebug` that fills as the graph's
  programs compile (the FX graph dynamo captured, AOTAutograd's forward and backward graphs,
  their StableHLO and the compiled executables).
- :class:`StaticCompiler`, :class:`DynamicCompiler` and :class:`SplitCompiler` are TorchTPU's
  graph compilers; each compiles an FX graph the same way here. TorchTPU's dynamic compiler
  pads dynamic sizes to buckets (``num_buckets``, ``bucket_size``); this runtime compiles one
  program per input signature instead, so the bucket settings are kept and change nothing.
- ``clear_cache()`` drops every compiled program the runtime holds.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends import registry
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.core.records import CompileInfo
from tpu_debug.runtime import compiled, probes
from tpu_debug.runtime.tpu_utils import clear_caches as clear_cache

__all__ = ["CompilationContext", "Compiler", "DynamicCompiler", "SplitCompiler", "StaticCompiler", "TpuBackend",
           "TpuCompileDebug", "clear_cache", "has_dynamic_symints"]

# TorchTPU's backend options (`torch.compile(..., options=...)`) and what each does here
_OPTIONS = {
    "debug_callback": "called with the graph's TpuCompileDebug",
    "debug": "a TpuCompileDebug is kept on the backend (compiled_executables)",
    "serializable": "accepted: AOTAutograd's cache is PyTorch's",
    "async_compile": "accepted: programs compile when first called",
    "num_dynamic_buckets": "accepted: one program per input signature",
    "bucket_size": "accepted: one program per input signature",
}


@dataclasses.dataclass
class TpuCompileDebug:
    """What compiling one graph made (TorchTPU's log container): the FX graph dynamo captured,
    AOTAutograd's forward and backward graphs, their StableHLO, and the compiled executables
    (JAX's ``Compiled`` objects: ``as_text()`` is the optimized HLO). The lists fill as the
    programs compile: a backward compiles when it first runs."""

    pre_autograd_fx_code: list[str] = dataclasses.field(default_factory=list)
    pre_autograd_fx_readable: list[str] = dataclasses.field(default_factory=list)
    post_autograd_fx_forward_code: list[str] = dataclasses.field(default_factory=list)
    post_autograd_fx_forward_readable: list[str] = dataclasses.field(default_factory=list)
    post_autograd_fx_backward_code: list[str] = dataclasses.field(default_factory=list)
    post_autograd_fx_backward_readable: list[str] = dataclasses.field(default_factory=list)
    stablehlo_forward_text: list[str] = dataclasses.field(default_factory=list)
    stablehlo_backward_text: list[str] = dataclasses.field(default_factory=list)
    compiled_executables: list[Any] = dataclasses.field(default_factory=list)

    _SECTIONS = (
        ("pre_autograd_fx_code", "Pre-Autograd FX Graph"),
        ("post_autograd_fx_forward_code", "Post-Autograd Forward FX Graph"),
        ("post_autograd_fx_backward_code", "Post-Autograd Backward FX Graph"),
        ("stablehlo_forward_text", "StableHLO Forward"),
        ("stablehlo_backward_text", "StableHLO Backward"),
    )

    def __str__(self) -> str:
        sections = [f"=== {title} ===\n" + "\n".join(getattr(self, field)).strip()
                    for field, title in self._SECTIONS if getattr(self, field)]
        return "\n\n".join(sections) if sections else "TpuCompileDebug(empty)"

    def __repr__(self) -> str:
        return (f"TpuCompileDebug(pre_fx={len(self.pre_autograd_fx_code)}, "
                f"post_fx_fwd={len(self.post_autograd_fx_forward_code)}, "
                f"post_fx_bwd={len(self.post_autograd_fx_backward_code)}, "
                f"stablehlo_fwd={len(self.stablehlo_forward_text)}, "
                f"stablehlo_bwd={len(self.stablehlo_backward_text)}, "
                f"executables={len(self.compiled_executables)})")


class _DebugCollector:
    """Hears the runtime's compiles and files each compiled graph's code, StableHLO and
    executable into the :class:`TpuCompileDebug` of the dynamo graph it belongs to: the graph
    whose compiled callable was running when its first program compiled (a forward compiles
    on its first call), and every later program of the same graph (its backward)."""

    def __init__(self) -> None:
        self.running = threading.local()
        self.graphs: dict[str, weakref.ref] = {}  # the runtime's graph id -> its container

    def on_compile(self, info: CompileInfo) -> None:
        graph = info.graph
        if info.mode != "compiled" or graph is None:
            return
        parent = info.name.split("/", 1)[0]
        ref = self.graphs.get(parent)
        if ref is None:
            ref = getattr(self.running, "debug", None)
            if ref is None:
                return
            self.graphs[parent] = ref
            self.running.debug = None
        debug = ref()
        if debug is None:
            return
        side = "backward" if graph.kind == "backward" else "forward"
        getattr(debug, f"post_autograd_fx_{side}_code").append(graph.code)
        getattr(debug, f"post_autograd_fx_{side}_readable").append(graph.code)
        getattr(debug, f"stablehlo_{side}_text").append(info.stablehlo())
        debug.compiled_executables.append(info.compiled)

    def watch(self, fn: Callable, debug: TpuCompileDebug) -> Callable:
        """``fn`` (a compiled graph's callable), whose first call's compile is filed into ``debug``."""
        ref = weakref.ref(debug)
        first = [True]

        def run(*args: Any) -> Any:
            if first[0]:
                first[0] = False
                self.running.debug = ref
                try:
                    return fn(*args)
                finally:
                    self.running.debug = None
            return fn(*args)

        for attr in ("_boxed_call", "zero_grad"):
            if hasattr(fn, attr):
                setattr(run, attr, getattr(fn, attr))
        return run


_collector: list[_DebugCollector] = []


def _collector_running() -> _DebugCollector:
    if not _collector:
        _collector.append(_DebugCollector())
        probes.subscribe(_collector[0])
    return _collector[0]


class TpuBackend:
    """TorchTPU's ``torch.compile`` backend over this runtime's compiled mode (see the module).

    Args:
        debug: keep a :class:`TpuCompileDebug` per compiled graph (``compiled_debugs``).
        dynamism: accepted (TorchTPU keeps it for its signature only).
        enable_serialization: accepted: AOTAutograd's cache is PyTorch's own.

    Example::

        compiled = torch.compile(model, backend=TpuBackend())
    """

    def __init__(self, debug: bool = False, dynamism: bool = False, enable_serialization: bool = True) -> None:
        self._debug = debug
        self._dynamism = dynamism
        self._enable_serialization = False if debug else enable_serialization
        self._compiled_executables: list[Any] = []
        self._num_compiled_executables = 0
        self.compiled_debugs: list[TpuCompileDebug] = []

    def clear_cache(self) -> None:
        """Forget the debug records kept (compiled programs stay in the runtime's cache)."""
        self._compiled_executables.clear()
        self._num_compiled_executables = 0
        self.compiled_debugs.clear()

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
        """Compile ``graph_module`` (dynamo's graph, or any FX graph with example inputs).

        Raises:
            TpuArgumentError: an option TorchTPU's backend does not take.
        """
        options = dict(kwargs.pop("options", None) or {})
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TpuArgumentError(f"TpuBackend: unknown option(s) {', '.join(map(repr, unknown))}; it takes "
                                   f"{', '.join(sorted(_OPTIONS))}")
        callback = options.get("debug_callback")
        fn = compiled.dynamo_backend(graph_module, example_inputs)
        if callback is None and not (self._debug or options.get("debug")):
            return fn
        debug = TpuCompileDebug()
        debug.pre_autograd_fx_code.append(graph_module.code)
        debug.pre_autograd_fx_readable.append(graph_module.print_readable(print_output=False))
        self.compiled_debugs.append(debug)
        self._compiled_executables = debug.compiled_executables
        if callback is not None:
            callback(debug)
        return _collector_running().watch(fn, debug)


@dataclasses.dataclass
class CompilationContext:
    """What TorchTPU's compilers share for one ``torch.compile`` call (kept for its signature)."""

    options: dict[str, Any] = dataclasses.field(default_factory=dict)


class Compiler:
    """TorchTPU's graph compiler: called on an FX graph and its example inputs, it returns the
    callable running the graph's program (the runtime's compiled mode)."""

    def __init__(self, compilation_context: CompilationContext | None = None, *,
                 debug: bool | TpuCompileDebug | None = None) -> None:
        self.compilation_context = compilation_context or CompilationContext()
        self._debug = debug

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                 donated_inputs: Sequence[int] = ()) -> Callable:
        """The callable running ``graph_module``'s program (its outputs as the graph returns
        them: a graph returning one tensor returns it, not a one-tuple). ``donated_inputs``
        (the flat inputs whose buffers TorchTPU gives to the program) is accepted; the program
        here leaves its inputs valid, so it changes no result."""
        output = graph_module.graph.output_node()
        single = not isinstance(output.args[0], (tuple, list))
        if single:  # AOTAutograd compiles graphs that return a tuple
            output.args = ((output.args[0],),)
            graph_module.recompile()
        run = compiled.dynamo_backend(graph_module, example_inputs)
        return (lambda *args: run(*args)[0]) if single else run


class StaticCompiler(Compiler):
    """The compiler of graphs with static shapes (``async_compile`` is accepted)."""

    def __init__(self, *args: Any, async_compile: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.async_compile = async_compile


class DynamicCompiler(Compiler):
    """The compiler of graphs with dynamic sizes: one program per input signature here (the
    buckets TorchTPU pads to are kept and change nothing)."""

    def __init__(self, compilation_context: CompilationContext | None = None, *,
                 debug: bool | TpuCompileDebug | None = None, num_buckets: int = 1,
                 num_lookahead_buckets: int | None = None, bucket_size: int = 128) -> None:
        super().__init__(compilation_context, debug=debug)
        self.num_buckets, self.num_lookahead_buckets, self.bucket_size = num_buckets, num_lookahead_buckets, bucket_size
        self.static_compiler = StaticCompiler(self.compilation_context, debug=debug)


class SplitCompiler(Compiler):
    """TorchTPU's compiler that splits a graph at its collectives: collectives run on the host
    here (runtime/distributed/c10d/), so the graph is compiled by ``base_compiler`` whole."""

    def __init__(self, base_compiler: Compiler) -> None:
        super().__init__(base_compiler.compilation_context, debug=base_compiler._debug)
        self.base_compiler = base_compiler

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                 donated_inputs: Sequence[int] = ()) -> Callable:
        return self.base_compiler(graph_module, example_inputs, donated_inputs=donated_inputs)


def has_dynamic_symints(args: Any) -> bool:
    """Whether any of ``args`` (tensors, sizes, nested) holds a symbolic size."""
    from torch.utils import _pytree

    for leaf in _pytree.tree_leaves(args):
        if isinstance(leaf, torch.SymInt) and not isinstance(leaf.node.maybe_as_int(), int):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in leaf.shape):
            return True
    return False


def _take_the_tpu_name() -> None:
    """Make ``"tpu"`` a :class:`TpuBackend`, as importing TorchTPU's compile module does, where
    the runtime registered it (so ``torch.compile(backend="tpu", options=...)`` reads options)."""
    compiled.install_backends()  # idempotent: the runtime's names, registered when dynamo loads
    if registry._COMPILER_FNS.get("tpu") is compiled.dynamo_backend:
        registry._COMPILER_FNS["tpu"] = TpuBackend()


_take_the_tpu_name()
