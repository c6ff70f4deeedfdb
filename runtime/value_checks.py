"""Checks of argument values: what PyTorch's CPU kernels refuse and XLA computes silently.

An index out of range (``gather``, ``scatter``, ``index_select``, ``take``, ``embedding``,
``x[i]``, ...) raises on CPU; XLA clamps it into range on a TPU and the program goes on with
another row. A probability distribution with a negative, ``nan`` or ``inf`` entry, or no
mass, raises in ``multinomial`` on CPU; XLA samples from it. Each such check is declared on
its op's lowering (``Lowering.values``, a :class:`~tpu_debug.runtime.ops._checks.ValueCheck`)
and made here, in the way each mode allows:

==========  ==========================================  ===============================
mode        ``config.data_checks``: None (default)      True
==========  ==========================================  ===============================
eager       checked before the op runs; raises          the same
lazy        not checked: the program is unchanged       checked at the op: the pending
                                                        graph runs (a sync); raises
compiled    not checked: the program is unchanged       checked inside the program, read
                                                        after it ran; raises
==========  ==========================================  ===============================

``data_checks=False`` turns the eager check off too. An eager check reads the checked
values on the host (an op by op program waits for them anyway before its next read: the
read costs a device-to-host copy of the index, measured in docs/op_coverage.md); a lazy or
compiled check computes one small report (a code and the offending value) in the program.

Whatever the setting, a probe listening for ``on_invalid_value`` hears every failed check
(:class:`~tpu_debug.runtime.probes.InvalidValueInfo`), raised or not: lazy and compiled
programs then compute the checks in the same program, so a run no probe listens to pays
nothing. When nothing raises, a report is read once its program has run, never by waiting
for it: reading a report just after its program was dispatched would wait for the whole
program, a wait per program the unchecked run does not make. The reports already computed
are read at the next program computing checks, after a copy to the host (the program was
waited for then anyway), and all of them at ``torch.tpu.synchronize()`` and when the last
listening probe leaves (the end of a trace); :data:`PENDING_BOUND` bounds how many wait.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tpu_debug.runtime import probes
from tpu_debug.runtime.config import config
from tpu_debug.core.records import InvalidValueInfo
from tpu_debug.runtime.tensor import to_jax

__all__ = [
    "PENDING_BOUND",
    "arguments_first",
    "compiled",
    "eager",
    "flush",
    "found",
    "pending",
    "poll",
    "raising",
    "read",
    "read_compiled",
    "read_pending",
    "report",
    "wanted",
]


def raising(mode: str) -> bool:
    """Whether a failed check raises PyTorch's error in ``mode`` (see the module docstring)."""
    on = config.data_checks
    return mode == "eager" if on is None else on


def wanted(mode: str) -> bool:
    """Whether ops are checked in ``mode``: the checks raise, or a probe listens."""
    return raising(mode) or bool(probes._routes.on_invalid_value)


def _builtin(exc: BaseException) -> str:
    return next(c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins")


def _number(value) -> float | int:
    v = float(value)
    return int(v) if v.is_integer() else v


def arguments_first(op, args, kwargs) -> None:
    """Run ``op``'s meta kernel on meta copies of the call's tensors: PyTorch checks shapes and
    dtypes (an index of the wrong rank, say) before values, so a call failing both raises the
    argument error. Made only once a value check failed."""
    def meta(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(meta(x) for x in v)
        return v

    try:
        op(*meta(list(args)), **{k: meta(v) for k, v in kwargs.items()})
    except NotImplementedError:
        pass  # no meta kernel: nothing more to check


def found(op: str, check, code, value, statics, mode: str, *, raises: bool, site: int | None = None,
          node=None) -> None:
    """A failed check (``code`` nonzero): tell the probes, then raise PyTorch's error if ``raises``."""
    refusal = check.refusal(code, value, statics)
    if probes._routes.on_invalid_value:
        probes.invalid_value(InvalidValueInfo(
            op, refusal.argument, _number(value), refusal.low, refusal.high, str(refusal.error),
            _builtin(refusal.error), refusal.silent, mode, raises, site, node,
        ))
    if raises:
        raise refusal.error


def eager(op, name: str, check, args, kwargs) -> None:
    """Check one eager call of ``op`` (named ``name``): its values, read on the host (the caller
    tested :func:`wanted`)."""
    arrays, statics = check.select(*args, **kwargs)
    if not arrays:
        return
    if probes._probes:
        with probes.quiet():  # the runtime's own read: not a transfer of the program's
            host = _host(arrays)
    else:
        host = _host(arrays)
    code, value = check.test(np, host, statics)
    if int(code):
        arguments_first(op, args, kwargs)
        found(name, check, code, value, statics, "eager", raises=raising("eager"))


def _host(tensors) -> list:
    return [np.asarray(to_jax(t)) if t.device.type == "tpu" else t.numpy() for t in tensors]


def report(check, *args):
    """The program step of a check (lazy step, compiled graph): its arrays and then its
    statics in, ``[code, value]`` out (float64)."""
    *arrays, statics = args
    code, value = check.test(jnp, arrays, statics)
    return jnp.stack([jnp.asarray(code, jnp.float64), jnp.asarray(value, jnp.float64)])


def read(report_value, name: str, check, statics, mode: str, *, raises: bool, site: int | None = None,
         node=None) -> None:
    """Read a report a program computed; a failed check is :func:`found`."""
    code, value = np.asarray(report_value)
    if code:
        found(name, check, code, value, statics, mode, raises=raises, site=site, node=node)


# lazy mode: reports recorded while a probe listens and nothing raises, read once their graph ran
# (report LazyArray, op name, check, statics, site)
pending: list[tuple] = []
# compiled mode: reports of programs dispatched while a probe listens and nothing raises
# (report array, op name, check, statics, the node's LoweredNode)
_computed: list[tuple] = []
# beyond this many reports waiting, the oldest half is read (waiting if need be): a loop that
# never reads a value on the host must not keep every step's reports alive
PENDING_BOUND = 256


def _ready(value) -> bool:
    ready = getattr(value, "is_ready", None)
    return ready is None or ready()


def read_pending(wait: bool = False) -> None:
    """Read the lazy graphs' reports whose program has run (``wait``: waiting for it)."""
    if not pending:
        return
    keep = []
    for p in pending:
        value = p[0].array
        if value is not None and (wait or _ready(value)):
            read(value, p[1], p[2], p[3], "lazy", raises=False, site=p[4])
        else:
            keep.append(p)
    pending[:] = keep


def _read_computed(wait: bool) -> None:
    keep = []
    for entry in _computed:
        if wait or _ready(entry[0]):
            read(entry[0], entry[1], entry[2], entry[3], "compiled", raises=False, node=entry[4])
        else:
            keep.append(entry)
    _computed[:] = keep


def poll() -> None:
    """Read the reports whose programs have run, without waiting for any."""
    if pending:
        read_pending()
    if _computed:
        _read_computed(False)


def flush() -> None:
    """Read every report of a program dispatched so far, waiting for the programs (a lazy
    graph not run yet keeps its reports)."""
    if pending:
        read_pending(wait=True)
    if _computed:
        _read_computed(True)


def _bound() -> None:
    if len(_computed) > PENDING_BOUND:
        old, _computed[:] = _computed[: PENDING_BOUND // 2], _computed[PENDING_BOUND // 2:]
        for entry in old:
            read(entry[0], entry[1], entry[2], entry[3], "compiled", raises=False, node=entry[4])
    if len(pending) > PENDING_BOUND:
        read_pending(wait=True)


def compiled(reports, checks) -> None:
    """A compiled program's reports (``checks``: per report, the op's name, its check, its
    statics and the graph node's LoweredNode): read now when a failed check raises (the
    caller must see the error at this call), else kept until computed (see the module
    docstring)."""
    if raising("compiled"):
        read_compiled(reports, checks)
        return
    poll()
    _computed.extend((value, *info) for value, info in zip(reports, checks))
    _bound()


def read_compiled(reports, checks) -> None:
    """After a compiled program ran: read its reports (``checks``: per report, the op's name,
    its check, its statics and the graph node's LoweredNode); every failure is told to the
    probes before the first one raises (when checks raise)."""
    raises = raising("compiled")
    first = None
    for value, (name, check, statics, node) in zip(reports, checks):
        try:
            read(value, name, check, statics, "compiled", raises=raises, node=node)
        except Exception as exc:  # noqa: BLE001 - raised below, after the other nodes are read
            first = first or exc
    if first is not None:
        raise first


probes._report_flush = flush
