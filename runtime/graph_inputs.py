"""What each input of a compiled graph's program is to the user: a parameter's module path, an
optimizer's state by its parameter, an argument's name, and for a backward graph the forward
node that computed each tensor the forward saved.

AOTAutograd names a backward graph's inputs after the forward's nodes whose values it saved
(``view_5``, ``detach``: often a view or a detach of what a PyTorch line computed), the
forward's inputs ``primals_<n>`` and the incoming gradients ``tangents_<n>``; dynamo names a
forward's inputs by their sources (``L['self']._modules['qkv']._parameters['weight']``) and
lifts an optimizer's state into the graph module under a mangled attribute name
(``opt___state_list_dict_keys_G__opt___state___1___exp_avg``). Neither is what a user calls
them. Here the tensors themselves are matched, by identity, with what the compiled frame can
see (its modules' ``named_parameters``, its optimizers' ``state``), and a saved value's node
is followed back through views and detaches to the op that computed it, whose stack trace
is the user's line. The records are :class:`~tpu_debug.core.records.InputOrigin`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx

from tpu_debug.core.records import InputOrigin, LoweredNode
from tpu_debug.runtime import memory_ledger

__all__ = ["backward_inputs", "forward_origins", "output_nodes"]

# ops whose result is another name for (part of) their first input's bytes: followed back to
# what computed them. ``_unsafe_view`` is a view in all but its schema (a reshape's result)
_ALIASING = frozenset({torch.ops.aten._unsafe_view.default, torch.ops.aten.clone.default,
                       torch.ops.aten.lift_fresh_copy.default})


def _frame_objects() -> list[Any]:
    """The values the frame dynamo compiled can see (its locals, then its globals), or none
    when no frame is being compiled (a backward compiles lazily, outside dynamo)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # noqa: BLE001 - dynamo's internals moved: names come from sources alone
        return []
    if tx is None:
        return []
    values = list(getattr(tx, "f_locals", {}).values()) + list(getattr(tx, "f_globals", {}).values())
    # one level of attributes of ``self`` (a trainer holding its model and optimizer)
    owner = getattr(tx, "f_locals", {}).get("self")
    if owner is not None and not isinstance(owner, torch.nn.Module):
        values += [v for v in vars(owner).values()] if hasattr(owner, "__dict__") else []
    return values


def _tensor_names(objects: Iterable[Any]) -> dict[int, str]:
    """id(tensor) -> its name: a module's parameters and buffers by path (the largest module's
    path first: a submodule also in scope does not rename its parent's weights), an optimizer's
    state as ``<key> of <its parameter's path>``."""
    modules = sorted({id(o): o for o in objects if isinstance(o, torch.nn.Module)}.values(),
                     key=lambda m: -sum(1 for _ in m.parameters()))
    names: dict[int, str] = {}
    for module in modules:
        for path, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            names.setdefault(id(t), path)
    for opt in (o for o in objects if isinstance(o, torch.optim.Optimizer)):
        for group in opt.param_groups:
            for i, p in enumerate(group["params"]):
                names.setdefault(id(p), f"param_groups[{opt.param_groups.index(group)}]['params'][{i}]")
        for p, state in opt.state.items():
            if not isinstance(state, dict):
                continue
            for key, t in state.items():
                if isinstance(t, torch.Tensor):
                    names.setdefault(id(t), f"{key} of {names.get(id(p), 'a parameter')}")
    return names


def _source_name(source: str) -> str:
    """An argument's name from dynamo's source: ``L['x']`` -> ``x``, ``L['batch']['ids']`` ->
    ``batch['ids']``, a module's weight ``L['self']._modules['qkv']._parameters['weight']`` ->
    ``qkv.weight``; "" for a source it does not read (a lifted attribute)."""
    if not source.startswith(("L['", "G['")):
        return ""
    root, _, rest = source[3:].partition("']")
    path = rest
    for kind in ("_modules", "_parameters", "_buffers"):
        path = path.replace(f".{kind}['", ".").replace(f"{kind}['", "")
    path = path.replace("']", "")
    if root == "self" and path.startswith("."):
        return path[1:]
    return root + path


def _storage(t: Any) -> int | None:
    ledger = memory_ledger.active()
    if ledger is None or not isinstance(t, torch.Tensor):
        return None
    try:
        return ledger.serial(t.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return None


def forward_origins(graph: torch.fx.GraphModule, lifted: Sequence[str], sources: Sequence[str],
                    example_inputs: Sequence[Any]) -> tuple[InputOrigin, ...]:
    """The :class:`InputOrigin` of each input of a forward (or inference) graph's program: the
    tensors AOTAutograd lifted from ``graph`` (attribute names ``lifted``), then dynamo's
    inputs (``sources``, the real ``example_inputs``)."""
    tensors = [_attribute(graph, name) for name in lifted] + list(example_inputs)
    try:
        names = _tensor_names(_frame_objects())
    except Exception:  # noqa: BLE001 - a user object that refuses to be read: names come from sources
        names = {}
    out = []
    for i, t in enumerate(tensors):
        source = lifted[i] if i < len(lifted) else (sources[i - len(lifted)] if i - len(lifted) < len(sources) else "")
        name = names.get(id(t), "") if isinstance(t, torch.Tensor) else ""
        out.append(InputOrigin(name or _source_name(source), None, _storage(t)))
    return tuple(out)


def _attribute(graph: torch.fx.GraphModule, name: str) -> Any:
    try:
        return graph.get_parameter(name)
    except AttributeError:
        try:
            return graph.get_buffer(name)
        except AttributeError:
            return None


def _computed_by(node: torch.fx.Node) -> torch.fx.Node:
    """The node that computed ``node``'s bytes: views, detaches and tuple reads followed back."""
    for _ in range(64):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return node
        target = node.target
        if target is operator.getitem or target in _ALIASING or (
                isinstance(target, torch._ops.OpOverload) and target.is_view):
            node = node.args[0]
            continue
        return node
    return node


def _lowered(node: torch.fx.Node) -> LoweredNode:
    target = node.target
    op = str(target).removeprefix("aten.") if isinstance(target, torch._ops.OpOverload) else str(target)
    return LoweredNode(node.name, str(target), f"{node.name}|aten::{op}", node.meta.get("stack_trace"))


def output_nodes(graph: torch.fx.GraphModule) -> tuple[LoweredNode | None, ...]:
    """The node that computed each output of ``graph`` (views and detaches followed back),
    None for an output that is an input or no tensor: the memory a graph's output holds is
    charged to the line inside the model that made it."""
    out = []
    for arg in graph.graph.output_node().args[0]:
        node = _computed_by(arg) if isinstance(arg, torch.fx.Node) else None
        out.append(_lowered(node) if node is not None and node.op == "call_function" else None)
    return tuple(out)


def _primal(name: str, sources: Sequence[str]) -> str:
    """A backward placeholder's name, or for ``primals_<n>`` the forward's input ``n``'s source."""
    number = name.removeprefix("primals_")
    if number != name and number.isdigit() and 0 < int(number) <= len(sources):
        return sources[int(number) - 1]
    return name


def backward_inputs(backward: torch.fx.GraphModule, forward: torch.fx.GraphModule | None,
                    sources: Sequence[str], origins: Sequence[InputOrigin]
                    ) -> tuple[tuple[str, ...], tuple[InputOrigin, ...]]:
    """What each input of a backward graph's program (its placeholders) is called and is.

    A forward input it saved (``primals_<n>``, or a view of one: a transposed weight) is named
    and described as that input of the forward (``sources`` and ``origins`` are the forward's);
    a value the forward computed keeps its placeholder's name, and its origin is the forward
    node that computed it; an incoming gradient (``tangents_<n>``) has no origin."""
    nodes = {n.name: n for n in forward.graph.nodes} if forward is not None else {}
    placeholders = [n for n in forward.graph.nodes if n.op == "placeholder"] if forward is not None else []
    names, out = [], []
    for placeholder in backward.graph.find_nodes(op="placeholder"):
        node = nodes.get(placeholder.name)
        if node is None:
            names.append(_primal(placeholder.name, sources))
            out.append(InputOrigin())
            continue
        node = _computed_by(node)
        if node.op == "placeholder":
            i = placeholders.index(node)
            names.append(sources[i] if i < len(sources) else placeholder.name)
            out.append(origins[i] if i < len(origins) else InputOrigin())
            continue
        names.append(placeholder.name)
        out.append(InputOrigin("", _lowered(node)))
    return tuple(names), tuple(out)
