"""Ranks agree on each program before they run it together, or say how they differ.

A program over devices of several processes runs only when every process runs
it: its collectives wait for all of them. If one rank took another path (a
branch on the rank, a rank-dependent shape or Python value), it calls another
program, or none, and the others wait in their collectives forever (or, worse,
their collectives pair up with the wrong ones). Before each call of such a
program, each rank therefore publishes in JAX's coordination service (its
key-value store) which program it is about to run (a fingerprint of its
StableHLO, the graph, the function and the line calling it) and reads what the
others publish for the same call number:

- a different fingerprint raises :class:`RankDivergenceError` on every rank,
  naming the first FX op that differs (with its line on each rank) and the
  collectives each side would run;
- a rank that does not publish within ``rank_timeout`` seconds raises
  :class:`RankTimeoutError`, saying which call the missing rank reached last.

Both happen before any rank enters the program, so nothing hangs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import sys
import threading
from typing import Any

from tpu_debug.core.collectives import parse_collectives
from tpu_debug.core.sources import library_roots
from tpu_debug.runtime.distributed import launch
from tpu_debug.core.records import CompileInfo
from tpu_debug.runtime.distributed.config import config
from tpu_debug.runtime.distributed.errors import RankDivergenceError, RankTimeoutError

__all__ = ["ProgramCard", "agree", "reset"]

_PREFIX = "tpu_debug/rankcheck"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramCard:
    """What a rank says about a multi-process program it is about to run.

    ``fingerprint`` hashes the program's StableHLO (the same on every rank that traced
    the same code), ``graph`` is the runtime's graph id, ``function`` the function dynamo
    compiled with its line, ``ops`` each FX op with its user line, ``collectives`` what
    XLA inserted, as text.
    """

    fingerprint: str
    graph: str
    function: str
    ops: tuple[tuple[str, str], ...]
    collectives: tuple[str, ...]
    # the compiled function's code (file, first line, name): its own frame is not the caller
    code: tuple[str, int, str] | None = None

    @classmethod
    def of(cls, info: CompileInfo) -> ProgramCard:
        """The card of a compiled program (its ``CompileInfo``)."""
        fingerprint = hashlib.sha256(info.stablehlo().encode()).hexdigest()[:16]
        graph = info.graph
        function = "?"
        code = None
        ops: tuple[tuple[str, str], ...] = ()
        lines: dict[str, tuple[str, int, str]] = {}
        if graph is None:  # an eager op: its name says all; the line is the call site's
            function = ""
        else:
            fn = graph.origin.function
            if fn is not None:
                function = f"{fn[2]} ({_short(fn[0])}:{fn[1]})"
                code = (str(fn[0]), int(fn[1]), str(fn[2]))
            for node in graph.nodes:
                where = _user_frame(node.stack_trace)
                if where is not None:
                    lines[node.name] = where
                ops += ((node.target, f"{_short(where[0])}:{where[1]}" if where else "-"),)
        collectives = tuple(
            f"{c.describe()} from {c.op or '?'} at {_short(c.file) + ':' + str(c.line) if c.file else '-'}"
            for c in parse_collectives(info.hlo(), node_lines=lines)
        )
        name = str(info.name) if graph is not None else f"eager op aten::{info.name}"
        return cls(fingerprint, name, function, ops, collectives, code)


def _short(path: str) -> str:
    """A path relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _is_user(file: str) -> bool:
    if file.startswith("<"):
        return False
    real = os.path.realpath(file)
    return not any(real.startswith(root) for root in library_roots())


def _user_frame(stack_trace: str | None) -> tuple[str, int, str] | None:
    """The innermost user frame of an FX node's stack trace."""
    found = None
    for m in _FRAME.finditer(stack_trace or ""):
        if _is_user(m.group(1)):
            found = (m.group(1), int(m.group(2)), m.group(3).strip())
    return found


def _call_site(code: tuple[str, int, str] | None) -> str:
    """The user line calling into the runtime now (past the frame of the compiled function
    ``code`` itself, which dynamo shows at its first line)."""
    frame = sys._getframe(2)
    while frame is not None:
        c = frame.f_code
        if _is_user(c.co_filename) and (c.co_filename, c.co_firstlineno, c.co_name) != code:
            return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "-"


_calls = itertools.count(1)
_published: set[str] = set()
_lock = threading.Lock()


def reset() -> None:
    """Start counting calls from 1 again (a new run in the same processes)."""
    global _calls
    with _lock:
        _calls = itertools.count(1)
        _published.clear()


def agree(card: ProgramCard) -> None:
    """Check, before running the program of ``card``, that every rank is about to run it too.

    Raises:
        RankDivergenceError: another rank is about to run a different program.
        RankTimeoutError: another rank did not get here within ``config.rank_timeout``.
    """
    client = launch.kv_client()
    if client is None or not config.rank_check:
        return
    import jax

    me, world = jax.process_index(), jax.process_count()
    with _lock:
        call = next(_calls)
        if card.fingerprint not in _published:
            client.key_value_set(f"{_PREFIX}/card/{me}/{card.fingerprint}", json.dumps(dataclasses.asdict(card)),
                                 allow_overwrite=True)
            _published.add(card.fingerprint)
    here = {"call": call, "fingerprint": card.fingerprint, "graph": card.graph, "function": card.function,
            "site": _call_site(card.code)}
    text = json.dumps(here)
    client.key_value_set(f"{_PREFIX}/call/{call}/{me}", text)
    client.key_value_set(f"{_PREFIX}/last/{me}", text, allow_overwrite=True)
    timeout_ms = int(config.rank_timeout * 1000)
    for other in range(world):
        if other == me:
            continue
        try:
            theirs = json.loads(client.blocking_key_value_get(f"{_PREFIX}/call/{call}/{other}", timeout_ms))
        except Exception as exc:
            if "DEADLINE_EXCEEDED" not in str(exc):
                raise
            raise _timeout(client, me, other, here, card) from None
        if theirs["fingerprint"] != card.fingerprint:
            raise _divergence(client, me, other, here, card, theirs)
    if call > 2:  # every rank has read call - 2 by now (each read it before publishing call - 1)
        try:
            client.key_value_delete(f"{_PREFIX}/call/{call - 2}/{me}")
        except Exception:  # noqa: BLE001 - a key left behind costs a few bytes in the coordinator
            pass


def _side(info: dict) -> str:
    of = f" of {info['function']}" if info["function"] else ""
    return f"{info['graph']}{of}, called at {info['site']}"


def _timeout(client: Any, me: int, other: int, here: dict, card: ProgramCard) -> RankTimeoutError:
    try:
        last = json.loads(client.key_value_try_get(f"{_PREFIX}/last/{other}"))
        there = f"its last multi-process program call was #{last['call']}: {_side(last)}"
    except Exception:  # noqa: BLE001 - NOT_FOUND: the rank never called one
        there = "it has not called any multi-process program yet"
    collectives = "; ".join(card.collectives[:3]) or "none"
    message = (
        f"rank {other} did not reach multi-process program call #{here['call']} within "
        f"{config.rank_timeout:g} s. Rank {me} (this process) is about to run {_side(here)} "
        f"(collectives: {collectives}); rank {other}: {there}. Every rank must run the same programs "
        f"in the same order: rank {other} took another path (a branch on the rank, an exception, "
        f"a rank-dependent loop count), is stuck, or died. If it is only slow, raise TPU_DEBUG_RANK_TIMEOUT."
    )
    return RankTimeoutError(message, call=here["call"], missing=(other,))


def _divergence(client: Any, me: int, other: int, here: dict, card: ProgramCard, theirs: dict) -> RankDivergenceError:
    try:
        raw = client.blocking_key_value_get(f"{_PREFIX}/card/{other}/{theirs['fingerprint']}", 5000)
        other_card = ProgramCard(**{
            k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
            for k, v in json.loads(raw).items()
        })
    except Exception:  # noqa: BLE001 - the difference is still told, with less detail
        other_card = None
    lines = [
        f"ranks {me} and {other} are about to run different programs together at multi-process call "
        f"#{here['call']}: their collectives would hang or pair up wrongly.",
        f"  rank {me} (this process): {_side(here)}",
        f"  rank {other}: {_side(theirs)}",
    ]
    if other_card is not None:
        lines += _differences(me, card, other, other_card)
    lines.append(
        "Fix: make every rank trace the same code: a branch on the rank (or on rank-dependent data, "
        "shapes or Python values) inside a compiled function gives each rank its own graph."
        if card.function and theirs["function"] else
        "Fix: make every rank run the same ops on tensors that span processes, in the same order: "
        "an eager op on such a tensor is a program every rank runs together."
    )
    return RankDivergenceError("\n".join(lines), call=here["call"], ranks=(me, other))


def _differences(me: int, mine: ProgramCard, other: int, theirs: ProgramCard) -> list[str]:
    out = []
    for i, (a, b) in enumerate(itertools.zip_longest(mine.ops, theirs.ops)):
        if a != b and (a is None or b is None or a[0] != b[0]):
            side = (lambda r, op: f"rank {r} runs {op[0]} at {op[1]}" if op else f"rank {r} has no op there")
            out.append(f"  first differing op (#{i + 1} of the graph): {side(me, a)}; {side(other, b)}")
            break
    if mine.collectives != theirs.collectives:
        for i, (a, b) in enumerate(itertools.zip_longest(mine.collectives, theirs.collectives)):
            if a != b:
                out.append(
                    f"  collective #{i + 1}: rank {me}: {a or 'none'}; rank {other}: {b or 'none'} "
                    f"(rank {me} has {len(mine.collectives)} collectives, rank {other} {len(theirs.collectives)})"
                )
                break
    else:
        out.append(f"  both would run the same {len(mine.collectives)} collective(s); the programs differ in their computation")
    return out
