"""``tpu-debug tui`` and ``tpu-debug run --tui`` from the command line (not in a terminal here)."""

from __future__ import annotations

import sqlite3

from tpu_debug.cli import main


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_unknown_run_is_one_clear_line(tmp_path, capsys):
    assert main(["tui", "nope", "--logdir", str(tmp_path)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line == (
        f"tpu-debug tui: nope: no such run (not a path, nor a run name in {tmp_path}). "
        "List recorded runs with 'tpu-debug runs'."
    )


def test_no_runs_yet(tmp_path, capsys):
    assert main(["tui", "--logdir", str(tmp_path / "empty")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        f"tpu-debug tui: no runs in {tmp_path / 'empty'}: record one with 'tpu-debug run script.py'"
    )


def test_damaged_run_is_one_clear_line(tmp_path, capsys):
    run_dir = tmp_path / "20260131T120000.000Z-broken"
    run_dir.mkdir()
    (run_dir / "run.db").write_bytes(b"this is not a database" * 100)
    assert main(["tui", str(run_dir)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"tpu-debug tui: {run_dir / 'run.db'}: not a readable tpu_debug run")
    assert line.endswith("re-record the run.")


def test_other_database_is_refused(tmp_path, capsys):
    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    assert main(["tui", str(db)]) == 1
    assert "not a tpu_debug run database" in _one_line(capsys.readouterr().err)


def test_needs_a_terminal(synthetic_run, capsys):
    # pytest captures stdout: not a terminal
    assert main(["tui", str(synthetic_run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (
        "tpu-debug tui: the terminal UI needs a terminal (standard input/output is redirected); "
        f"print the report instead: tpu-debug report {synthetic_run}"
    )


def test_poll_must_be_positive(synthetic_run, capsys):
    assert main(["tui", str(synthetic_run), "--poll", "0"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "tpu-debug tui: --poll 0.0: give a number of seconds above 0, e.g. --poll 0.5"
    )


def test_run_tui_without_a_terminal_prints_the_report(tmp_path, capsys, monkeypatch):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(3, device='tpu') * 2\nprint(float(x.sum().item()))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--tui", "--logdir", str(tmp_path / "runs"), str(script)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "6.0"
    assert "tpu-debug run --tui: not a terminal, so here is the report instead" in err
    assert "tpu_debug report: tiny" in err
