"""What the runtime reports, declared once: the records the probes send and the events carry.

The runtime builds these (``runtime/probes.py`` sends each one to the probes that listen
for it); the recording side turns them into events, and an event about one of them carries
the record as it was reported (``tracers/events.py``'s ``carried``), adding only what the
tracer derives (the user's line, a classified cause). So a field is declared here once, and
both the runtime and every reader of a run name it the same way. A record's live objects
(a compile's JAX stages, a lowered node) are what the recording side reads while the run
goes on; an event stores only what a record holds as plain values.

Plain data: this module imports only the standard library and the rest of ``core``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.desync import RankCall

__all__ = [
    "PARTITION_SPAN",
    "AllocInfo",
    "CollectiveDone",
    "CollectiveInfo",
    "CompileInfo",
    "DesyncInfo",
    "DynamoOrigin",
    "FallbackInfo",
    "FreeInfo",
    "GraphInfo",
    "InputOrigin",
    "InvalidValueInfo",
    "LazyNode",
    "LoweredNode",
    "MaterializeInfo",
    "TransferInfo",
]


# the span the runtime times AOTAutograd's partition of a joint graph under, among dynamo's
# own compile events (``dynamo_timed``), where a compile's phases are read from
PARTITION_SPAN = "tpu_debug_partition"


@dataclasses.dataclass(frozen=True, slots=True)
class LoweredNode:
    """An FX node lowered into a compiled graph's program.

    ``scope`` is the named scope its HLO instructions carry in their metadata
    (``"mul_1|aten::mul.Tensor"``), ``stack_trace`` dynamo's record of the user
    code that made the node, ``modules`` the modules it was traced in. ``backward``: the
    node computes gradients (a backward graph's, or one AOTAutograd traced from a
    ``loss.backward()`` inside the graph).
    """

    name: str
    target: str
    scope: str
    stack_trace: str | None
    backward: bool = False
    # the modules the node was traced in, outermost first (dynamo's ``nn_module_stack``):
    # (path, class name, the file defining the class); a loop over layers shows as one
    # line traced in several instances of one class
    modules: tuple[tuple[str, str, str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class InputOrigin:
    """What one input of a compiled graph's program is to the user, as the runtime knows it.

    ``name`` is the user's name for it ("" when the runtime knows none): a parameter or buffer
    by its module path (``"layers.0.attn.qkv.weight"``), an optimizer's state by its key and
    its parameter's path (``"exp_avg of layers.0.attn.qkv.weight"``), an argument of the
    compiled function by its name (``"x"``). ``saved``: for a backward graph's input that the
    forward saved, the forward's node that computed it (views and detaches of it followed
    back, so a saved ``view_5`` of the softmax's result is the ``_softmax`` node); None for
    any other input. ``storage``: the memory ledger's serial id of the tensor's storage when
    memory was tracked as it compiled (``AllocInfo.storage``: a probe that knows where each
    storage was allocated knows where the input was made), else None.
    """

    name: str = ""
    saved: LoweredNode | None = None
    storage: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DynamoOrigin:
    """What dynamo captured into a graph; the forward, backward and inference graphs
    AOTAutograd makes of one capture share it.

    ``frame`` is dynamo's frame id (one per code object, restarted by
    ``torch._dynamo.reset()``), ``compile_id`` which of its compiles this is
    (``"0/1"``), ``function`` the compiled function's (file, first line, name),
    ``inputs`` dynamo's source of each graph input (``"L['x']"``,
    ``"G['m']._parameters['weight']"``), ``grad_mode`` whether grad was enabled.
    """

    grad_mode: bool
    frame: int | None = None
    compile_id: str | None = None
    function: tuple[str, int, str] | None = None
    inputs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class LazyNode:
    """One op of a lazy fused graph (runtime/lazy.py), as its program's key has it.

    ``name`` is the aten op (``"mm"``, ``"add.Tensor"``) or a built-in step
    (``"cast"``, ``"view"``, ``"write"``, ``"broadcast"``, ``"reshape"``);
    ``inputs`` where each input comes from (``"in3"``: a graph input, ``"s1"``: a
    float scalar, ``"n12"``: an earlier op's output); ``args`` the op's arguments as
    its eager key holds them (shapes, dtypes, static values); ``outputs`` its
    outputs' avals (``"float32[8,64]"``); ``site`` the site ``on_defer`` announced for
    the op's place in its graph (None when no probe listened as it was recorded).
    """

    name: str
    inputs: tuple[str, ...]
    args: tuple[ArgSpec, ...]
    outputs: tuple[str, ...]
    site: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GraphInfo:
    """A graph compiled into one program: which graph (``kind``: ``"forward"``,
    ``"backward"`` or ``"inference"`` for compiled mode's AOT graphs, ``"lazy"`` for
    a lazy fused graph), its lowered nodes, its code, and where dynamo got it.
    A lazy graph also lists its ``ops`` and the values it returns (``outputs``).
    ``label`` says what a compiled graph is for a reader: its kind, or ``"train_step"``
    / ``"optimizer_step"`` for an inference graph that is one (None: its kind).
    ``inputs``: what each input of a compiled graph's program is, in order: for a forward
    or inference graph the tensors AOTAutograd lifted from the graph module (an optimizer's
    state, by attribute name) and then dynamo's sources (``"G['m']._parameters['weight']"``),
    for a backward graph its placeholders (``"primals_1"``, a saved ``"addmm"``,
    ``"tangents_1"``); empty when not known. ``origins``: what each of those inputs is to
    the user (:class:`InputOrigin`, in the same order; empty when not known)."""

    kind: str
    nodes: tuple[LoweredNode, ...]
    code: str
    origin: DynamoOrigin
    ops: tuple[LazyNode, ...] = ()
    outputs: tuple[str, ...] = ()
    label: str | None = None
    inputs: tuple[str, ...] = ()
    origins: tuple[InputOrigin, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class CompileInfo:
    """An executable was compiled (an eager op or a compiled graph).

    ``lowered``/``compiled`` are the JAX stage objects; text is produced only
    when a tracer asks for it. ``settings`` are what the executable's key holds
    beyond its arguments (``("matmul precision", "highest")``); ``graph``
    describes a compiled-mode graph (None for an eager op). ``replayed`` marks
    a compile that happened before the probe subscribed (see :func:`subscribe`).
    ``jitted`` is the ``jax.jit``-wrapped function ``lowered`` came from (lowered
    with 64-bit types on, from ``lowered.args_info``'s avals): a tracer lowers it
    again for another platform when the lowering holds a custom call only the
    CPU has (LAPACK's, say). ``from_cache`` marks an executable read back from the
    persistent compile cache (nothing compiled; ``seconds`` is the read-back), and
    ``saved_seconds`` the compile time that saved (``runtime/compile_cache.py``).

    ``seconds`` is measured from the start of the lowering to the executable in hand;
    ``lower_seconds`` is its first part, tracing the program to a jaxpr and lowering that
    to StableHLO (the rest is XLA's compile, or the read-back), and ``wall_seconds`` the
    runtime's whole compile of the program (building the function to trace and the
    executable's record too), which holds ``seconds``. Both 0.0: not measured.
    """

    mode: str
    name: str
    key: Any
    args: tuple[ArgSpec, ...]
    seconds: float
    lowered: Any = None
    compiled: Any = None
    settings: tuple[tuple[str, Any], ...] = ()
    graph: GraphInfo | None = None
    replayed: bool = False
    jitted: Any = None
    from_cache: bool = False
    saved_seconds: float = 0.0
    lower_seconds: float = 0.0
    wall_seconds: float = 0.0
    # the persistent compile cache's file for this program (read back, or written or looked up
    # in vain); None when the cache was off or not asked
    cache_entry: str | None = None
    # why the cache did not serve a program an earlier run had compiled: (cause, detail), the
    # cause "flag", "version", "path" or "program" (runtime/compile_cache.py's why_missed)
    cache_miss: tuple[str, str] | None = None

    def stablehlo(self) -> str:
        return self.lowered.as_text() if self.lowered is not None else ""

    def hlo(self) -> str:
        return self.compiled.as_text() if self.compiled is not None else ""


@dataclasses.dataclass(frozen=True, slots=True)
class TransferInfo:
    """Data crossed between host and device."""

    direction: str  # "h2d" | "d2h" | "d2d"
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str
    seconds: float
    # a host->device payload's fingerprint (see eager.payload_digest): equal digests at one
    # call site mean the same bytes were uploaded again; None when not taken
    digest: str | None = None
    # time spent compiling beside the copy, not in ``seconds``: an op that reads its inputs
    # on the host to run (a boolean mask) has JAX compile what it dispatches for new shapes
    compile_seconds: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class FallbackInfo:
    """An op ran on CPU because it has no lowering."""

    op: str
    args: tuple[ArgSpec, ...]
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveInfo:
    """A c10d collective call of the `tpu` process group (runtime/distributed/c10d/), told
    when this rank enters it: a rank stuck in one has reported it, and the ranks' sequences
    of these show where they stopped agreeing.

    ``op`` is the process group's method (``allreduce``, ``all_gather_single``, ``send``...),
    ``group`` c10d's name of the group, ``ranks`` its members' global ranks, ``rank`` this
    process's rank in it, ``seq`` the group's collectives counted from 1 on this rank (its
    sends and receives are counted apart);
    ``shapes`` and ``dtype`` describe the tensors given (outputs, then inputs), ``nbytes``
    their total; ``reduce_op`` the reduction (None for none) and ``peer`` the other rank of
    a send, receive or broadcast root (None for none).
    """

    op: str
    group: str
    ranks: tuple[int, ...]
    rank: int
    seq: int
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    nbytes: int
    reduce_op: str | None = None
    peer: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveDone:
    """This rank returned from the c10d collective it entered as the :class:`CollectiveInfo`
    with the same ``op``, ``group``, ``rank`` and ``seq``: ``seconds`` from its entry to the
    results written back (the host copies, the engine's call and the write-back). An entry
    with no such return means the rank never came back from it (stuck, raised or killed).
    """

    op: str
    group: str
    rank: int
    seq: int
    seconds: float
    # the live check's view of the ranks' arrival: the global rank that entered last, and the
    # seconds this rank waited for it (None when unchecked, or for a send or receive)
    last_rank: int | None = None
    waited: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DesyncInfo:
    """The live check of a c10d group found its ranks calling different collectives, or a rank
    not arriving (runtime/distributed/c10d/live_check.py), just before this rank raises.

    ``group``, its members' global ``ranks``, this process's ``rank`` (global) and the
    collective's ``seq``; ``reason`` and ``cause`` as :mod:`tpu_debug.core.desync` names
    them, each rank's ``calls`` (:class:`tpu_debug.core.desync.RankCall`), the ``timeout``
    waited (None for a difference seen at once) and the error's ``message``.
    """

    group: str
    ranks: tuple[int, ...]
    rank: int
    seq: int
    reason: str
    cause: str
    calls: tuple[RankCall, ...]
    timeout: float | None
    message: str
    # a send and its receive: (source, destination, tag, the n-th call of that channel), global
    # ranks; empty for a collective of the group
    p2p: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class MaterializeInfo:
    """Lazy mode ran its pending graph, because a value was needed.

    ``trigger`` is why, as the runtime knows it: ``"read"`` (a value read on the host
    or by a program: ``.item()``, ``.cpu()``, ``print``, ``if t:``; the tracer tells
    them apart), ``"synchronize"``, ``"optimizer_step"``, ``"size_limit"``,
    ``"mode_change"``, ``"fallback:<op>"`` (an op run on CPU) or
    ``"data_dependent:<op>"`` (an op whose output shape depends on values). ``name``
    and ``key`` are its program's (as in its CompileInfo; ``""`` and None when no
    value was referenced any more and nothing ran). ``ops`` are the ops recorded,
    ``outputs`` the values computed, ``inputs`` the arrays read; ``compiled``: the
    program was compiled for it (no cached program had its key); ``seconds`` the
    whole materialization (compile included).
    """

    trigger: str
    name: str
    key: Any
    ops: int
    outputs: int
    inputs: int
    compiled: bool
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class AllocInfo:
    """Device bytes were charged to a storage (see ``runtime/memory_ledger.py``).

    ``storage`` is the storage's serial id (a probe keys its records by it),
    ``nbytes`` the bytes charged now (0 for a new storage sharing a payload another
    storage is charged for), ``shape``/``dtype`` the payload's. ``new``: the storage
    was first seen now, so the line allocating it is on the stack (unless
    ``existing``: it was allocated before tracking began); otherwise the bytes came
    to a storage known already (a payload's other holder went, or the payload grew).
    ``node``: for a compiled graph's output, the graph node that computed it (its stack
    trace holds the line inside the model; the stack holds only the call); else None.
    """

    storage: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    new: bool = True
    existing: bool = False
    node: LoweredNode | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FreeInfo:
    """Device bytes charged to a storage were released (``nbytes`` may be 0);
    ``dead``: the storage itself is gone."""

    storage: int
    nbytes: int
    dead: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class InvalidValueInfo:
    """An op was called with argument values PyTorch's CPU kernel refuses and XLA does not
    (runtime/value_checks.py): what a TPU would compute silently.

    ``op`` is the aten op (``"gather"``, ``"index.Tensor"``, ``"multinomial"``), ``argument``
    the argument whose values are wrong (``"index"``, ``"indices[1]"``, ``"self"``),
    ``value`` the first offending value (an index, a probability, a row's sum, a count of
    mask elements), ``low``/``high`` the values accepted, ``low <= v < high`` (None: no
    bound on that side; a distribution's entries are accepted in ``[0, inf)``, finite),
    ``message`` PyTorch's error for the call and ``error`` its type (``"RuntimeError"``,
    ``"IndexError"``), ``silent`` what XLA does instead (``"clamped"``: the index is moved
    into range, or the row read is another one; ``"sampled"``: categories drawn from a
    distribution that is not one; ``"overrun"``: the source read past its end).

    ``mode`` is ``"eager"``, ``"lazy"`` or ``"compiled"``; ``raised``: the runtime raises
    ``message`` right after this notification (data checks on), else the program goes on
    with XLA's result. Where the user's line is: eager, the caller's stack (the op is being
    called); lazy, ``site``, the site ``on_defer`` announced for the check's step of the
    pending graph (``check:<op>``, recorded just before the op; None when no probe listened
    to ``on_defer``); compiled, ``node``, the graph node the op was lowered from (its
    ``stack_trace`` is dynamo's record of the user's code).
    """

    op: str
    argument: str
    value: float | int
    low: float | int | None
    high: float | int | None
    message: str
    error: str
    silent: str
    mode: str
    raised: bool
    site: int | None = None
    node: LoweredNode | None = None


