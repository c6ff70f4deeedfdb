"""``OpsScreen``: every op and compiled graph with calls, time, compiles and CPU fallbacks;
sortable (keys or a click on a column header), filterable (``/``); Enter opens its HLO."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Input, Static
from tpu_debug.tui.format import format_seconds
from tpu_debug.tui.screens.base import RunScreen
from tpu_debug.tui.screens.hlo import HloScreen
from tpu_debug.tui.widgets import Col, FitTable

from tpu_debug.session import Session

__all__ = ["OpRow", "OpsScreen"]


@dataclasses.dataclass(frozen=True, slots=True)
class OpRow:
    """One op (or graph) in one mode: a row of ``session.ops()`` (calls by CPU fallback
    included, ``fallbacks`` of them), with the TPU target's estimate when there is one."""

    name: str
    mode: str
    count: int
    seconds: float
    compiles: int
    compile_seconds: float
    fallbacks: int
    programs: int
    # the TPU target's roofline for one call (the slowest of its programs), when the run
    # compiled them for a target: model estimates, not measurements
    tpu_seconds: float | None = None
    bound: str | None = None

    @property
    def mean(self) -> float:
        return self.seconds / self.count if self.count else 0.0


# column key -> (title, sort key, largest first)
COLUMNS = {
    "name": ("op / graph", lambda r: (r.name, r.mode), False),
    "mode": ("mode", lambda r: (r.mode, r.name), False),
    "count": ("calls", lambda r: r.count, True),
    "time": ("total time", lambda r: r.seconds, True),
    "mean": ("mean", lambda r: r.mean, True),
    "compiles": ("compiles", lambda r: r.compiles, True),
    "compile_time": ("compile time", lambda r: r.compile_seconds, True),
    "fallbacks": ("fallbacks", lambda r: r.fallbacks, True),
    "programs": ("programs", lambda r: r.programs, True),
}
# shown when the run has target compiles (tracers/reading/target_findings.py's ``target_compile`` events)
ROOFLINE_COLUMNS = {
    "tpu_est": ("TPU est./call", lambda r: r.tpu_seconds if r.tpu_seconds is not None else -1.0, True),
    "bound": ("TPU bound", lambda r: (r.bound or "", r.name), False),
}
SORTS = {**COLUMNS, **ROOFLINE_COLUMNS}
# how a narrow table gives way (see FitTable): the name wraps, then these columns are left out
# in this order (1 first)
_FIT = {
    "name": (0, 20),
    "programs": (1, None),
    "mean": (2, None),
    "mode": (3, None),
    "bound": (4, None),
    "tpu_est": (5, None),
}


def _columns(roofline: bool) -> list[Col]:
    shown = {**COLUMNS, **ROOFLINE_COLUMNS} if roofline else COLUMNS
    return [Col(title, key, *_FIT.get(key, (0, None))) for key, (title, _, _) in shown.items()]


def _roofline(session: Session) -> dict[str, tuple[float, str | None]]:
    """op or graph name -> (estimated seconds of its slowest TPU program, what bounds it), read
    by field name from the ``target_compile`` events (none in a run without a target)."""
    try:
        events = session.events("target_compile")
    except ValueError:  # the kind is not declared in this build
        return {}
    out: dict[str, tuple[float, str | None]] = {}
    for e in events:
        name, est = getattr(e, "name", None), getattr(e, "estimated_seconds", None)
        if name and est is not None and est >= out.get(name, (-1.0, None))[0]:
            out[name] = (float(est), getattr(e, "bound", None))
    return out


def _rows(session: Session) -> list[OpRow]:
    # the report's ops table: one query, calls on the device and by CPU fallback alike
    rows = [
        OpRow(o.name, o.mode, o.count, o.seconds, o.compiles, o.compile_seconds, o.fallbacks, o.programs)
        for o in session.ops()
    ]
    roofline = _roofline(session)
    if roofline:
        rows = [dataclasses.replace(r, tpu_seconds=roofline[r.name][0], bound=roofline[r.name][1])
                if r.name in roofline else r for r in rows]
    return rows


# the sort keys share one footer entry, so that the footer fits 100 columns
_SORT_KEYS = Binding.Group("Sort", compact=True)


class OpsScreen(RunScreen):
    """The ops table: ``/`` filters, ``c t k f n`` sort (again: reverse), Enter shows HLO."""

    AUTO_FOCUS = "#ops"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("t", "sort('time')", "By time", group=_SORT_KEYS),
        Binding("c", "sort('count')", "By calls", group=_SORT_KEYS),
        Binding("k", "sort('compiles')", "By compiles", group=_SORT_KEYS),
        Binding("f", "sort('fallbacks')", "By fallbacks", group=_SORT_KEYS),
        Binding("n", "sort('name')", "By name", group=_SORT_KEYS),
        Binding("h", "open_hlo", "HLO", show=False),
    ]

    @dataclasses.dataclass
    class Loaded(Message):
        rows: list[OpRow]

    @dataclasses.dataclass
    class ProgramFound(Message):
        row: OpRow
        program: int | None

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[OpRow] = []
        self.sort_key = "time"
        self.reverse = False
        self.filter_text = ""

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="ops-bar"):
            yield Input(placeholder="filter ops by name (/)", id="ops-filter")
            yield Static(Text(""), id="ops-status", markup=False)
        yield FitTable(id="ops", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#ops", FitTable).set_columns(_columns(roofline=False))
        self.query_one("#ops-filter", Input).cursor_blink = False
        super().on_mount()

    def load(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="ops")
    def _load(self) -> None:
        rows = self.read(_rows)
        if rows is not None:
            self.post_message(self.Loaded(rows))

    @on(Loaded)
    def _loaded(self, message: Loaded) -> None:
        self.rows = message.rows
        self._fill()
        if self.focused is None:
            self.query_one("#ops", DataTable).focus()

    def visible_rows(self) -> list[OpRow]:
        text = self.filter_text.lower()
        rows = (
            [r for r in self.rows if text in r.name.lower() or text in r.mode.lower()] if text else self.rows
        )
        _, key, largest_first = SORTS[self.sort_key]
        return sorted(rows, key=key, reverse=largest_first != self.reverse)

    def _fill(self) -> None:
        table = self.query_one("#ops", FitTable)
        selected = None
        if table.row_count and table.cursor_row < table.row_count:
            selected = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        roofline = any(r.tpu_seconds is not None for r in self.rows)
        table.set_columns(_columns(roofline))
        rows = self.visible_rows()
        cells, keys = [], []
        for r in rows:
            hot = "bold yellow" if r.compiles > 1 else ""
            extra = ()
            if roofline:
                extra = (
                    Text(format_seconds(r.tpu_seconds) if r.tpu_seconds is not None else "-", justify="right"),
                    Text(r.bound or "-", style="" if r.bound else "dim"),
                )
            keys.append(f"{r.mode}\0{r.name}")
            cells.append([
                Text(r.name, style="bold" if r.fallbacks else ""),
                Text(r.mode, style="dim"),
                Text(f"{r.count:,}", justify="right"),
                Text(format_seconds(r.seconds), justify="right"),
                Text(format_seconds(r.mean), justify="right"),
                Text(str(r.compiles), justify="right", style=hot),
                Text(format_seconds(r.compile_seconds) if r.compiles else "-", justify="right"),
                Text(
                    str(r.fallbacks) if r.fallbacks else "-",
                    justify="right",
                    style="red" if r.fallbacks else "dim",
                ),
                Text(str(r.programs), justify="right"),
                *extra,
            ])
        table.fill(cells, keys)
        if selected is not None and selected in table.rows:
            table.move_cursor(row=table.get_row_index(selected))
        title, _, largest_first = SORTS[self.sort_key]
        order = "descending" if largest_first != self.reverse else "ascending"
        status = Text(f"{len(rows)} of {len(self.rows)} ops · sorted by {title}, {order}", style="dim")
        self.query_one("#ops-status", Static).update(status)

    # -- sort and filter --------------------------------------------------------------------

    def action_sort(self, key: str) -> None:
        if key == self.sort_key:
            self.reverse = not self.reverse
        else:
            self.sort_key, self.reverse = key, False
        self._fill()

    @on(DataTable.HeaderSelected, "#ops")
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        self.action_sort(str(event.column_key.value))

    def action_filter(self) -> None:
        self.query_one("#ops-filter", Input).focus()

    def action_clear_filter(self) -> None:
        search = self.query_one("#ops-filter", Input)
        search.value = ""
        self.query_one("#ops", DataTable).focus()

    @on(Input.Changed, "#ops-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._fill()

    @on(Input.Submitted, "#ops-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one("#ops", DataTable).focus()

    # -- HLO --------------------------------------------------------------------------------

    def selected(self) -> OpRow | None:
        table = self.query_one("#ops", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        return next((r for r in self.rows if f"{r.mode}\0{r.name}" == key), None)

    @on(DataTable.RowSelected, "#ops")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_hlo()

    def action_open_hlo(self) -> None:
        row = self.selected()
        if row is not None:
            self._find_program(row)

    @work(thread=True, exclusive=True, group="ops-hlo")
    def _find_program(self, row: OpRow) -> None:
        programs = self.read(lambda s: s.programs(name=row.name, mode=row.mode))
        if programs is None:
            return
        self.post_message(self.ProgramFound(row, programs[0].id if programs else None))

    @on(ProgramFound)
    def _open_program(self, message: ProgramFound) -> None:
        row = message.row
        if message.program is None:
            why = (
                "it ran on CPU (no lowering)"
                if row.fallbacks == row.count
                else "no HLO was recorded for it (hlo off, or it compiled before the trace began)"
            )
            self.app.notify(f"{row.name}: {why}", severity="warning", markup=False)
            return
        self.app.push_screen(HloScreen(message.program, name=row.name, mode=row.mode))
