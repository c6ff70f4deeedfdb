"""The HLO viewer (one program, searchable, one FX node's instructions highlighted) and the
side-by-side diff of two programs. Both are pushed over the view they were opened from."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker
from tpu_debug.tracers.hlo import ProgramNode
from tpu_debug.tracers.reading import ProgramSummary, ProgramText
from tpu_debug.tui.widgets import HloDiffView, HloView, diff_rows

from tpu_debug.core.errors import TpuDebugError
from tpu_debug.session import Session

__all__ = ["HloDiffScreen", "HloScreen"]

# keys that go in pairs share one footer entry, so that the footer fits 100 columns
_MATCH_KEYS = Binding.Group("Match", compact=True)
_PROGRAM_KEYS = Binding.Group("Program", compact=True)
_CHANGE_KEYS = Binding.Group("Change", compact=True)

_STAGES = {"hlo": "optimized HLO", "stablehlo": "StableHLO"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Program:
    text: ProgramText
    siblings: list[ProgramSummary]  # the other programs of the same op (one per input signature)
    nodes: list[ProgramNode]
    node: str | None
    instructions: list[str]
    tpu: tuple[str, str] | None = None  # (content hash of the TPU's optimized HLO, target name)


def _tpu_program(session: Session, program_hash: str) -> tuple[str, str] | None:
    """The TPU compile of this program, when the run compiled its programs for a target: the
    ``target_compile`` events (tracers/reading/target_findings.py), read by field name so a run recorded
    without them (or a build that does not declare the kind) shows nothing."""
    try:
        events = session.events("target_compile")
    except ValueError:  # the kind is not declared in this build
        return None
    for e in reversed(events):
        tpu = getattr(e, "tpu_program", None)
        if tpu and getattr(e, "program", None) == program_hash:
            return tpu, str(getattr(e, "target", "") or "TPU")
    return None


def _load_program(
    session: Session, program: int | str, name: str | None, mode: str | None, node: str | None
) -> _Program:
    text = session.programs.text(program)
    siblings = session.programs(name=name, mode=mode) if name else []
    nodes = session.programs.fx_nodes(text.id) if text.mode == "compiled" else []
    instructions = session.programs.node_instructions(text.id, node) if node else []
    return _Program(text, siblings, nodes, node, instructions, _tpu_program(session, text.hash))


class _PushedScreen(Screen):
    """Shared by the pushed screens: read from a worker, report a run error, go back."""

    def read(self, fn, *args, **kwargs):
        try:
            return self.app.read(fn, *args, **kwargs)  # type: ignore[attr-defined]
        except TpuDebugError as exc:
            self.app.call_from_thread(self.app.show_error, str(exc))  # type: ignore[attr-defined]
            return None

    def action_back(self) -> None:
        self.app.pop_screen()


class HloScreen(_PushedScreen):
    """One program's optimized HLO (or StableHLO): coloured, searchable; for a compiled
    graph, its FX nodes beside it, the chosen node's instructions highlighted."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("slash", "search", "Search", key_display="/"),
        Binding("n", "next_match", "Next match", group=_MATCH_KEYS),
        Binding("N", "previous_match", "Prev match", key_display="N", group=_MATCH_KEYS),
        Binding("s", "stage", "StableHLO"),
        Binding("t", "tpu", "TPU"),
        Binding("left_square_bracket", "program(-1)", "Prev program", key_display="[", group=_PROGRAM_KEYS),
        Binding("right_square_bracket", "program(1)", "Next program", key_display="]", group=_PROGRAM_KEYS),
        Binding("full_stop", "next_marked(1)", "Next node line", key_display=".", show=False),
        Binding("comma", "next_marked(-1)", "Prev node line", key_display=",", show=False),
    ]

    @dataclasses.dataclass
    class Loaded(Message):
        program: _Program

    @dataclasses.dataclass
    class NodeLoaded(Message):
        node: str
        instructions: list[str]

    def __init__(
        self,
        program: int | str,
        *,
        name: str | None = None,
        mode: str | None = None,
        node: str | None = None,
        stage: str = "hlo",
    ) -> None:
        """Args:
        program: program id or content hash.
        name, mode: the op or graph it belongs to (``[``/``]`` then step through its programs).
        node: an FX node whose instructions to highlight.
        stage: ``"hlo"`` or ``"stablehlo"``.
        """
        super().__init__()
        self.program_ref = program
        self.op_name = name
        self.op_mode = mode
        self.node = node
        self.stage = stage
        self.loaded: _Program | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text("loading…", style="dim"), id="hlo-info", markup=False)
        with Horizontal(id="hlo-body"):
            yield OptionList(id="nodes", markup=False)
            yield HloView(id="hlo")
        yield Input(placeholder="search (Enter: done, n/N: next/previous)", id="hlo-search")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#nodes", OptionList).display = False
        self.query_one("#hlo-search", Input).display = False
        self.query_one("#hlo", HloView).focus()
        self._load(self.program_ref)

    @work(thread=True, exclusive=True, group="hlo")
    def _load(self, program: int | str) -> None:
        loaded = self.read(_load_program, program, self.op_name, self.op_mode, self.node)
        if loaded is not None and not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(loaded))

    @work(thread=True, exclusive=True, group="node")
    def _load_node(self, program: int, node: str) -> None:
        instructions = self.read(lambda s: s.programs.node_instructions(program, node))
        if instructions is not None and not get_current_worker().is_cancelled:
            self.post_message(self.NodeLoaded(node, instructions))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        p = message.program
        self.loaded = p
        self.node = p.node
        nodes = self.query_one("#nodes", OptionList)
        nodes.clear_options()
        if p.nodes:
            nodes.add_option(Option(Text("(no node)", style="dim"), id=""))
            for n in p.nodes:
                prompt = Text(n.name, style="bold")
                prompt.append(f" {n.target}", style="dim")
                nodes.add_option(Option(prompt, id=n.name))
            if p.node in {n.name for n in p.nodes}:
                nodes.highlighted = 1 + [n.name for n in p.nodes].index(p.node)
        nodes.display = bool(p.nodes)
        self._render_text(p.instructions)

    def _render_text(self, instructions: list[str]) -> None:
        p = self.loaded
        if p is None:
            return
        view = self.query_one("#hlo", HloView)
        text = p.text.hlo if self.stage == "hlo" else p.text.stablehlo
        if not text:
            text = f"(no {_STAGES[self.stage]} recorded for this program)"
        view.set_text(text, mark=instructions if self.stage == "hlo" else ())
        search = self.query_one("#hlo-search", Input)
        if search.value:
            view.search(search.value)
        self._update_info(len(view.marked_lines))

    def _update_info(self, marked: int) -> None:
        p = self.loaded
        if p is None:
            return
        t = p.text
        info = Text()
        info.append(t.name, style="bold")
        info.append(f"  {t.mode}  program {t.id}  {t.hash[:12]}  ", style="dim")
        info.append(_STAGES[self.stage], style="bold cyan")
        if p.tpu is not None:
            info.append(f"  TPU HLO for {p.tpu[1]} beside it (t)", style="bold green")
        if len(p.siblings) > 1:
            index = next((i for i, s in enumerate(p.siblings) if s.id == t.id), 0)
            info.append(f"  program {index + 1} of {len(p.siblings)} for this op ([ ])", style="dim")
        if self.node:
            info.append("  node ")
            info.append(self.node, style="bold yellow")
            if self.stage == "hlo":
                info.append(f": {marked} instruction line(s) highlighted (. ,)")
            else:
                info.append(": node highlighting applies to optimized HLO (s)", style="dim")
        self.query_one("#hlo-info", Static).update(info)

    @on(OptionList.OptionHighlighted, "#nodes")
    def _node_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        p = self.loaded
        node = event.option.id or None
        if p is None or node == self.node:
            return
        self.node = node
        if node is None:
            self.query_one("#hlo", HloView).mark_instructions(())
            self._update_info(0)
        else:
            self._load_node(p.text.id, node)

    @on(NodeLoaded)
    def _show_node(self, message: NodeLoaded) -> None:
        if message.node != self.node:
            return
        view = self.query_one("#hlo", HloView)
        count = view.mark_instructions(message.instructions if self.stage == "hlo" else ())
        view.next_marked()
        self._update_info(count)

    # -- search -----------------------------------------------------------------------------

    def action_search(self) -> None:
        search = self.query_one("#hlo-search", Input)
        search.display = True
        search.focus()

    @on(Input.Changed, "#hlo-search")
    def _search_changed(self, event: Input.Changed) -> None:
        self.query_one("#hlo", HloView).search(event.value)

    @on(Input.Submitted, "#hlo-search")
    def _search_done(self, event: Input.Submitted) -> None:
        view = self.query_one("#hlo", HloView)
        n = len(view.matches)
        if event.value:
            self.app.notify(f"{n} line(s) match {event.value!r}", markup=False)
        event.input.display = bool(event.value)
        view.focus()

    def action_next_match(self) -> None:
        self.query_one("#hlo", HloView).next_match(True)

    def action_previous_match(self) -> None:
        self.query_one("#hlo", HloView).next_match(False)

    def action_next_marked(self, direction: int) -> None:
        self.query_one("#hlo", HloView).next_marked(direction > 0)

    def action_back(self) -> None:
        search = self.query_one("#hlo-search", Input)
        if search.has_focus:
            search.value = ""
            search.display = False
            self.query_one("#hlo", HloView).focus()
            return
        super().action_back()

    # -- stage and program ------------------------------------------------------------------

    def action_stage(self) -> None:
        self.stage = "stablehlo" if self.stage == "hlo" else "hlo"
        self._render_text(self.loaded.instructions if self.loaded is not None else [])

    def action_tpu(self) -> None:
        """This machine's optimized HLO beside the TPU compiler's, for a run with a target."""
        p = self.loaded
        if p is None or p.tpu is None:
            self.app.notify("no TPU compile of this program was recorded (trace with a target)", markup=False)
            return
        local = (p.text.hash, f"this machine ({p.text.name})")
        self.app.push_screen(HloDiffScreen(local, (p.tpu[0], f"TPU compiler, {p.tpu[1]}")))

    def action_program(self, step: int) -> None:
        p = self.loaded
        if p is None or len(p.siblings) < 2:
            self.app.notify("this op has one program", markup=False)
            return
        index = next((i for i, s in enumerate(p.siblings) if s.id == p.text.id), 0)
        self._load(p.siblings[(index + step) % len(p.siblings)].id)


@dataclasses.dataclass(frozen=True, slots=True)
class _Diff:
    left: list[str]
    right: list[str]
    rows: list
    changed: int


def _load_diff(session: Session, left: int | str, right: int | str, stage: str) -> _Diff:
    a, b = session.programs.text(left), session.programs.text(right)
    la = (a.hlo if stage == "hlo" else a.stablehlo).splitlines()
    lb = (b.hlo if stage == "hlo" else b.stablehlo).splitlines()
    rows = diff_rows(la, lb)
    return _Diff(la, lb, rows, sum(1 for r in rows if r.tag != "equal"))


class HloDiffScreen(_PushedScreen):
    """Two programs' HLO side by side (older left); ``n``/``N`` jump between changes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("n", "next_change(1)", "Next change", group=_CHANGE_KEYS),
        Binding("N", "next_change(-1)", "Prev change", key_display="N", group=_CHANGE_KEYS),
        Binding("s", "stage", "StableHLO"),
    ]

    @dataclasses.dataclass
    class Loaded(Message):
        diff: _Diff
        stage: str

    def __init__(
        self, left: tuple[int | str, str], right: tuple[int | str, str], *, stage: str = "hlo"
    ) -> None:
        """Args:
        left, right: (program id or hash, label) of the two versions.
        stage: ``"hlo"`` or ``"stablehlo"``.
        """
        super().__init__()
        self.left, self.right = left, right
        self.stage = stage
        self.diff: _Diff | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="diff-labels"):
            yield Static(Text(self.left[1], style="bold red"), id="diff-left", markup=False)
            yield Static(Text(self.right[1], style="bold green"), id="diff-right", markup=False)
        yield Static(Text("comparing…", style="dim"), id="diff-info", markup=False)
        yield HloDiffView(id="diff")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#diff", HloDiffView).focus()
        self._load(self.stage)

    @work(thread=True, exclusive=True, group="diff")
    def _load(self, stage: str) -> None:
        diff = self.read(_load_diff, self.left[0], self.right[0], stage)
        if diff is not None and not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(diff, stage))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        d = message.diff
        self.diff = d
        view = self.query_one("#diff", HloDiffView)
        view.set_diff(d.left, d.right, d.rows)
        info = Text()
        info.append(_STAGES[message.stage], style="bold cyan")
        if d.changed:
            info.append(f"  {d.changed} line(s) differ in {len(view.hunks)} place(s) (n/N)")
        else:
            info.append("  the two programs are identical", style="dim")
        self.query_one("#diff-info", Static).update(info)

    def action_next_change(self, step: int) -> None:
        self.query_one("#diff", HloDiffView).next_hunk(step > 0)

    def action_stage(self) -> None:
        self.stage = "stablehlo" if self.stage == "hlo" else "hlo"
        self._load(self.stage)
