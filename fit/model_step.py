"""One step of a PyTorch model, traced into one JAX function (``trace_step``: what fit compiles
for a slice) and compiled for a TPU target (``compile_step``: does the model serve, or train,
on one device of it? Answered without data).

The model's parameters and inputs become ``meta`` tensors (shapes and dtypes,
no storage), so a 7B-parameter model costs nothing to hold. ``make_fx`` traces
one step into an aten-level FX graph (for training: forward, backward through
``torch.autograd.grad``, and an AdamW update), with the decompositions compiled
mode uses; ``runtime.compiled``'s graph interpreter turns the graph into one JAX
function through the same op lowerings the runtime runs; that function is
compiled for the target with ``jax.ShapeDtypeStruct`` inputs. XLA's TPU
compiler assigns every buffer, so its memory analysis is the memory the step
needs on one device, and its refusal (an HBM out-of-memory) is the answer "does
not fit".

What the step holds: inference, the parameters, buffers and inputs; training,
also the AdamW state (two tensors per parameter, in the parameter's dtype as
``torch.optim.AdamW`` keeps them), donated so the updated parameters and
state reuse their buffers, as compiled mode's optimizer steps do.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import jax

from tpu_debug.core.format import format_bytes
from tpu_debug.runtime.target.capacity import hbm_capacity
from tpu_debug.runtime.target.compile import TargetCompile, compile_for_target
from tpu_debug.runtime.target.errors import TargetError
from tpu_debug.runtime.target.hardware import Target, parse_target
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tpu_debug.runtime.compiled import GraphProgram, graph_decompositions
from tpu_debug.runtime.dtypes import to_jax_dtype

__all__ = ["StepCompile", "compile_step", "TracedStep", "trace_step", "AdamW"]


@dataclasses.dataclass(frozen=True, slots=True)
class AdamW:
    """The update ``torch.optim.AdamW`` makes (its defaults), written out functionally."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def step(self, params: list, grads: list, exp_avg: list, exp_avg_sq: list, step):
        """One step: new (params, exp_avg, exp_avg_sq, step)."""
        b1, b2 = self.betas
        step = step + 1
        bias1 = 1 - b1**step
        bias2 = 1 - b2**step
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
            m = m * b1 + g * (1 - b1)
            v = v * b2 + g * g * (1 - b2)
            p = p * (1 - self.lr * self.weight_decay)
            p = p - self.lr * (m / bias1) / ((v / bias2).sqrt() + self.eps)
            new_p.append(p)
            new_m.append(m)
            new_v.append(v)
        return new_p, new_m, new_v, step


@dataclasses.dataclass(frozen=True, slots=True)
class StepCompile:
    """A model step compiled for a TPU target without data.

    Attributes:
        target: the slice compiled for.
        mode: ``"inference"`` or ``"training"``.
        compile: the target compile (HLO, memory, cost, or the HBM out-of-memory).
        parameters: parameter elements.
        parameter_bytes: the parameters' logical bytes.
        state_bytes: the optimizer state's logical bytes (0 for inference).
        graph_nodes: aten ops in the traced step.
        trace_seconds: PyTorch tracing (model -> FX graph).
        seconds: the whole dry run, wall clock.
    """

    target: Target
    mode: str
    compile: TargetCompile
    parameters: int
    parameter_bytes: int
    state_bytes: int
    graph_nodes: int
    trace_seconds: float
    seconds: float

    @property
    def fits(self) -> bool | None:
        """True if the step fits one device's HBM, False if not, None if it failed otherwise."""
        return self.compile.fits

    def render(self) -> str:
        c = self.compile
        head = (f"{self.mode} on {self.target.name}: {self.parameters / 1e9:.2f} B parameters "
                f"({format_bytes(self.parameter_bytes)})")
        if self.state_bytes:
            head += f" + optimizer state {format_bytes(self.state_bytes)}"
        if c.ok:
            m = c.memory
            return (f"{head}: fits. Per device ({self.target.device_kind}): arguments {format_bytes(m.argument_bytes)}, outputs "
                    f"{format_bytes(m.output_bytes)} (aliased {format_bytes(m.alias_bytes)}), temporaries "
                    f"{format_bytes(m.temp_bytes)}; total {format_bytes(m.total_bytes)} of {_capacity(self.target)}. "
                    f"Dry run {self.seconds:.1f} s (TPU compile {c.seconds:.1f} s).")
        e = c.error
        if e.kind == "hbm_oom" and e.required_bytes is not None:
            return (f"{head}: does NOT fit: {e.what} need {format_bytes(e.required_bytes)}, one device "
                    f"({self.target.device_kind}) has "
                    f"{format_bytes(e.available_bytes)}. Dry run {self.seconds:.1f} s.")
        return f"{head}: the TPU compiler refused the step: {e.message}"

def _capacity(target: Target) -> str:
    usable, source = hbm_capacity(target)
    spec = target.spec_hbm_bytes_per_device
    if source == "compiler":
        return f"{format_bytes(usable)} HBM the compiler offers one device (spec {format_bytes(spec)})"
    return f"{format_bytes(spec)} HBM (spec; libtpu not installed to ask the compiler)"


def meta_of(t):
    import torch

    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


def nbytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclasses.dataclass(frozen=True, slots=True)
class TracedStep:
    """One model step as an aten graph and the JAX function the runtime's lowerings make of it.

    The flat inputs, in order: the parameters (``named_parameters()`` order), the
    buffers (``named_buffers()``); for training the AdamW state (every
    parameter's ``exp_avg``, then every ``exp_avg_sq``, then the step count, a
    float32 scalar); then the forward's inputs, then the loss's targets. The
    outputs: the forward's outputs (flattened); for training ``(loss, *new
    parameters, *new exp_avg, *new exp_avg_sq, new step)``.

    Attributes:
        graph: the aten-level FX graph (``make_fx`` with compiled mode's decompositions).
        program: the graph as a JAX function (``runtime.compiled``'s interpreter).
        specs: one ``jax.ShapeDtypeStruct`` per flat input.
        donate: flat inputs the step overwrites (parameters and optimizer state).
        mode: ``"inference"`` or ``"training"``.
    """

    graph: object
    program: object
    specs: tuple
    donate: tuple[int, ...]
    mode: str
    parameters: int
    parameter_bytes: int
    state_bytes: int
    trace_seconds: float

    def function(self) -> Callable:
        """The step as a JAX function of the flat inputs (jit it, or compile it for a target)."""
        program = self.program

        def step(*arrays):
            return program(*arrays)

        step.__name__ = f"dry_run_{self.mode}"
        return step


def trace_step(
    model,
    inputs: tuple,
    *,
    train: bool = False,
    loss_fn: Callable | None = None,
    targets: tuple = (),
    optimizer: AdamW | None = None,
) -> TracedStep:
    """Trace one inference or training step of ``model`` into the runtime's JAX function.

    Args: as ``compile_step``. Tensors may hold data or not: only their shapes and
    dtypes are used (every one is replaced by a meta tensor).

    Raises:
        TargetError: ``train`` without ``loss_fn``.
        UnsupportedGraphOp: the step uses an aten op the runtime has no lowering for.
    """
    if train and loss_fn is None:
        raise TargetError(
            "compile_step(train=True) needs loss_fn(outputs, *targets) -> scalar loss, e.g. "
            "lambda logits, labels: F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())"
        )
    started = time.perf_counter()
    params = {name: meta_of(p) for name, p in model.named_parameters()}
    buffers = {name: meta_of(b) for name, b in model.named_buffers()}
    inputs = tuple(meta_of(t) for t in inputs)
    targets = tuple(meta_of(t) for t in targets)
    names, bnames = list(params), list(buffers)
    n_p, n_b, n_in = len(names), len(bnames), len(inputs)
    opt = optimizer or AdamW()

    def call(p_list, b_list, xs):
        state = {**dict(zip(names, p_list)), **dict(zip(bnames, b_list))}
        return torch.func.functional_call(model, state, xs)

    if not train:
        flat = [*params.values(), *buffers.values(), *inputs]

        def step(*flat):
            out = call(flat[:n_p], flat[n_p:n_p + n_b], tuple(flat[n_p + n_b:]))
            return tuple(torch.utils._pytree.tree_leaves(out))

        donate: tuple[int, ...] = ()
        state_bytes = 0
        with torch.no_grad():
            gm = make_fx(step, decomposition_table=graph_decompositions(), record_stack_traces=True)(*flat)
    else:
        exp_avg = [torch.empty_like(p) for p in params.values()]
        exp_avg_sq = [torch.empty_like(p) for p in params.values()]
        count = torch.empty((), dtype=torch.float32, device="meta")
        flat = [*(p.requires_grad_() for p in params.values()), *buffers.values(), *exp_avg, *exp_avg_sq,
                count, *inputs, *targets]

        def step(*flat):
            p_list = list(flat[:n_p])
            b_list = list(flat[n_p:n_p + n_b])
            m = list(flat[n_p + n_b:2 * n_p + n_b])
            v = list(flat[2 * n_p + n_b:3 * n_p + n_b])
            k = flat[3 * n_p + n_b]
            xs = tuple(flat[3 * n_p + n_b + 1:3 * n_p + n_b + 1 + n_in])
            ys = tuple(flat[3 * n_p + n_b + 1 + n_in:])
            loss = loss_fn(call(p_list, b_list, xs), *ys)
            grads = torch.autograd.grad(loss, p_list)
            new_p, new_m, new_v, k = opt.step([p.detach() for p in p_list], list(grads), m, v, k)
            return (loss.detach(), *new_p, *new_m, *new_v, k)

        # the updated parameters and state overwrite the old (buffer donation)
        donate = (*range(n_p), *range(n_p + n_b, 3 * n_p + n_b + 1))
        state_bytes = nbytes_of(exp_avg) + nbytes_of(exp_avg_sq)
        gm = make_fx(step, decomposition_table=graph_decompositions(), record_stack_traces=True)(*flat)
    mode = "training" if train else "inference"
    program = GraphProgram(gm, "dry_run", mode)
    specs = tuple(
        jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), to_jax_dtype(n.meta["val"].dtype))
        for n in gm.graph.find_nodes(op="placeholder")
    )
    return TracedStep(gm, program, specs, donate, mode,
                      parameters=sum(math.prod(p.shape) for p in params.values()),
                      parameter_bytes=nbytes_of(params.values()), state_bytes=state_bytes,
                      trace_seconds=time.perf_counter() - started)


def compile_step(
    model,
    inputs: tuple,
    target: str | Target = "v5e",
    *,
    train: bool = False,
    loss_fn: Callable | None = None,
    targets: tuple = (),
    optimizer: AdamW | None = None,
    optimization_level: str | None = "O0",
    cache: bool = True,
) -> StepCompile:
    """Compile one inference or training step of ``model`` for a TPU target, with no data.

    Args:
        model: an ``nn.Module`` on any device; build a big one under
            ``torch.device("meta")`` so that it holds no data. Its parameters are
            replaced by meta tensors for the trace; the module is not changed.
        inputs: the forward's positional inputs (tensors; only shapes and dtypes
            are used, so ``torch.empty(..., device="meta")`` is enough).
        target: a spec (``"v6e"``, ``"v5e-1"``) or a ``Target``.
        train: compile forward + backward + an AdamW step instead of a forward.
        loss_fn: ``loss_fn(outputs, *targets) -> scalar`` (required with ``train``).
        targets: further inputs of the loss (labels), as ``inputs``.
        optimizer: the AdamW hyper-parameters (``torch.optim.AdamW``'s defaults).
        optimization_level: XLA's effort level for the compile. ``"O0"`` (the
            default here) because the question is memory: it assigns nearly the same
            buffers as the compiler's default in a fraction of the time (a 7B Llama
            forward for v6e: see ``benchmarks/target_dryrun.py``); None for the
            default's optimized code and cost analysis.
        cache: use the target compile cache.

    Returns:
        A ``StepCompile``: ``fits``, the per-device memory (or the out-of-memory
        figures), the compiler's cost analysis, timings.

    Raises:
        TargetError: ``train`` without ``loss_fn``.
        TargetSpecError, LibtpuMissingError: as ``compile_for_target``.
        UnsupportedGraphOp: the step uses an aten op the runtime has no lowering for.

    Example::

        with torch.device("meta"):
            model = TinyLlama(LlamaConfig(...7B...)).to(torch.bfloat16)
        tokens = torch.empty(8, 2048, dtype=torch.long, device="meta")
        print(compile_step(model, (tokens,), "v6e").render())
    """
    tgt = parse_target(target)
    started = time.perf_counter()
    traced = trace_step(model, inputs, train=train, loss_fn=loss_fn, targets=targets, optimizer=optimizer)
    result = compile_for_target(traced.function(), traced.specs, tgt, donate_argnums=traced.donate,
                                x64=True, optimization_level=optimization_level, cache=cache)
    return StepCompile(
        target=tgt,
        mode=traced.mode,
        compile=result,
        parameters=traced.parameters,
        parameter_bytes=traced.parameter_bytes,
        state_bytes=traced.state_bytes,
        graph_nodes=sum(1 for n in traced.graph.graph.nodes if n.op == "call_function"),
        trace_seconds=traced.trace_seconds,
        seconds=time.perf_counter() - started,
    )
