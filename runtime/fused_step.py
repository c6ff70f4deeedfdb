"""A whole training step in one dynamo graph: forward, ``loss.backward()``, ``opt.step()``
and ``opt.zero_grad()``.

With ``torch._dynamo.config.trace_autograd_ops`` (what ``tpu_debug.compile`` sets while
a function runs) dynamo traces ``loss.backward()`` into the graph, but PyTorch's
optimizers still keep the step out of it, and the pieces that do it assume the
gradients exist before the graph runs:

- ``Optimizer.step`` (through ``_use_grad_for_differentiable``) calls
  ``torch._dynamo.graph_break()`` before and after the update, so that AOTAutograd sees
  the update as a graph of its own without autograd;
- ``Optimizer.zero_grad`` is ``torch._disable_dynamo``: a graph break;
- dynamo runs the optimizer's ``_init_group`` on the real Python objects, so it sees
  ``p.grad`` as it was before the graph (None on the first step): the gradients the
  traced backward computed are invisible to it, and the update silently does nothing;
- it marks the parameters "static" (for CUDA graphs), which makes dynamo put them into
  the graph as attributes instead of inputs, where a traced backward no longer finds
  them: again no gradient, silently.

:func:`install` adjusts each of these, only while ``trace_autograd_ops`` is set (so
``torch.compile`` with any backend and no traced backward is unchanged): the graph
breaks go, ``zero_grad`` is traced, ``_init_group`` sees the gradients the graph
computed, and parameters stay graph inputs. Eager behaviour is the same in every case
(``graph_break()`` does nothing outside dynamo). One fix applies always: a traced
``p.grad`` read after a traced ``p.grad = None`` no longer corrupts dynamo's shared
None constant (:func:`_patch_grad_none`). Global optimizer-step hooks, which dynamo
does not trace, run after the compiled call (:class:`StepHooks`). Tied to the PyTorch
versions the constraints pin: :func:`install` checks the pieces it replaces and leaves
everything as it is when they differ.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch
from torch.optim import optimizer as _optimizer_module

__all__ = ["StepHooks", "install"]

_state: dict[str, Any] = {}
_calling = threading.local()  # .hooks: the StepHooks of the compiled call running on this thread


_BREAK = "torch._dynamo.graph_break()"


def _use_grad_factory():
    """PyTorch's ``_use_grad_for_differentiable`` compiled again from its own source, each
    ``graph_break()`` skipped under a traced backward (``trace_autograd_ops or
    graph_break()``, on the same line): file and line numbers stay PyTorch's, so a graph
    break it still makes reads as the optimizer's own. None when the source differs from
    the one this edit expects (two breaks)."""
    import inspect

    from torch.optim import optimizer as optim_mod

    try:
        lines, start = inspect.getsourcelines(optim_mod._use_grad_for_differentiable)
    except (OSError, TypeError):
        return None
    source = "".join(lines)
    if source.count(_BREAK) != 2 or lines[0].startswith((" ", "\t")):
        return None
    source = source.replace(_BREAK, "torch._dynamo.config.trace_autograd_ops or " + _BREAK)
    namespace = dict(vars(optim_mod))  # its globals; the module's own name stays PyTorch's
    exec(compile("\n" * (start - 1) + source, optim_mod.__file__, "exec"), namespace)
    factory = namespace["_use_grad_for_differentiable"]
    if factory(lambda: None).__code__.co_freevars != ("func",):
        return None
    return factory


def _optimizer_classes():
    todo = [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        yield cls
        todo.extend(cls.__subclasses__())


def patch_step_functions(factory) -> int:
    """Give every optimizer class's ``_use_grad`` closure the code of ``factory``'s (no
    graph breaks under a traced backward); classes defined later get it from ``factory``.
    The number of closures patched."""
    from torch.optim import optimizer as optim_mod

    original = optim_mod._use_grad_for_differentiable(lambda: None).__code__
    replacement = factory(lambda: None).__code__
    count = 0
    for cls in list(_optimizer_classes()):
        fn = cls.__dict__.get("step")
        while fn is not None:  # profile_hook_step's wrapper, then _use_grad
            if getattr(fn, "__code__", None) is original:
                fn.__code__ = replacement
                count += 1
            fn = getattr(fn, "__wrapped__", None)
    optim_mod._use_grad_for_differentiable = factory
    return count


def _patch_zero_grad() -> None:
    """``zero_grad`` without its dynamo-disable while a compiled step runs (swapped in by
    :meth:`StepHooks.call`): PyTorch's own function, so dynamo traces it into the graph
    and no frame of ours is left for dynamo to meet."""
    disabled = torch.optim.Optimizer.zero_grad
    _state["zero_grad"] = (disabled, disabled.__wrapped__)


def _patch_static_marks() -> None:
    """Parameters stay graph inputs under a traced backward: a parameter marked static
    with a guard becomes a graph attribute, where the traced backward does not look for
    leaves (dynamo marks a module's own parameters static without one)."""
    from torch._dynamo import decorators

    mark = decorators.mark_static_address

    @functools.wraps(mark)
    def mark_static_address(t, guard: bool = False) -> None:
        if torch._dynamo.config.trace_autograd_ops and isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf:
            guard = False  # as dynamo marks a module's parameters; it also undoes an earlier guarded mark
        mark(t, guard)

    decorators.mark_static_address = mark_static_address


def _patch_init_group() -> None:
    """``_init_group`` sees the gradients the traced backward computed (pending
    ``.grad`` writes of the graph), not the real ``p.grad`` from before the graph."""
    from torch._dynamo.variables import optimizer as optvar
    from torch._dynamo.variables.constant import ConstantVariable

    cls = optvar.OptimizerVariable
    call_method, wrap_tensor = cls.call_method, cls.wrap_tensor
    pending: dict[int, tuple[torch.Tensor, Any]] = {}  # id(stand-in) -> (stand-in, the graph's grad)

    def grads_in_graph(self, tx) -> dict:
        side = tx.output.side_effects
        found = {}
        for group in self.value.param_groups:
            for p in group["params"]:
                var = side.id_to_variable.get(id(p))
                if var is not None and side.has_pending_mutation_of_attr(var, "grad"):
                    found[p] = side.load_attr(var, "grad")
        return found

    def other_mutations(self, tx) -> None:
        """PyTorch's graph break for a parameter with a pending write, ``.grad`` aside."""
        side = tx.output.side_effects
        for group in self.value.param_groups:
            for p in group["params"]:
                var = side.id_to_variable.get(id(p))
                if var is not None and any(k != "grad" for k in side.store_attr_mutations.get(var, ())):
                    return cls.graph_break_if_pending_mutation(self, tx)
        return None

    def patched_call_method(self, tx, name, args, kwargs):
        if name != "_init_group" or not torch._dynamo.config.trace_autograd_ops:
            return call_method(self, tx, name, args, kwargs)
        hooks = getattr(_calling, "hooks", None)
        if hooks is not None:  # this optimizer steps in the function being traced
            hooks.optimizers.add(self.value)
        grads = grads_in_graph(self, tx)
        before = {p: p.grad for p in grads}
        try:
            for p, grad in grads.items():
                if isinstance(grad, ConstantVariable) and grad.value is None:
                    p.grad = None
                else:  # a stand-in the real _init_group collects, mapped back in wrap_tensor
                    stand_in = p.detach()
                    p.grad = stand_in
                    pending[id(stand_in)] = (stand_in, grad)
            if grads:  # the graph's own .grad writes are not the mutations that check is for
                self.graph_break_if_pending_mutation = functools.partial(other_mutations, self)
            return call_method(self, tx, name, args, kwargs)
        finally:
            self.__dict__.pop("graph_break_if_pending_mutation", None)
            for p, grad in before.items():
                p.grad = grad
            pending.clear()

    def patched_wrap_tensor(self, tx, tensor_value):
        hit = pending.get(id(tensor_value))
        if hit is not None and hit[0] is tensor_value:
            return hit[1]
        return wrap_tensor(self, tx, tensor_value)

    cls.call_method = patched_call_method
    cls.wrap_tensor = patched_wrap_tensor


def _patch_grad_none() -> None:
    """A traced ``p.grad`` that reads a traced ``p.grad = None`` gets a None of its own.

    Dynamo returns the stored value, its shared None constant, and then sets that
    object's ``source`` to ``p.grad``: every later use of None in any trace (a function
    returning None) would name this parameter, gone with its optimizer."""
    from torch._dynamo.variables import tensor as tensorvar
    from torch._dynamo.variables.constant import ConstantVariable

    cls = tensorvar.TensorVariable
    method = cls.method_attr_grad

    def method_attr_grad(self, tx):
        result = method(self, tx)
        if isinstance(result, ConstantVariable) and result.value is None and result.source is None:
            return ConstantVariable(None)
        return result

    cls.method_attr_grad = method_attr_grad


class StepHooks:
    """The global optimizer-step post hooks (``register_optimizer_step_post_hook``: a
    tracer's step counter, say) of one compiled function, run after its program.

    Such a hook is Python dynamo does not trace: called inside the step's graph it would
    break the graph there, after the backward, and split the step into several programs.
    :meth:`call` takes the hooks away while the compiled function runs (dynamo traces an
    optimizer step without them) and then calls them for each optimizer whose step was
    traced into the function, as ``opt.step()`` would have at its end."""

    def __init__(self):
        self.optimizers: weakref.WeakSet = weakref.WeakSet()

    def call(self, compiled, args, kwargs):
        hooks = _optimizer_module._global_optimizer_post_hooks
        disabled, plain = _state["zero_grad"]
        _calling.hooks = self
        saved = None
        if hooks:
            saved = dict(hooks)
            hooks.clear()
        torch.optim.Optimizer.zero_grad = plain
        try:
            out = compiled(*args, **kwargs)
        finally:
            torch.optim.Optimizer.zero_grad = disabled
            if saved:
                hooks.update(saved)
            _calling.hooks = None
        if saved:
            for optimizer in list(self.optimizers):
                for hook in saved.values():
                    hook(optimizer, (), {})
        return out


def _compatible() -> bool:
    """Whether the PyTorch pieces replaced here are the ones this module knows."""
    from torch._dynamo.variables import optimizer as optvar
    from torch._dynamo.variables import tensor as tensorvar
    from torch.optim import optimizer as optim_mod

    names = ("call_method", "wrap_tensor", "graph_break_if_pending_mutation", "map_sources_and_install_guards")
    return (
        hasattr(torch.optim.Optimizer.zero_grad, "__wrapped__")
        and all(hasattr(optvar.OptimizerVariable, n) for n in names)
        and hasattr(torch._dynamo.config, "trace_autograd_ops")
        and hasattr(tensorvar.TensorVariable, "method_attr_grad")
        and isinstance(getattr(optim_mod, "_global_optimizer_post_hooks", None), dict)
    )


def install() -> bool:
    """Let a traced training step's optimizer step and ``zero_grad`` into its graph
    (once per process). False when this PyTorch's optimizer internals differ from the
    ones replaced here: then the step stays split where PyTorch splits it."""
    if "installed" in _state:
        return _state["installed"]

    factory = _use_grad_factory()
    ok = factory is not None and _compatible()
    if ok:
        patch_step_functions(factory)
        _patch_zero_grad()
        _patch_static_marks()
        _patch_init_group()
        _patch_grad_none()
    _state["installed"] = ok
    return ok
