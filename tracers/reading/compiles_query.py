"""``session.compiles``: every compile of the run, grouped per op or graph, and one op's or
graph's compiles a page at a time (for a recompile storm)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_debug.tracers.events import CompileEvent
from tpu_debug.tracers.reading.reader import Part, RunReader, op_name_of
from tpu_debug.tracers.store import layout

__all__ = ["CompileGroup", "CompilesQuery", "compile_events"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompileGroup:
    """The compiles of one op or graph in one mode (the TUI's recompiles view).

    ``identity`` is what was compiled again (the op, or the function dynamo
    compiled and its direction); ``names`` counts the distinct program names
    under it (a graph recompiled by dynamo gets a new name each time).
    ``compiles``, ``recompiles`` and ``seconds`` count what XLA compiled;
    ``read_backs`` the executables read back from the persistent compile cache
    instead (none of them a compile or a recompile).
    """

    identity: str
    mode: str
    compiles: int
    recompiles: int
    seconds: float
    names: int
    read_backs: int = 0


def compile_events(run: RunReader, *, mode: str | None = None, name: str | None = None) -> list[CompileEvent]:
    """Compile events, oldest first (``name``: an op like ``"mul.Tensor"`` or a graph id)."""
    out = run.events("compile", name=op_name_of(name) if name else None)
    return [e for e in out if mode is None or e.mode == mode]  # type: ignore[misc]


class CompilesQuery(Part):
    """``session.compiles(...)``: compile events; ``session.compiles.groups()`` per op or
    graph, ``.history(identity)`` one of them a page at a time, ``.by_id(id)`` one compile."""

    __slots__ = ()

    def __call__(self, *, mode: str | None = None, name: str | None = None) -> list[CompileEvent]:
        """Compile events, oldest first (``name``: an op like ``"mul.Tensor"`` or a graph id).

        Example::

            slowest = max(session.compiles(mode="eager"), key=lambda c: c.seconds)
        """
        return compile_events(self._run, mode=mode, name=name)

    def groups(self) -> list[CompileGroup]:
        """Compiles per op or graph (per identity, see :class:`CompileGroup`): most compiled
        first, then the most compile time."""
        rows = self._run._rows(
            "SELECT e.mode, coalesce(c.identity, e.name), total(NOT c.from_cache), "
            "total(CASE WHEN c.from_cache THEN 0 ELSE e.seconds END), "
            "total(NOT c.from_cache AND EXISTS (SELECT 1 FROM key_diffs k WHERE k.event_id = e.id)), "
            "count(DISTINCT e.name), total(c.from_cache) "
            "FROM events e JOIN compiles c ON c.event_id = e.id WHERE e.kind = 'compile' "
            "GROUP BY 1, 2 ORDER BY 3 DESC, 4 DESC, 7 DESC, 2"
        )
        return [CompileGroup(i, m or "", int(n), int(r), s, k, int(b)) for m, i, n, s, r, k, b in rows]

    def history(
        self, identity: str, *, mode: str | None = None, limit: int | None = None, offset: int = 0
    ) -> list[CompileEvent]:
        """The compiles of one op or graph (an identity of :meth:`groups`; for runs recorded
        before identities, the op or graph name), oldest first, with their key diffs; paged by
        ``limit``/``offset`` so a recompile storm is read a page at a time."""
        run = self._run
        lay = layout(CompileEvent)
        # the IN list narrows through the compiles table and the (kind, name) index first
        sql = run._select(lay) + (
            " AND e.id IN (SELECT event_id FROM compiles WHERE identity = ? "
            "UNION ALL SELECT id FROM events WHERE kind = 'compile' AND name = ?) "
            "AND coalesce(d.identity, e.name) = ?"
        )
        params: list[Any] = [identity, identity, identity]
        if mode is not None:
            sql += " AND e.mode = ?"
            params.append(mode)
        sql += " ORDER BY e.id"
        if limit is not None:
            sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
        return run._decode(lay, run._rows(sql, tuple(params)))  # type: ignore[return-value]

    def by_id(self, event_id: int) -> CompileEvent | None:
        """One compile event (with its key diffs), or None when ``event_id`` is no compile."""
        run = self._run
        lay = layout(CompileEvent)
        out = run._decode(lay, run._rows(run._select(lay) + " AND e.id = ?", (event_id,)))
        return out[0] if out else None  # type: ignore[return-value]
