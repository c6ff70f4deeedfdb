"""Regenerate ``docs/memory_snapshot.png``: a `tpu` run's memory snapshot in PyTorch's viewer.

    python docs/memory_snapshot_screenshot.py --viewer MemoryViz.js --d3 d3.min.js \\
        [--snapshot FILE] [--out docs/memory_snapshot.png]

It dry-runs the attention step of ``DEMO`` for a v5e (``tpu-debug run --dry-run --target v5e-1
--memory-snapshot``: needs libtpu) and takes the snapshot of its compiled backward program at its
peak (``--program``), unless ``--snapshot`` names a snapshot already written; it
renders it with PyTorch's own ``python -m torch.cuda._memory_viz trace_plot``, and takes a
screenshot of that page in headless Chromium (``apt-get install chromium``).

``trace_plot``'s page loads PyTorch's viewer (``torch/utils/viz/MemoryViz.js`` of PyTorch's
repository) from a CDN, and the viewer loads d3 5 from another; a machine without those reaches
neither, so the page is served from 127.0.0.1 with local copies: ``--viewer`` a copy of
``MemoryViz.js``, ``--d3`` d3 5's ``dist/d3.min.js`` (``npm pack d3@5``), which the viewer's d3
imports are pointed at. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

DEMO = textwrap.dedent(
    """
    import torch


    class Attention(torch.nn.Module):
        def __init__(self, d=768):
            super().__init__()
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.out = torch.nn.Linear(d, d)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            p = (q @ k.transpose(-1, -2) / 768**0.5).softmax(-1)
            return self.out(p @ v)


    model = Attention().to("tpu")
    x = torch.randn(8, 2048, 768, device="tpu")
    loss = torch.compile(model, backend="tpu_debug")(x).square().mean()
    loss.backward()
    """
)

# once drawn, the pointer rests on one allocation (at HOVER, a fraction of the window's width and
# height), so the page shows its frames in the viewer's stack panel, as a hover does
_HOVER = """
<script>
setTimeout(() => {
  const at = document.elementFromPoint(innerWidth * %f, innerHeight * %f);
  if (at) at.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
}, 3000);
</script>
"""

# the viewer's imports of d3 (ES modules from a CDN), read from the d3 bundle a <script> loads
_D3_IMPORT = re.compile(r'^import (?:\* as d3|\{([^}]*)\}) from "https://cdn\.skypack\.dev/d3[^"]*";$', re.MULTILINE)
_VIEWER_URL = re.compile(r'"https://[^"]*/MemoryViz\.js"')


def _local_viewer(source: str) -> str:
    def local(m: re.Match) -> str:
        return "const d3 = window.d3;" if m.group(1) is None else f"const {{{m.group(1)}}} = window.d3;"

    return _D3_IMPORT.sub(local, source)


def _record(work: Path, program: str) -> Path:
    script = work / "attention.py"
    script.write_text(DEMO)
    snapshot = work / "attention.pickle"  # the run's; each compiled program's beside it
    subprocess.run([sys.executable, "-m", "tpu_debug", "run", "--dry-run", "--target", "v5e-1",
                    "--logdir", str(work / "runs"), "--memory-snapshot", str(snapshot), str(script)],
                   check=True, cwd=work, stdout=subprocess.DEVNULL)
    return snapshot.with_name(f"{snapshot.stem}.{program}.pickle") if program else snapshot


def _screenshot(url: str, out: Path, size: tuple[int, int]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on the PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="tpu_debug-chromium-") as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--disable-background-networking", "--no-first-run", f"--user-data-dir={profile}",
                        f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=15000",
                        f"--screenshot={out}", url], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--viewer", type=Path, required=True, help="a copy of PyTorch's MemoryViz.js")
    parser.add_argument("--d3", type=Path, required=True, help="d3 5's dist/d3.min.js")
    parser.add_argument("--snapshot", type=Path, help="a snapshot to show (default: record the demo's)")
    parser.add_argument("--program", default="g1.backward.v5e-1",
                        help="the demo's snapshot to show: a compiled program's (default: the backward's on "
                             "the v5e), or '' for the run's")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("memory_snapshot.png"))
    parser.add_argument("--size", default="1500x900", help="the window, WIDTHxHEIGHT")
    parser.add_argument("--hover", default="0.78,0.41", help="where the pointer rests: X,Y fractions of the window")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tpu_debug-snapshot-") as tmp:
        work = Path(tmp)
        snapshot = args.snapshot or _record(work, args.program)
        page = work / "trace_plot.html"
        subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(snapshot),
                        "-o", str(page)], check=True)
        html = _VIEWER_URL.sub('"./MemoryViz.js"', page.read_text())
        html = html.replace("<head>", '<head>\n<script src="./d3.min.js"></script>', 1)
        x, y = (float(v) for v in args.hover.split(","))
        page.write_text(html.replace("</body>", f"{_HOVER % (x, y)}</body>", 1))
        (work / "MemoryViz.js").write_text(_local_viewer(args.viewer.read_text()))
        shutil.copy(args.d3, work / "d3.min.js")
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(work))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            width, height = (int(v) for v in args.size.split("x"))
            _screenshot(f"http://127.0.0.1:{server.server_address[1]}/{page.name}", args.out.resolve(),
                        (width, height))
        finally:
            server.shutdown()
            server.server_close()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
