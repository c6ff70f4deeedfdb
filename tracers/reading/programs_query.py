"""``session.programs``: the distinct programs a run compiled (HLO stored once each), their
texts, and what of a compiled graph's HLO came from which FX node."""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_debug.core.errors import NotRecordedError
from tpu_debug.tracers.hlo import ProgramNode, instruction_lines
from tpu_debug.tracers.reading.reader import Part, op_name_of

__all__ = ["ProgramSummary", "ProgramText", "ProgramsQuery"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramSummary:
    """One distinct program (HLO stored once): what it is, how often it ran, its compiles."""

    id: int
    hash: str
    mode: str
    name: str
    signature: str
    instructions: int
    count: int
    seconds: float
    compiles: int
    compile_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramText:
    """A program's texts: StableHLO as lowered, HLO as XLA optimized it."""

    id: int
    hash: str
    mode: str
    name: str
    stablehlo: str
    hlo: str


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


class ProgramsQuery(Part):
    """``session.programs(...)``: the distinct programs; ``session.programs.hlo(...)`` an op's,
    a node's or a program's HLO, ``session.programs.text(id)`` a program's texts."""

    __slots__ = ()

    def __call__(
        self, *, mode: str | None = None, name: str | None = None, limit: int | None = None
    ) -> list[ProgramSummary]:
        """Distinct programs with their executions and compiles; most total execution time first."""
        run = self._run
        where, params = run._filters(mode=mode, name=op_name_of(name) if name else None, prefix="p.")
        rows = run._rows(
            "SELECT p.id, p.hash, p.mode, p.name, p.instructions, "
            "coalesce(s.n, 0), coalesce(s.t, 0.0), coalesce(c.n, 0), coalesce(c.t, 0.0), c.sig "
            "FROM programs p "
            "LEFT JOIN (SELECT program_id, sum(count) AS n, sum(seconds) AS t "
            "  FROM op_stats GROUP BY program_id) s "
            "  ON s.program_id = p.id "
            "LEFT JOIN (SELECT e.program_id, count(*) AS n, sum(e.seconds) AS t, min(cc.signature) AS sig "
            "  FROM events e JOIN compiles cc ON cc.event_id = e.id WHERE e.kind = 'compile' "
            "  GROUP BY e.program_id) c ON c.program_id = p.id "
            f"{where} ORDER BY 7 DESC, 9 DESC, p.id",
            params,
        )
        out = [
            ProgramSummary(pid, h, m, n, sig or n, ins, cnt, secs, comp, csecs)
            for pid, h, m, n, ins, cnt, secs, comp, csecs, sig in rows
        ]
        return out[:limit] if limit is not None else out

    def text(self, program: int | str) -> ProgramText:
        """A program's texts, by id or content hash.

        Raises:
            NotRecordedError: no such program in this run.
        """
        run = self._run
        col = "id" if isinstance(program, int) else "hash"
        rows = run._rows(
            f"SELECT id, hash, mode, name, stablehlo, hlo FROM programs WHERE {col} = ?", (program,)
        )
        if not rows:
            raise NotRecordedError(f"{run.db_path}: no program {program!r} in this run")
        return ProgramText(*rows[0])

    def fx_nodes(self, program: int | str) -> list[ProgramNode]:
        """The FX nodes of a compiled program, with their source lines."""
        run = self._run
        pid = self.text(program).id
        rows = run._rows(
            "SELECT n.node, n.target, l.file, l.line, l.function FROM fx_nodes n "
            "LEFT JOIN locations l ON l.id = n.location_id WHERE n.program_id = ? ORDER BY n.position",
            (pid,),
        )
        return [ProgramNode(node, target, run._location(f, ln, fn)) for node, target, f, ln, fn in rows]

    def node_instructions(self, program: int | str, node: str) -> list[str]:
        """Names of the optimized-HLO instructions that came from FX node ``node``."""
        pid = self.text(program).id
        rows = self._run._rows(
            "SELECT instruction FROM node_instructions WHERE program_id = ? AND node = ?", (pid, node)
        )
        return [r[0] for r in rows]

    def of_node(self, node: str, *, graph: str | None = None) -> int | None:
        """The id of the latest compiled program holding FX node ``node`` (None when none does)."""
        where = "WHERE n.node = ?" + (" AND p.name = ?" if graph is not None else "")
        rows = self._run._rows(
            f"SELECT p.id FROM fx_nodes n JOIN programs p ON p.id = n.program_id {where} "
            "ORDER BY p.id DESC LIMIT 1",
            (node,) + ((graph,) if graph is not None else ()),
        )
        return rows[0][0] if rows else None

    def hlo(self, target: Any, *, stage: str = "hlo", graph: str | None = None) -> str:
        """The HLO of an op, an FX node, a compiled graph or a program.

        Args:
            target: an aten op (``torch.ops.aten.mul.Tensor``, ``"aten::mul.Tensor"``,
                ``"mul.Tensor"``; an overload packet or ``"mul"`` matches every
                overload), an FX node name, a compiled graph id, or a program
                id/content hash. An op with several programs (one per input
                signature) gives its most-executed one; pass a program id from
                ``session.programs(name=...)`` for another.
            stage: ``"hlo"`` (optimized by XLA) or ``"stablehlo"`` (as lowered).
                For an FX node, only ``"hlo"``: the node's instructions.
            graph: restrict an FX node lookup to this compiled graph.

        Returns:
            The text.

        Raises:
            NotRecordedError: nothing in the run matches ``target`` (or HLO recording was off).
            ValueError: ``stage`` is not ``"hlo"`` or ``"stablehlo"``.

        Example::

            print(session.programs.hlo("aten::mul.Tensor"))
        """
        if stage not in ("hlo", "stablehlo"):
            raise ValueError(f"stage={stage!r}; use 'hlo' (optimized) or 'stablehlo'")
        if isinstance(target, int) or (isinstance(target, str) and len(target) == 64 and _is_hex(target)):
            text = self.text(target)
            return text.hlo if stage == "hlo" else text.stablehlo
        name = op_name_of(target)
        programs = self()
        candidates = [p for p in programs if p.name == name] or [
            p for p in programs if p.mode == "eager" and p.name.split(".")[0] == name
        ]
        if graph is None and candidates:
            text = self.text(candidates[0].id)
            return text.hlo if stage == "hlo" else text.stablehlo
        pid = self.of_node(name, graph=graph)
        if pid is not None:
            return instruction_lines(self.text(pid).hlo, self.node_instructions(pid, name))
        known = sorted({p.name for p in programs})
        hint = (
            f" Programs recorded: {', '.join(known[:8])}{', ...' if len(known) > 8 else ''}."
            if known
            else (" This run recorded no HLO (it was traced with hlo=False, or ran no ops).")
        )
        raise NotRecordedError(
            f"{self._run.db_path}: no HLO recorded for {name!r}: it names no op, FX node, graph or program of "
            f"this run.{hint}"
        )
