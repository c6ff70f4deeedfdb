"""``session.ops``: what each op (or compiled graph) cost, the one ops table the report and
the TUI both show, the ops that fell back to the CPU and those that ran with float64 values."""

from __future__ import annotations

import dataclasses

from tpu_debug.tracers.events import FallbackEvent
from tpu_debug.tracers.reading.reader import Part, op_name_of

__all__ = ["OpSummary", "OpsQuery"]


@dataclasses.dataclass(frozen=True, slots=True)
class OpSummary:
    """One op (or compiled graph) in one mode: calls, time, compiles.

    ``count`` and ``seconds`` count every call of the op, those the device ran and those
    run on the CPU for lack of a lowering (``fallbacks`` of them, taking ``fallback_seconds``;
    ``tpu_debug.runtime.config.cpu_fallback``): both are calls the program made.
    :meth:`executed` leaves the fallbacks out.
    """

    name: str
    mode: str
    count: int
    seconds: float
    compiles: int
    compile_seconds: float
    programs: int
    read_back: int = 0  # executables read back from the persistent compile cache (not compiles)
    saved_seconds: float = 0.0  # the compile time those read-backs saved
    fallbacks: int = 0  # calls of ``count`` run on the CPU (no lowering)
    fallback_seconds: float = 0.0  # their time, part of ``seconds``

    @property
    def mean_seconds(self) -> float:
        return self.seconds / self.count if self.count else 0.0

    def executed(self) -> OpSummary:
        """The same row without the CPU fallbacks: what the device executed (dispatch and
        device time), the figures a judgement of device work reads."""
        if not self.fallbacks:
            return self
        return dataclasses.replace(self, count=self.count - self.fallbacks,
                                   seconds=self.seconds - self.fallback_seconds, fallbacks=0, fallback_seconds=0.0)


class OpsQuery(Part):
    """``session.ops(...)``: per op and mode, calls, time and compiles; and the ops' other
    questions (``session.ops.fallbacks()``, ``session.ops.float64()``)."""

    __slots__ = ()

    def __call__(
        self, *, mode: str | None = None, name: str | None = None, limit: int | None = None
    ) -> list[OpSummary]:
        """Per op and mode: calls (on the device and by CPU fallback), total time, compiles;
        heaviest first.

        Args:
            mode: only this mode (``"eager"`` / ``"compiled"``).
            name: only this op (``"mul.Tensor"``; ``aten::``/``aten.`` prefixes are ignored).
            limit: at most this many rows.

        Example::

            [(o.name, o.count, o.fallbacks) for o in session.ops()][:2]
            # [('squash', 3, 3), ('mul.Tensor', 5, 0)]: squash has no lowering, each call ran on the CPU
        """
        run = self._run
        op = op_name_of(name) if name else None
        where, params = run._filters(mode=mode, name=op)
        stats = run._rows(
            f"SELECT mode, name, sum(count), sum(seconds), count(DISTINCT program_id) FROM op_stats {where} "
            "GROUP BY mode, name",
            params,
        )
        cwhere, cparams = run._filters(mode=mode, name=op, kind="compile", prefix="e.")
        compiles = {
            (m, n): (c, s, r, saved)
            for m, n, c, s, r, saved in run._rows(
                "SELECT e.mode, e.name, sum(NOT c.from_cache), sum(CASE WHEN c.from_cache THEN 0 ELSE e.seconds END), "
                f"sum(c.from_cache), sum(c.saved_seconds) FROM events e JOIN compiles c ON c.event_id = e.id {cwhere} "
                "GROUP BY e.mode, e.name",
                cparams,
            )
        }
        fwhere, fparams = run._filters(mode=mode, name=op, kind=FallbackEvent.kind)
        fallbacks = {
            (m, n): (int(c), s)
            for m, n, c, s in run._rows(
                f"SELECT mode, name, count(*), total(seconds) FROM events {fwhere} GROUP BY mode, name", fparams
            )
        }
        out = []
        for m, n, count, seconds, programs in stats:
            c, cs, r, saved = compiles.get((m, n), (0, 0.0, 0, 0.0))
            f, fs = fallbacks.get((m, n), (0, 0.0))
            out.append(OpSummary(n, m, count + f, seconds + fs, c, cs, programs, r, saved, f, fs))
        for key in compiles.keys() - {(m, n) for m, n, *_ in stats}:
            c, cs, r, saved = compiles[key]
            f, fs = fallbacks.get(key, (0, 0.0))
            out.append(OpSummary(key[1], key[0], f, fs, c, cs, 0, r, saved, f, fs))
        for key in fallbacks.keys() - {(o.mode, o.name) for o in out}:
            f, fs = fallbacks[key]
            out.append(OpSummary(key[1], key[0], f, fs, 0, 0.0, 0, 0, 0.0, f, fs))
        out.sort(key=lambda o: (-o.seconds, -o.count, o.name, o.mode))
        return out[:limit] if limit is not None else out

    def fallbacks(self) -> list[FallbackEvent]:
        """Each call of an op that ran on CPU for lack of a lowering, oldest first."""
        return self._run.events(FallbackEvent.kind)  # type: ignore[return-value]

    def float64(self) -> dict[str, tuple[int, int]]:
        """Ops and graphs compiled with float64 or complex128 values: per name,
        (programs compiled, executions). It runs here; a TPU has no float64, so on a TPU
        each of these would fail or need a float32 rewrite."""
        run = self._run
        wide = "(signature LIKE '%float64%' OR signature LIKE '%complex128%')"
        compiled = run._rows(
            "SELECT e.name, count(*) FROM events e JOIN compiles c ON c.event_id = e.id "
            f"WHERE e.kind = 'compile' AND {wide.replace('signature', 'c.signature')} GROUP BY e.name"
        )
        runs = dict(run._rows(f"SELECT name, sum(count) FROM op_stats WHERE {wide} GROUP BY name"))
        return {name: (n, int(runs.get(name) or 0)) for name, n in compiled}
