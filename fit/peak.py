"""A fit step at its peak, buffer by buffer, from the TPU compiler's buffer assignment.

``fit`` compiles one step; the compile keeps the compiler's buffer assignment
(``TargetCompile.buffers``) whether it fits or is refused. :func:`step_peak` reads it with
``tracers.recording.program_buffers.analyse``, told what the step's inputs are and where its nodes come
from:

- the unrolled step (``fit.model_step.trace_step``) is one aten graph whose flat inputs are the
  parameters, the buffers, AdamW's ``exp_avg``, ``exp_avg_sq`` and step count, then the batch;
  its nodes up to the loss are the forward, those after it the backward and the update;
- the looped step (``fit.scan``) is a JAX function of named arguments (``params``,
  ``buffers``, ``exp_avg``, ``exp_avg_sq``, ``count``, ``tokens``, ``labels``) whose passes
  JAX names (``jvp``, ``transpose``); its layer's nodes are those inside the loop;
- prefill and decode: parameters, buffers, then the KV cache and the tokens.

Each node's line is the model's (transformers' ``modeling_*.py``: the model a config builds has
no user code), read from the stack traces ``make_fx`` records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_debug.tracers.events import ProgramMemoryEvent
from tpu_debug.tracers.recording.program_buffers import NodeFacts, ProgramContext, analyse, node_facts

__all__ = ["LOOP_ARGUMENTS", "looped_context", "step_peak", "unrolled_context"]

#: the looped step's arguments and what their leaves are
LOOP_ARGUMENTS = (("params", "parameter"), ("buffers", "parameter"), ("exp_avg", "optimizer_state"),
                  ("exp_avg_sq", "optimizer_state"), ("count", "optimizer_state"), ("tokens", "input"),
                  ("labels", "input"))


def _loss_position(gm: Any) -> int | None:
    """Where the loss is made in the graph's node order (the first output is ``loss.detach()``)."""
    outputs = gm.graph.output_node().args[0]
    first = outputs[0] if outputs else None
    loss = first.args[0] if first is not None and first.args and hasattr(first.args[0], "name") else first
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return order.get(getattr(loss, "name", None))


def unrolled_context(name: str, traced: Any, names: Sequence[str], train: bool) -> ProgramContext:
    """The context of ``trace_step``'s step (its flat inputs: ``names`` parameters, the
    buffers, AdamW's state for training, then the batch)."""
    gm = traced.graph
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    cut = _loss_position(gm) if train else None
    nodes = {n.name: node_facts(n, "forward" if cut is None or order.get(n.name, 0) <= cut else "backward")
             for n in traced.program.nodes}
    n_p = len(names)
    n_state = 2 * n_p + 1 if train else 0
    n_b = len(traced.specs) - n_p - n_state - (2 if train else 1)
    roles = ["parameter"] * (n_p + n_b) + ["optimizer_state"] * n_state
    sources = [*names, *(f"buffer {i}" for i in range(n_b))]
    if train:
        sources += [*(f"exp_avg[{n}]" for n in names), *(f"exp_avg_sq[{n}]" for n in names), "count"]
    batch = len(traced.specs) - len(roles)
    roles += ["input"] * batch
    sources += ["tokens", "labels"][:batch] if train else [f"input {i}" for i in range(batch)]
    return ProgramContext(name, "compiled", None, nodes, tuple(roles), graph="inference", sources=tuple(sources))


def looped_context(name: str, pieces: Any) -> ProgramContext:
    """The context of ``fit.scan``'s looped step: the layer's nodes inside the loop, the pieces
    before and after it outside; JAX names the passes."""
    outside: dict[str, NodeFacts] = {}
    for piece in (pieces.pre, pieces.post):
        for n in piece.nodes:
            outside.setdefault(n.name, node_facts(n, ""))
    loop = {n.name: node_facts(n, "") for n in pieces.layer.nodes}
    return ProgramContext(name, "compiled", None, outside, named=LOOP_ARGUMENTS, loop_nodes=loop)


def step_peak(compile_result: Any, context: ProgramContext) -> ProgramMemoryEvent | None:
    """The step's peak (None when the compiler wrote no buffer assignment)."""
    c = compile_result
    if c.buffers is None or not c.hlo:
        return None
    refused = c.error is not None and c.error.kind == "hbm_oom"
    memory = c.memory
    compiler = (memory.argument_bytes + memory.output_bytes - memory.alias_bytes + memory.temp_bytes
                if memory is not None else None)
    return analyse(c.buffers, c.hlo, context, source="target", target=c.target.name,
                   status="hbm_oom" if refused else "ok", compiler_bytes=compiler,
                   required_bytes=c.error.required_bytes if refused else None,
                   available_bytes=c.error.available_bytes if refused else None)
