"""The launcher's rank variables (RANK, WORLD_SIZE, torchrun's), read in one place: core/rank_env.py."""

from __future__ import annotations

import pytest

from tpu_debug.cli import main
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.rank_env import RankEnv, read_rank_env, torchrun_env

TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "0"}


def test_torchruns_variables_read_back_as_written():
    env = torchrun_env(TORCHRUN)
    assert env == RankEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1",
                          master_port=29500, run_id="none", restart_count=0)
    assert env.torchrun and env.coordinator == "127.0.0.1:29500"
    assert env.variables() == TORCHRUN  # what a launcher writes for a child, read back the same
    assert read_rank_env({}) == RankEnv() and RankEnv().coordinator == ":"


def test_only_torchrun_makes_a_torchrun_worker():
    others = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    assert torchrun_env(others) is None  # tpu-debug run --nproc, or a hand-set env:// rendezvous
    assert torchrun_env({"TORCHELASTIC_RUN_ID": "none"}) is None  # the agent itself has no rank
    assert torchrun_env(dict(others, RANK="junk")) is None  # not torchrun's: not read


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("RANK", "junk", r"^RANK='junk' is not an integer \(0 or more\); the launcher \(torchrun, tpu-debug run "
                     r"--nproc\) sets it: start the job with one, or unset it$"),
    ("WORLD_SIZE", "0", r"^WORLD_SIZE='0' is not an integer \(1 or more\); "),
    ("MASTER_PORT", "70000", r"^MASTER_PORT='70000' is not an integer \(1 to 65535\); "),
    ("LOCAL_RANK", " ", r"^LOCAL_RANK is set but empty; set it to an integer \(0 or more\), or unset it$"),
    ("RANK", "2", r"^RANK=2 is not below WORLD_SIZE=2; ranks count from 0 to WORLD_SIZE - 1$"),
])
def test_a_value_a_variable_does_not_accept_is_named_with_what_it_accepts(name, raw, message):
    with pytest.raises(ConfigError, match=message):
        torchrun_env(dict(TORCHRUN, **{name: raw}))


def test_run_under_torchrun_with_a_bad_rank_fails_in_one_line(tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').write('the script ran')\n")
    monkeypatch.chdir(tmp_path)
    for name, value in dict(TORCHRUN, RANK="one").items():
        monkeypatch.setenv(name, value)
    assert main(["run", "--logdir", str(tmp_path / "runs"), str(script)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "tpu-debug run: RANK='one' is not an integer (0 or more); the launcher (torchrun, tpu-debug run --nproc) "
        "sets it: start the job with one, or unset it"
    ]
    assert not (tmp_path / "ran").exists()
