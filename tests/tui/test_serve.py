"""``tpu-debug tui --serve``: the UI in a real browser (headless Chromium over the DevTools protocol).

The page draws the terminal on a canvas, so its text is not in the DOM. The test reads it
from the page's xterm.js terminal, the screen the canvas shows: a script run before the
page's own catches the terminal when textual-serve's page stores it (``this.terminal = ...``).

Also a script: ``python tests/tui/test_serve.py RUN --out docs/tui_browser.png`` serves RUN
and saves what the browser shows.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from devtools import DevTools  # scripts/ is no package: found by path

LAUNCHER = "import sys; from tpu_debug.cli import main; sys.exit(main())"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # the page asks a web font service for its font: resolve no name, so the browser reaches
    # only the server at 127.0.0.1, which the rule spares (and draws with a local monospace font)
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
# generous: 2 shared cores start Chromium, the server and the UI process
PATIENCE = 120.0

# runs in the page before its scripts: the first object that stores a "terminal" gets a
# plain property again, and the page keeps a reference to it
CATCH_TERMINAL = """
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  set(value) {
    Object.defineProperty(this, "terminal", {value, writable: true, configurable: true, enumerable: true});
    window.__servedTerminal = value;
  },
});
"""
# the terminal's screen, one line of text a row (null until the page made its terminal)
SCREEN_TEXT = """(() => {
  const terminal = window.__servedTerminal;
  if (!terminal) return null;
  const buffer = terminal.buffer.active, rows = [];
  for (let i = 0; i < buffer.length; i++) rows.push(buffer.getLine(i).translateToString(true));
  return rows.join("\\n");
})()"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(ready, what: str, timeout: float = PATIENCE):
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return value


def start_server(run_dir: Path, port: int, log: Path) -> subprocess.Popen:
    """``tpu-debug tui --serve RUN --port PORT`` with its output in ``log``; returns once it listens."""
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, "tui", "--serve", str(run_dir), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def listening() -> bool:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with {server.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_until(listening, f"a server on 127.0.0.1:{port}")
    return server


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    process.send_signal(sig)
    try:
        return process.wait(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


async def _read_page(ws_url: str, url: str, wanted: list[str], shot: Path | None, then) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        tools = DevTools(ws, PATIENCE)
        reader = asyncio.ensure_future(tools.read())
        try:
            await tools.call("Page.enable")  # without it, the script below is not run in new documents
            await tools.call("Page.addScriptToEvaluateOnNewDocument", source=CATCH_TERMINAL)
            await tools.call("Page.navigate", url=url)
            deadline = time.monotonic() + PATIENCE
            text = ""
            while not all(w in text for w in wanted):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the page did not show {wanted} within {PATIENCE:.0f} s; it shows:\n{text}"
                    )
                await asyncio.sleep(0.5)
                result = await tools.call("Runtime.evaluate", expression=SCREEN_TEXT, returnByValue=True)
                text = result["result"].get("value") or ""
            if shot is not None:
                await asyncio.sleep(1)  # the canvas draws a frame after the terminal holds the text
                data = await tools.call("Page.captureScreenshot", format="png")
                shot.write_bytes(base64.b64decode(data["data"]))
            if then is not None:
                then()
            return text
        finally:
            reader.cancel()


def browse(
    url: str, wanted: list[str], *, shot: Path | None = None, size: str = "1280,800", then=None
) -> str:
    """Open ``url`` in headless Chromium; the served terminal's text once it holds every ``wanted``
    (``then()`` is called then, while the page is still open)."""
    # Chromium's helpers may still write its profile a moment after the browser ended
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as profile:
        chromium = subprocess.Popen(
            [
                CHROMIUM,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",  # Chromium picks one and writes it in DevToolsActivePort
                "--remote-debugging-address=127.0.0.1",
                f"--window-size={size}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its helpers end with it
        )
        try:
            active = Path(profile) / "DevToolsActivePort"
            port = wait_until(
                lambda: active.exists() and active.read_text().split()[:1], "Chromium's DevTools"
            )[0]
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=PATIENCE) as answer:
                targets = json.load(answer)
            page = next(t for t in targets if t["type"] == "page")
            return asyncio.run(_read_page(page["webSocketDebuggerUrl"], url, wanted, shot, then))
        finally:
            os.killpg(chromium.pid, signal.SIGTERM)
            try:
                chromium.wait(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                os.killpg(chromium.pid, signal.SIGKILL)
                chromium.wait()


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _loaded_libraries(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it ended meanwhile
        return ""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary here (apt-get install chromium)")
def test_browser_shows_the_overview(synthetic_run, tmp_path):
    from synthetic_run import META

    port = free_port()
    log = tmp_path / "server.log"
    server = start_server(synthetic_run, port, log)
    try:
        # what the synthetic run holds (its command line and name), and a finding it was made to have
        wanted = [
            " ".join(META["argv"]),
            f"tpu-debug · {META['name']}",
            ".item() at train.py:22 waits for the device",
        ]
        # the server's and each UI process's command line and memory map, read while the page is open
        processes: dict[int, tuple[str, str]] = {}

        def look_at_the_processes() -> None:
            for pid in [server.pid, *_descendants(server.pid)]:
                command = _cmdline(pid)
                if command.startswith(sys.executable) and "tpu_debug.cli" in command:
                    processes[pid] = (command, _loaded_libraries(pid))

        text = browse(
            f"http://127.0.0.1:{port}/", wanted, shot=tmp_path / "page.png", then=look_at_the_processes
        )
        assert all(w in text for w in wanted), text
        assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # the server and the page's UI are the reading verb's processes: without torch or jax
        uis = [pid for pid, (command, _) in processes.items() if "--serve" not in command]
        assert server.pid in processes and uis, processes.keys()
        for command, maps in processes.values():
            assert "libtorch" not in maps and "jaxlib" not in maps, f"{command} loaded torch or jax"
    finally:
        status = stop(server, signal.SIGINT)  # what Ctrl+C sends
    output = log.read_text()
    assert status == 0, output
    assert f"tpu-debug tui: serving at http://127.0.0.1:{port} (Ctrl+C stops)" in output.splitlines()
    assert "Traceback" not in output, output
    wait_until(lambda: all(_state(pid) in ("gone", "Z") for pid in uis), "the UI processes to end")


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_port_in_use_is_one_clear_line(synthetic_run, capsys):
    from tpu_debug.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["tui", "--serve", str(synthetic_run), "--port", str(port)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"tpu-debug tui: --port {port}: already in use on 127.0.0.1; pick another, e.g. --port {port + 1}"
    )


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # a documentation address (RFC 5737): no machine has it, so binding it fails here
        (
            ["--host", "192.0.2.1", "--port", "8000"],
            (
                "--host 192.0.2.1 --port 8000: cannot listen there (Cannot assign requested address); "
                "give an address of this machine, e.g. --host 127.0.0.1"
            ),
        ),
        # an empty label: refused before any name lookup, so nothing leaves this machine
        (
            ["--host", "no..such"],
            "--host no..such: no such address; give an address of this machine, e.g. --host 127.0.0.1",
        ),
        (["--port", "0"], "--port 0: give a port from 1 to 65535, e.g. --port 8000"),
        (["--port", "65536"], "--port 65536: give a port from 1 to 65535, e.g. --port 8000"),
    ],
)
def test_an_address_it_cannot_listen_on_is_one_clear_line(synthetic_run, capsys, options, expected):
    from tpu_debug.cli import main

    assert main(["tui", "--serve", str(synthetic_run), *options]) == 2
    assert _one_line(capsys.readouterr().err) == f"tpu-debug tui: {expected}"


def test_host_without_serve_is_refused(synthetic_run, capsys):
    from tpu_debug.cli import main

    assert main(["tui", str(synthetic_run), "--host", "0.0.0.0"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "tpu-debug tui: --host is for --serve: add --serve to open the UI in a browser"
    )


def test_a_run_that_does_not_exist_is_said_before_serving(tmp_path, capsys):
    from tpu_debug.cli import main

    assert main(["tui", "--serve", "nope", "--logdir", str(tmp_path), "--port", str(free_port())]) == 1
    assert _one_line(capsys.readouterr().err).startswith("tpu-debug tui: nope: no such run")


def test_page_links_follow_the_address_the_browser_used(synthetic_run, tmp_path):
    # a browser behind "ssh -L 9999:localhost:PORT" asks for localhost:9999: the page's
    # websocket must be there too, not at the server's own address
    import urllib.request

    port = free_port()
    server = start_server(synthetic_run, port, tmp_path / "server.log")
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Host": "localhost:9999"})
        with urllib.request.urlopen(request, timeout=PATIENCE) as answer:
            page = answer.read().decode()
    finally:
        assert stop(server, signal.SIGINT) == 0
    assert 'data-session-websocket-url="ws://localhost:9999/ws"' in page, page
    assert f":{port}" not in page, page


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def main() -> int:
    parser = argparse.ArgumentParser(
        description="serve RUN with tpu-debug tui --serve and save what a browser shows"
    )
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tui_browser.png"))
    parser.add_argument("--size", default="1280,800", help="window WIDTH,HEIGHT")
    parser.add_argument(
        "--wait-for", default="Findings", help="text the page must show before the screenshot"
    )
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args.run.resolve(), port, Path(tmp) / "server.log")
        try:
            browse(f"http://127.0.0.1:{port}/", [args.wait_for], shot=args.out, size=args.size)
        finally:
            stop(server, signal.SIGINT)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
