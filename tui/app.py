"""The TUI application: one Textual app over one run, a mode (screen stack) per view.

Screens read the run through the :class:`~tpu_debug.session.Session` API from
worker threads and post what they loaded back as messages, so the interface
never waits on the database. ``App.read`` lends each worker a session of its
own (a small pool of read-only connections): a slow pass over every transfer
does not hold up the compile history the user just asked for. A run still being recorded is followed: every ``poll_interval``
seconds the app asks the store whether anything new arrived and, if so, the
current screen reloads (others reload when shown again).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.timer import Timer
from tpu_debug.tracers.reading import RunMetadata
from tpu_debug.tui.screens import (
    CollectivesScreen,
    DivergenceScreen,
    HelpScreen,
    MemoryScreen,
    OpsScreen,
    OverviewScreen,
    RanksScreen,
    RecompilesScreen,
    RunScreen,
    StepsScreen,
    TransfersScreen,
)
from tpu_debug.tui.screens.fit import FitScreen

from tpu_debug.core.errors import TpuDebugError
from tpu_debug.session import Session

__all__ = ["VIEW_TABLE", "View", "TpuDebugApp", "run_app"]

T = TypeVar("T")

@dataclasses.dataclass(frozen=True)
class View:
    """One view of the app: its Textual mode, its title and its screen (its number key is
    its place in :data:`VIEW_TABLE`; the help screen, ``?``, lists every key)."""

    mode: str
    title: str
    screen: type


# The one table of views: the number keys (1, 2, ...) follow its order; MODES, BINDINGS and
# VIEWS come from it, so a new view is its screen plus one row here. The footer shows the
# number keys as one range ("1-9 Views") so that it fits a 100-column terminal; `?` names each.
VIEW_TABLE: tuple[View, ...] = (
    View("overview", "Overview", OverviewScreen),
    View("recompiles", "Recompiles", RecompilesScreen),
    View("ops", "Ops", OpsScreen),
    View("transfers", "Transfers", TransfersScreen),
    View("divergence", "Divergence", DivergenceScreen),
    View("steps", "Steps", StepsScreen),
    View("memory", "Memory", MemoryScreen),
    View("collectives", "Collectives", CollectivesScreen),
    View("fit", "Fit", FitScreen),
)

VIEWS = {view.mode: view.title for view in VIEW_TABLE}
if len(VIEW_TABLE) > 10:
    raise ValueError(f"VIEW_TABLE has {len(VIEW_TABLE)} views; the number keys 1-9 and 0 reach ten")
# the tenth view's key is 0, as on a keyboard's number row
_NUMBER_KEYS = f"1-{len(VIEW_TABLE)}" if len(VIEW_TABLE) < 10 else "0-9"


class TpuDebugApp(App[None]):
    """``tpu-debug tui``: overview, recompiles, ops, transfers, divergence, steps, memory, collectives, HLO.

    Example::

        app = TpuDebugApp(tpu_debug.open_run())
        app.run()
    """

    CSS_PATH = "app.tcss"
    TITLE = "tpu-debug"
    ENABLE_COMMAND_PALETTE = False
    MODES: ClassVar[dict[str, Any]] = {view.mode: view.screen for view in VIEW_TABLE}
    DEFAULT_MODE = "overview"
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(str(number % 10), f"switch_mode('{view.mode}')", view.title, show=False)
            for number, view in enumerate(VIEW_TABLE, 1)
        ),
        # the footer's one entry for all the number keys ("1-9 Views"); "views" is no key a
        # terminal sends, so the number keys above do the switching and the help names each
        Binding("views", f"switch_mode('{VIEW_TABLE[0].mode}')", "Views", key_display=_NUMBER_KEYS),
        Binding("r", "ranks", "Ranks (multi-process run)", show=False),
        Binding("question_mark", "help", "Keys", key_display="?"),
        Binding("ctrl+r", "reload", "Reload", show=False),
        Binding("q", "quit", "Quit"),
    ]

    @dataclasses.dataclass
    class RunGrew(Message):
        """A followed run recorded something new (or finished)."""

        watermark: tuple[int, int, int]
        metadata: RunMetadata

    def __init__(
        self,
        session: Session,
        *,
        poll_interval: float = 1.0,
        follow: bool | None = None,
        group: Any = None,
        rank: int | None = None,
    ) -> None:
        """Args:
        session: the run to show (from :func:`tpu_debug.open_run`).
        poll_interval: seconds between checks for new events while the run is recorded.
        follow: follow a running run (default: when its status is ``running``).
        group: the multi-process run (:class:`~tpu_debug.ranks.RankGroup`) ``session``
            is rank ``rank`` of: ``r`` then shows the ranks and switches between them.
        """
        super().__init__()
        self.group = group
        self.rank = rank
        self.session = session
        self._pool: queue.SimpleQueue[Session] = queue.SimpleQueue()
        self._pool.put(session)
        self._opened: list[Session] = []
        self._opened_lock = threading.Lock()
        self.metadata = session.metadata()
        self.cwd = self.metadata.cwd or None
        self.generation = 0
        self.poll_interval = poll_interval
        self.follow = self.metadata.status == "running" if follow is None else follow
        self._watermark: tuple[int, int, int] | None = None
        self._follow_timer: Timer | None = None
        self._set_title()
        self._set_status()

    def _set_title(self) -> None:
        name = self.metadata.name or self.session.run_dir.name
        if self.group is not None:
            name = f"{self.group.name} · rank {self.rank}"
        self.title = f"tpu-debug · {name}"

    def rank_label(self) -> str:
        """``rank 1 of 2`` when showing a rank of a multi-process run, else empty."""
        if self.group is None:
            return ""
        return f"rank {self.rank} of {self.group.info.nproc}"

    def action_ranks(self) -> None:
        """Show the ranks side by side; the one picked becomes the run shown."""
        if self.group is None:
            self.notify("this run is a single process: there are no other ranks", timeout=5)
            return
        if isinstance(self.screen, RanksScreen):
            self.pop_screen()
            return
        self.push_screen(RanksScreen(self.group, self.rank), self._switch_rank)

    def _switch_rank(self, rank: int | None) -> None:
        if rank is None or rank == self.rank:
            return
        run = self.group.rank_dirs().get(rank)
        if run is None:
            self.show_error(f"rank {rank} recorded no run")
            return
        session = Session(run / "run.db")
        with self._opened_lock:
            self._opened.append(session)
        self._pool = queue.SimpleQueue()
        self._pool.put(session)
        self.session, self.rank = session, rank
        self.metadata = session.metadata()
        self.cwd = self.metadata.cwd or None
        self._watermark = None
        self._set_title()
        self._set_status()
        self.action_reload()

    # -- reading the run ------------------------------------------------------------------

    def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn(session, *args)`` with a session no other thread is using (from a worker)."""
        pool = self._pool  # a switch to another rank replaces the pool: a session goes back where it came from
        try:
            session = pool.get_nowait()
        except queue.Empty:
            session = Session(self.session.db_path)  # another connection to the same run
            with self._opened_lock:
                self._opened.append(session)
        try:
            return fn(session, *args, **kwargs)
        finally:
            pool.put(session)

    def on_unmount(self) -> None:
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for session in opened:
            session.close()

    def show_error(self, message: str) -> None:
        """Say what went wrong reading the run (one line, never markup)."""
        self.notify(message, title="cannot read the run", severity="error", timeout=10, markup=False)

    # -- live follow ------------------------------------------------------------------------

    def _set_status(self) -> None:
        m = self.metadata
        status = m.status
        if m.exit_status not in (None, 0):
            status += f" (exit {m.exit_status})"
        live = " · following live" if self.follow else ""
        self.sub_title = f"{m.platform or '?'} · {status}{live}"

    def on_mount(self) -> None:
        if self.follow:
            self._follow_timer = self.set_interval(self.poll_interval, self._poll, name="follow")

    @work(thread=True, exclusive=True, group="follow")
    def _poll(self) -> None:
        try:
            mark = self.read(Session.watermark)
            meta = self.read(Session.metadata)
        except TpuDebugError:
            return  # a half-written page: look again at the next tick
        if mark != self._watermark or meta.status != self.metadata.status:
            self.post_message(self.RunGrew(mark, meta))

    def on_tpu_debug_app_run_grew(self, message: RunGrew) -> None:
        first = self._watermark is None
        self._watermark = message.watermark
        finished = message.metadata.status != "running"
        self.metadata = message.metadata
        if finished:
            self.follow = False
            if self._follow_timer is not None:
                self._follow_timer.stop()
                self._follow_timer = None
        self._set_status()
        if first and not finished:
            return  # the screens loaded this state already
        self.action_reload()

    def action_reload(self) -> None:
        """Reload the current view (others reload when shown next)."""
        self.generation += 1
        screen = self.screen
        if isinstance(screen, RunScreen):
            screen.reload()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        self.push_screen(HelpScreen(self.screen))


def run_app(session: Session, **options: Any) -> None:
    """Run the TUI on ``session`` in this terminal until the user quits."""
    TpuDebugApp(session, **options).run()
