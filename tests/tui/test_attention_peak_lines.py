"""Every large buffer at a compiled program's peak names the user's line, in the report's text, its
JSON and the TUI's memory view: an attention layer whose scores and softmax are one line (batch 8,
2,048 tokens, one head of 768), ``torch.compile(model)``, forward and backward, dry-run for
v5e-1. The buffers are the TPU compiler's own (its buffer assignment for the target)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from textual.widgets import DataTable
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tui_helpers import drive, press, screen_text

import tpu_debug
from tpu_debug.cli import main

pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)

MiB = 1 << 20
LARGE = 16 * MiB
KINDS = ("activation", "temporary")  # what the forward keeps for the backward, and what a program makes


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(marker))


class Attention(torch.nn.Module):
    def __init__(self, d: int = 768) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # QKV
        p = (q @ k.transpose(-1, -2) / 768**0.5).softmax(-1)  # SOFTMAX
        return self.out(p @ v)  # OUT


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("attention")
    with tpu_debug.trace(logdir=logdir / "runs", target="v5e-1", dry_run=True) as session:
        model = Attention().to("tpu")
        x = torch.randn(8, 2048, 768, device="tpu")  # INPUT
        loss = torch.compile(model, backend="tpu_debug")(x).square().mean()
        loss.backward()  # BACKWARD
    yield session
    session.close()


def _large(buffers) -> list:
    return [b for b in buffers if b.count == 1 and b.kind in KINDS and b.nbytes >= LARGE]


def test_each_large_buffer_at_each_programs_peak_names_its_line(attention_run):
    peaks = {e.name: e for e in attention_run.events("program_memory") if e.source == "target"}
    # the graph's number counts the graphs this process compiled before (other tests')
    (graph,) = {n.split("/")[0] for n in peaks}
    assert set(peaks) == {f"{graph}/forward", f"{graph}/backward"}
    model_lines = {_line("# QKV"), _line("# SOFTMAX"), _line("# OUT")}
    for name, peak in peaks.items():
        large = _large(peak.buffers)
        assert large, name
        for b in large:
            assert (b.file, b.line in model_lines) == (__file__, True), (name, b)
        # the scores and probabilities (f32[8,2048,2048], 128 MiB) kept for the backward at the line
        # that computes them; in the forward the scores being computed too (the backward's other
        # such buffer is the probabilities' gradient, made by the backward of `p @ v`)
        square = [b for b in large if b.shape == (8, 2048, 2048)]
        assert all(b.nbytes == 128 * MiB for b in square)
        kept = [b for b in square if b.kind == "activation"]
        assert kept and all(b.line == _line("# SOFTMAX") for b in kept), name
        made = {b.line for b in square if b.kind == "temporary"}
        assert made == ({_line("# SOFTMAX")} if name.endswith("/forward") else {_line("# OUT")}), name
    # the backward's peak holds the probabilities the forward kept for it, the incoming gradient
    # by the backward() call, the input by the line that made it
    backward = peaks[f"{graph}/backward"]
    kept = [b for b in _large(backward.buffers) if b.kind == "activation" and b.shape == (8, 2048, 2048)]
    assert len(kept) >= 2
    (gradient,) = [b for b in backward.buffers if b.kind == "gradient" and b.op == "the incoming gradient"]


def test_the_backwards_inputs_name_their_lines(attention_run):
    (graph,) = {e.name.split("/")[0] for e in attention_run.events("program_memory") if e.source == "target"}
    (backward,) = [e for e in attention_run.events("program_memory")
                   if e.source == "target" and e.name == f"{graph}/backward"]
    (gradient,) = [b for b in backward.buffers if b.kind == "gradient" and b.op == "the incoming gradient"]
    assert gradient.line == _line("# BACKWARD")
    (given,) = [b for b in backward.buffers if b.kind == "input" and b.nbytes == 48 * MiB]
    assert (given.op, given.line) == ("x", _line("# INPUT"))


def test_the_report_text_and_json_name_them(attention_run):
    text = attention_run.summary()
    flat = " ".join(text.split())
    (graph,) = {e.name.split("/")[0] for e in attention_run.events("program_memory") if e.source == "target"}
    names = {f"{graph}/forward", f"{graph}/backward"}
    for name in names:
        assert f"{name} on v5e-1:" in flat
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", "--json", str(attention_run.run_dir)]) == 0
    data = json.loads(out.getvalue())
    programs = {p["name"]: p for p in data["peak_buffers"] if p["source"] == "target"}
    assert set(programs) == names
    for name, program in programs.items():
        rows = [b for b in program["buffers"] if b["count"] == 1 and b["kind"] in KINDS and b["nbytes"] >= LARGE]
        assert rows
        for b in rows:
            where = f"{Path(__file__).name}:{b['line']}"
            assert b["line"] is not None and b["where"] == where, (name, b)
            # the text report's row of it: the line beside its bytes
            assert where in text
        assert any(b["line"] == _line("# SOFTMAX") and b["shape"] == [8, 2048, 2048] for b in rows)


def test_the_tui_memory_view_names_them(make_app, attention_run):
    app = make_app(attention_run.run_dir)
    peaks = {e.name: e for e in attention_run.events("program_memory") if e.source == "target"}

    async def scenario(pilot):
        await press(pilot, "7")
        seen = {}
        for _ in range(len(peaks)):
            text = screen_text(app)
            name = next(n for n in peaks if f"{n} on v5e-1:" in text)
            table = app.screen.query_one("#peak-buffers", DataTable)
            seen[name] = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            await press(pilot, "p")
        assert set(seen) == set(peaks)
        for name, rows in seen.items():
            large = _large(peaks[name].buffers)
            # each large buffer's row: its kind, then its bytes and the line that made it
            # (the file as the view names it: relative to where the TUI runs)
            made = [row[2] for row in rows if row[2].split(":")[0].endswith(Path(__file__).name)]
            assert len(made) >= len(large), (name, rows)
            assert any(m.endswith(f"{Path(__file__).name}:{_line('# SOFTMAX')}") for m in made)

    drive(app, scenario, size=(200, 80))
