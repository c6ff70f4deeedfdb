"""Transfers: every host<->device copy, what caused it, where, loops, and guards."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from tpu_debug.runtime import config as runtime_config
from tpu_debug.runtime import probes
from tpu_debug.tracers.reading.transfer_causes import CallSite, advice_for

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError, TransferGuardError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pitfalls"

_lib = torch.library.Library("tpu_debug_issue5", "DEF")  # an op with no tpu lowering
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")


def _line(offset: int = 0) -> int:
    import sys

    return sys._getframe(1).f_lineno + offset


def test_each_kind_of_transfer_is_classified_with_its_line(logdir, monkeypatch):
    monkeypatch.setattr(runtime_config, "cpu_fallback", True)
    host = torch.arange(4, dtype=torch.float32)
    t = host.to("tpu")
    s = t.sum()
    items = [1, 2, 3, 4, 5, 6, 7]
    lines = {}
    with tpu_debug.trace(logdir=logdir) as session:
        lines["item"] = _line(1)
        s.item()
        lines["tolist"] = _line(1)
        t.tolist()
        lines["print"] = _line(1)
        repr(s)
        lines["bool"] = _line(1)
        if s > 0:
            pass
        lines["float"] = _line(1)
        float(s)
        lines["int"] = _line(1)
        int(s)
        lines["index"] = _line(1)
        items[s.long()]
        lines["cpu"] = _line(1)
        t.cpu()
        lines["to"] = _line(1)
        host.to("tpu")
        lines["tensor"] = _line(1)
        torch.tensor([1.0, 2.0], device="tpu")
        lines["copy"] = _line(1)
        torch.empty(4).copy_(t)
        lines["scalar"] = _line(1)
        t + torch.tensor(2.0)
        lines["fallback:twice"] = _line(1)
        torch.ops.tpu_debug_issue5.twice(t)
    seen = {}
    for tr in session.transfers():
        assert tr.location.file == __file__, tr
        seen.setdefault(tr.op, set()).add((tr.location.line, tr.direction, tr.implicit))
    implicit = {"item", "tolist", "print", "bool", "float", "int", "index", "scalar", "fallback:twice"}
    for cause, line in lines.items():
        kinds = {(ln, imp) for ln, _d, imp in seen.get(cause, ())}
        assert (line, cause in implicit) in kinds, (cause, seen.get(cause))
    assert {d for _l, d, _i in seen["fallback:twice"]} == {"h2d", "d2h"}  # there and back
    assert {d for _l, d, _i in seen["to"]} == {"h2d"} and {d for _l, d, _i in seen["cpu"]} == {"d2h"}
    assert set(seen) == set(lines)


def test_print_and_fstrings_count_as_print(logdir):
    t = torch.arange(3, dtype=torch.float32).to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        text = f"loss {t.sum()}"
        print(t)
    assert text == "loss 3.0"
    assert {(tr.op, tr.implicit) for tr in session.transfers()} == {("print", True)}
    assert len({tr.location.line for tr in session.transfers()}) == 2


def test_a_line_syncing_in_a_loop_is_found_with_its_count(logdir):
    x = torch.ones(8, device="tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        total = 0.0
        for _ in range(6):
            total += (x * 2).sum().item()
        final = x.cpu()
        print(x[:4])  # one call, one copy per element: not a loop
        torch.nn.Linear(3, 3).to("tpu")  # several explicit copies in one call: not a loop either
    assert total == 96.0 and final.shape == (8,)
    sites = session.transfers.call_sites()
    first = sites[0]
    assert (first.cause, first.direction, first.implicit, first.count, first.nbytes, first.loop) == (
        "item",
        "d2h",
        True,
        6,
        24,
        True,
    )
    assert first.seconds > 0 and first.location.file == __file__
    printed = next(s for s in sites if s.cause == "print")
    assert printed.count > 3 and (printed.calls, printed.loop) == (1, False)
    assert [(s.cause, s.count, s.loop) for s in sites if not s.implicit] == [
        ("to", 2, False),
        ("cpu", 1, False),
    ]
    assert advice_for(first).startswith("each call waits for the device to finish")
    # the loop's iterations are its steps: the advisor finds the sync in every steady one
    # (an iteration's .item() comes after its last op, so it counts in the next step)
    (finding,) = session.findings()
    assert (finding.kind, finding.cause, finding.evidence.location.line) == ("implicit_sync", "item", 95)
    assert finding.title == ".item() at test_transfers.py:95 waits for the device in 5 of 5 steady steps"
    assert finding.fix == advice_for(first)
    assert finding.title in session.summary(width=200)


def test_advice_names_the_fix():
    site = CallSite(None, "d2h", "fallback:twice", True, 5, 20, 0.1, ())
    assert advice_for(site) == "aten::twice has no tpu lowering and runs on CPU; add one under runtime/ops/"
    assert advice_for(CallSite(None, "d2h", "bool", True, 5, 5, 0.1, ())).startswith(
        "a tensor in a Python condition"
    )


# -- guards ---------------------------------------------------------------------------------


def test_disallow_raises_before_the_copy_naming_the_line(logdir):
    s = torch.ones(3, device="tpu").sum()
    with (
        tpu_debug.trace(logdir=logdir, transfer_guard="disallow") as session,
        pytest.raises(TransferGuardError, match=r"implicit device-to-host transfer") as info,
    ):
        line = _line(1)
        s.item()
    assert str(info.value) == (
        f"implicit device-to-host transfer of float32[] (4 bytes) by .item() at {__file__}:{line} in "
        "test_disallow_raises_before_the_copy_naming_the_line is disallowed (transfer_guard='disallow'). "
        "To fix: keep the value on the device, or read it once outside the hot loop; or set transfer_guard='log'."
    )
    assert session.transfers() == []  # refused before anything moved
    assert not probes._transfer_checks  # removed with the trace


def test_implicit_only_guard_lets_explicit_copies_through(logdir):
    t = torch.ones(3, device="tpu")
    with tpu_debug.trace(logdir=logdir, transfer_guard_implicit="disallow") as session:
        t.cpu()  # explicit: fine
        with pytest.raises(
            TransferGuardError, match=r"^implicit device-to-host transfer .* by bool\(\) / if t: at "
        ):
            if t.sum() > 0:
                pass
        with pytest.raises(TransferGuardError, match=r"transfer_guard_implicit='disallow'"):
            print(t)
    assert [tr.op for tr in session.transfers()] == ["cpu"]


def test_log_level_warns_and_lets_the_copy_happen(logdir, caplog):
    t = torch.ones(2, device="tpu")
    logged = caplog.at_level(logging.WARNING, logger="tpu_debug.transfers")
    with logged, tpu_debug.trace(logdir=logdir, transfer_guard="log") as session:
        line = _line(1)
        t.tolist()
    (record,) = caplog.records
    assert record.getMessage() == (
        f"tpu_debug: implicit device-to-host transfer of float32[2] (8 bytes) by .tolist() at "
        f"{__file__}:{line} in test_log_level_warns_and_lets_the_copy_happen (transfer_guard='log')"
    )
    assert [tr.op for tr in session.transfers()] == ["tolist"]


def test_transfer_guard_context_manager_without_a_trace():
    t = torch.ones(2, device="tpu")
    with tpu_debug.transfer_guard("disallow", implicit_only=True):
        t.cpu()
        with pytest.raises(
            TransferGuardError, match=r"by \.item\(\) at .*transfer_guard\(implicit_only=True\)='disallow'"
        ):
            t.sum().item()
    assert t.sum().item() == 2.0
    pattern = r"^transfer_guard='never': expected one of allow, log, disallow$"
    with pytest.raises(ConfigError, match=pattern), tpu_debug.transfer_guard("never"):
        pass


def test_guard_levels_from_environment_and_cli(tmp_path):
    cfg = TraceConfig.from_env(
        {"TPU_DEBUG_TRANSFER_GUARD": "Log", "TPU_DEBUG_TRANSFER_GUARD_IMPLICIT": "disallow"}
    )
    assert (cfg.transfer_guard, cfg.transfer_guard_implicit) == ("log", "disallow")
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TRANSFER_GUARD='off' is not a transfer guard level"):
        TraceConfig.from_env({"TPU_DEBUG_TRANSFER_GUARD": "off"})
    script = tmp_path / "sync.py"
    script.write_text("import torch, tpu_debug\nx = torch.ones(2, device='tpu')\nprint(x.sum().item())\n")
    code = main(
        [
            "run",
            "--no-report",
            "--logdir",
            str(tmp_path / "runs"),
            "--transfer-guard-implicit",
            "disallow",
            str(script),
        ]
    )
    assert code == 1
    meta = tpu_debug.open_run(logdir=tmp_path / "runs").metadata()
    assert meta.options["transfer_guard_implicit"] == "disallow"
    assert meta.error.startswith(
        "TransferGuardError: implicit device-to-host transfer of float32[] (4 bytes) by .item() at "
    )
    assert f"{script}:3 in <module>" in meta.error


# -- the example: a loss .item() and a print inside the loop -------------------------------


def test_hidden_sync_example_names_the_syncing_lines(tmp_path, capsys):
    logdir = tmp_path / "runs"
    script = EXAMPLES / "hidden_sync.py"
    assert main(["run", "--no-hlo", "--logdir", str(logdir), str(script), "--steps", "5"]) == 0
    run = tpu_debug.open_run(logdir=logdir)
    source = script.read_text().splitlines()
    item_line = next(i for i, s in enumerate(source, 1) if "total += loss.item()" in s)
    print_line = next(i for i, s in enumerate(source, 1) if 'print(f"step {step}: loss {loss}")' in s)
    sites = {
        (s.location.line, s.cause): s for s in run.transfers.call_sites() if s.location.file == str(script)
    }
    item = sites[(item_line, "item")]
    assert (item.count, item.implicit, item.loop, item.direction) == (5, True, True, "d2h")
    printed = sites[(print_line, "print")]
    assert printed.count >= 5 and printed.calls == 5 and printed.implicit and printed.loop
    assert {(s.location.line, s.cause) for s in run.transfers.call_sites()[:2]} == {
        (item_line, "item"),
        (print_line, "print"),
    }
    report = capsys.readouterr().err
    findings = {(f.kind, f.cause): f for f in run.findings()}
    assert set(findings) == {("implicit_sync", "item"), ("implicit_sync", "print")}
    assert findings[("implicit_sync", "item")].evidence.location.line == item_line
    assert findings[("implicit_sync", "print")].evidence.location.line == print_line
    assert f".item() at hidden_sync.py:{item_line} waits for the device in 4 of 4 steady steps" in report
    # the fixed loop syncs once, after the loop
    assert main(["run", "--no-hlo", "--logdir", str(logdir), str(script), "--steps", "5", "--fixed"]) == 0
    fixed = tpu_debug.open_run(logdir=logdir)
    assert [(s.cause, s.count) for s in fixed.transfers.call_sites() if s.implicit] == [("item", 1)]
    assert fixed.findings() == []
