"""Serve the terminal UI to a web browser (``tpu-debug tui --serve``) through textual-serve.

Each browser tab that opens the page starts its own ``tpu-debug tui RUN`` process (the
reading verb: it imports neither torch nor jax), whose screen textual-serve streams to
the page over a websocket.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shlex
import socket
import sys
from collections.abc import Sequence

from tpu_debug.core.errors import CommandError

# a UI told to quit is given this long to end before it is killed
_UI_QUIT_SECONDS = 10.0
# each UI ends with the server that started it (whose pid follows), however the server ends
_LAUNCHER = (
    "import sys; from tpu_debug.cli import main; from tpu_debug.core.children import end_with_parent; "
    "end_with_parent(int(sys.argv.pop(1))); sys.exit(main())"
)


def tui_command(tui_args: Sequence[str]) -> str:
    """The shell command each browser session runs: this Python's ``tpu-debug tui TUI_ARGS``."""
    # textual-serve runs it through a shell: exec makes the UI the process it stops (or kills),
    # and this process its parent
    return "exec " + shlex.join([sys.executable, "-c", _LAUNCHER, str(os.getpid()), "tui", *tui_args])


def url_of(host: str, port: int) -> str:
    """The address to open in a browser on this machine for a server on ``host:port``."""
    if host in ("", "0.0.0.0", "::"):  # every address: this machine's loopback is one of them
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_options(host: str, port: int) -> None:
    """Raise a one-line :class:`CommandError` naming the fix when ``host:port`` cannot be listened on."""
    if not 1 <= port <= 65535:
        raise CommandError(f"--port {port}: give a port from 1 to 65535, e.g. --port 8000", exit_code=2)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise CommandError(
            f"--host {host}: no such address; give an address of this machine, e.g. --host 127.0.0.1",
            exit_code=2,
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # as aiohttp does: a port whose last connections are still closing (TIME_WAIT) is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise _bind_error(host, port, error) from None


def _bind_error(host: str, port: int, error: OSError) -> CommandError:
    if error.errno == errno.EADDRINUSE:
        return CommandError(
            f"--port {port}: already in use on {host}; pick another, e.g. --port {port + 1}", exit_code=2
        )
    if error.errno == errno.EACCES:
        return CommandError(
            f"--port {port}: this user may not listen on it ({error.strerror}); "
            "pick a port above 1023, e.g. --port 8000",
            exit_code=2,
        )
    return CommandError(
        f"--host {host} --port {port}: cannot listen there ({error.strerror}); "
        "give an address of this machine, e.g. --host 127.0.0.1",
        exit_code=2,
    )


def _server_class():
    try:
        import textual_serve.server as served
        from textual_serve.app_service import AppService
        from textual_serve.server import Server
    except ImportError:
        raise CommandError(
            "tpu-debug tui --serve needs textual-serve: pip install textual-serve", exit_code=2
        ) from None

    class UiProcess(AppService):
        """One browser tab's UI process; stopping it also waits for it to end."""

        async def stop(self) -> None:
            await super().stop()
            # textual-serve leaves the process to be reaped, and its input open, after the UI
            # quits: when Ctrl+C closes the event loop first, both end in tracebacks
            process = self._process
            if process is None:
                return
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), _UI_QUIT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()

    class TuiServer(Server):
        """textual-serve's server, with page links relative to the address the browser used."""

        def initialize_logging(self) -> None:
            # its warnings and errors (a UI that failed to start) but not a line per request
            super().initialize_logging()
            logging.getLogger().setLevel(logging.WARNING)

        async def on_startup(self, app) -> None:
            print(f"tpu-debug tui: serving at {self.public_url} (Ctrl+C stops)", file=sys.stderr, flush=True)

        async def handle_index(self, request):
            # The page names its websocket and static files by absolute URL, made from
            # public_url; a browser behind an SSH forward to another local port (or a server
            # on 0.0.0.0) reaches this one by another address, the one in the request. No
            # await separates setting it from the page's rendering, so tabs cannot mix them.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

    # textual-serve's websocket handler makes each tab's AppService by the name in its
    # module: pointing that name at UiProcess gives every tab the waiting stop() without
    # a handler of our own (this process only serves)
    served.AppService = UiProcess
    return TuiServer


def serve(tui_args: Sequence[str], *, host: str, port: int) -> None:
    """Serve ``tpu-debug tui TUI_ARGS`` at http://HOST:PORT until Ctrl+C (or SIGTERM).

    Raises:
        CommandError: textual-serve is missing, or ``host:port`` cannot be listened on.
    """
    check_options(host, port)
    server = _server_class()(tui_command(tui_args), host=host, port=port, title="tpu-debug tui")
    server.public_url = url_of(host, port)
    try:
        server.serve()
    except OSError as error:  # taken between the check and the server's own bind
        raise _bind_error(host, port, error) from None
