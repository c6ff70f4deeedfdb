"""``RunScreen``: what every view of a run shares (header, footer, loading, reloading)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header
from tpu_debug.core.errors import TpuDebugError

from tpu_debug.session import Session

__all__ = ["RunApp", "RunScreen"]

T = TypeVar("T")


class RunApp(Protocol):
    """What a view asks of the app showing it (``tui/app.py``'s ``TpuDebugApp``): the app
    imports the views, so the views know it by this."""

    cwd: str | None
    generation: int
    session: Session

    def rank_label(self) -> str: ...

    def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def show_error(self, message: str) -> None: ...


class RunScreen(Screen):
    """A view of the run. Subclasses compose ``compose_body`` and start their workers in
    ``load``; the screen calls ``load`` when mounted and again after the run grew."""

    def __init__(self) -> None:
        super().__init__()
        self._generation: int | None = None

    @property
    def run_app(self) -> RunApp:
        return self.app  # type: ignore[return-value]

    @property
    def cwd(self) -> str | None:
        return self.run_app.cwd

    def compose(self) -> ComposeResult:
        yield Header()
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.reload()

    def on_screen_resume(self) -> None:
        if self._generation is not None and self._generation != self.run_app.generation:
            self.reload()

    def reload(self) -> None:
        self._generation = self.run_app.generation
        self.load()

    def load(self) -> None:
        """Start the workers that (re)load this view's data."""

    def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """From a worker: ``fn(session, *args)``; a run that cannot be read is reported
        (one line) and gives None."""
        try:
            return self.run_app.read(fn, *args, **kwargs)
        except TpuDebugError as exc:
            self.app.call_from_thread(self.run_app.show_error, str(exc))
            return None
