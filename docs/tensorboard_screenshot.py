"""Regenerate ``docs/tensorboard_trace.png``: a recorded run in xprof's trace viewer.

    python docs/tensorboard_screenshot.py [--out docs/tensorboard_trace.png]

It records a small training run with ``tpu-debug run --tensorboard`` (the batch
shrinks in step 3, so its ops recompile), serves it with ``tpu-debug
tensorboard`` on 127.0.0.1, and drives headless Chromium (``apt-get install
chromium``) through the DevTools protocol (``aiohttp``, loopback only): it
opens the trace viewer, keeps the Python thread, zooms on the start of step 3
and selects the recompile of its first matmul, so the details panel shows the
span's metadata. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from devtools import DevTools  # scripts/ is no package: found by path

DEMO = textwrap.dedent(
    """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        batch = 16 if step != 3 else 12  # a ragged batch: its ops recompile
        x, y = torch.randn(batch, 32).to("tpu"), torch.randn(batch, 1).to("tpu")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")
    """
)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# runs in the page: the trace viewer lives in an iframe (catapult's tr-ui-timeline-view)
FOCUS_JS = """
(() => {
  const frame = document.querySelector('iframe');
  const w = frame.contentWindow, view = frame.contentDocument.querySelector('tr-ui-timeline-view');
  const threads = [];
  for (const p of Object.values(view.model.processes)) threads.push(...Object.values(p.threads));
  const py = threads.find(t => t.name === 'python');
  const step = py.sliceGroup.slices.find(s => s.title === STEP);
  const pick = py.sliceGroup.slices.find(s => s.title === PICK && s.start >= step.start && s.start <= step.end);
  const tracks = [];
  (function walk(n) {
    if (!n) return;
    if (n.thread && n.thread.name !== undefined) tracks.push(n);
    if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of (n.children ? Array.prototype.slice.call(n.children) : [])) walk(c);
  })(view.trackView);
  for (const t of tracks) if (t.thread.name !== 'python') t.style.display = 'none';
  const vp = view.trackView.viewport;
  const dt = new w.tr.ui.TimelineDisplayTransform();
  dt.set(vp.currentDisplayTransform);
  dt.xSetWorldBounds(step.start - 0.1, pick.end + (pick.end - step.start) * 0.25,
                     vp.modelTrackContainer_.canvas.clientWidth);
  vp.setDisplayTransformImmediately(dt);
  const selection = new w.tr.model.EventSet();  // (an Array made here fails instanceof there)
  selection.push(pick);
  view.brushingStateController_.changeSelectionFromTimeline(selection);
  return {step: step.title, picked: pick.title, args: pick.args};
})()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, deadline: float) -> bytes:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                body = response.read()
            return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body  # TensorBoard gzips
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer") from None
            time.sleep(0.5)


async def _drive(ws_url: str, url: str, out: Path, width: int, height: int) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        tools = DevTools(ws)
        reader = asyncio.ensure_future(tools.read())
        await tools.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        await tools.call("Page.navigate", url=url)
        ready = (
            "(() => { const f = document.querySelector('iframe'); const v = f && f.contentDocument"
            ".querySelector('tr-ui-timeline-view'); return !!(v && v.model && v.trackView); })()"
        )
        deadline = time.monotonic() + 90
        while not await tools.evaluate(ready):
            if time.monotonic() > deadline:
                raise TimeoutError("the trace viewer did not load within 90 s")
            await asyncio.sleep(1)
        await asyncio.sleep(2)
        js = FOCUS_JS.replace("STEP", json.dumps("step 3")).replace(
            "PICK", json.dumps("recompile aten::addmm")
        )
        picked = await tools.evaluate(js)
        await asyncio.sleep(2)
        shot = await tools.call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))
        reader.cancel()
        return picked


def _shoot(url: str, out: Path, width: int, height: int) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        chromium = subprocess.Popen(
            [
                "chromium",
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--remote-debugging-port={port}",
                "--remote-debugging-address=127.0.0.1",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            targets = json.loads(_wait_http(f"http://127.0.0.1:{port}/json/list", time.monotonic() + 30))
            page = next(t for t in targets if t["type"] == "page")
            return asyncio.run(_drive(page["webSocketDebuggerUrl"], url, out, width, height))
        finally:
            chromium.terminate()
            try:
                chromium.wait(timeout=10)
            except subprocess.TimeoutExpired:
                chromium.kill()
                chromium.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("tensorboard_trace.png"))
    parser.add_argument("--size", default="1600x1000", help="viewport WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="tb-demo-") as tmp:
        work = Path(tmp)
        (work / "train_mlp.py").write_text(DEMO)
        tpu_debug = [sys.executable, "-m", "tpu_debug"]
        subprocess.run(
            [*tpu_debug, "run", "--tensorboard", "--no-report", "--logdir", "runs", "train_mlp.py"],
            cwd=work,
            check=True,
        )
        port = _free_port()
        command = subprocess.run(
            [*tpu_debug, "tensorboard", "--logdir", "runs", "--print", "--port", str(port)],
            cwd=work,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        with open(work / "tensorboard.log", "wb") as log:
            server = subprocess.Popen(shlex.split(command), cwd=work, stdout=log, stderr=subprocess.STDOUT)
            try:
                base = f"http://127.0.0.1:{port}/data/plugin/profile"
                deadline = time.monotonic() + 90
                runs: list = []
                while not runs:
                    runs = json.loads(_wait_http(f"{base}/runs", deadline))
                url = f"{base}/index.html?run={runs[-1]}&tool=trace_viewer@&host={socket.gethostname()}"
                picked = _shoot(url, args.out, width, height)
            finally:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    print(f"{args.out}: {picked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
