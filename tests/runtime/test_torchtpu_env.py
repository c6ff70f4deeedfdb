"""TorchTPU's variables on this runtime (runtime/xla_options.py, runtime/compile_cache.py,
runtime/torchtpu/compat.py): the XLA optimization level reaches the compiles, XLA_FLAGS set after
XLA started still dump, the cache tiers name the compile cache, libtpu's flags pass absl."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from jax._src import config as jax_config
from tpu_debug.core.errors import ConfigError
from tpu_debug.runtime import compile_cache, xla_options
from tpu_debug.runtime.compile_cache import local_compile
from tpu_debug.runtime.config import config


def _level_inside_a_compile() -> str:
    with local_compile():
        return jax_config.optimization_level.value


def test_the_optimization_level_reaches_the_compiles(monkeypatch):
    default = _level_inside_a_compile()
    monkeypatch.setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", "xla_optimization_level=O3")
    assert _level_inside_a_compile() == "O3"
    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O0"}):
        assert _level_inside_a_compile() == "O0"
    # TorchTPU's module of the same context (Qwen3's pipeline example imports it)
    from torch_tpu._internal import compiler_options

    with compiler_options.custom_compiler_options({"xla_optimization_level": "O1"}):
        assert _level_inside_a_compile() == "O1"
    monkeypatch.delenv("TORCH_TPU_INTERNAL_XLA_OPTIONS")
    assert _level_inside_a_compile() == default
    monkeypatch.setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", "xla_optimization_level=O7")
    with pytest.raises(ConfigError, match=r"xla_optimization_level=O7 is not one of O0, O1, O2, O3; set e.g."):
        _level_inside_a_compile()


def test_a_tpu_compiler_option_is_named_once_and_left_out(monkeypatch, capsys):
    monkeypatch.setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", "xla_optimization_level=O1 --xla_tpu_test_only_option=1")
    assert _level_inside_a_compile() == "O1"
    assert _level_inside_a_compile() == "O1"
    err = capsys.readouterr().err
    assert err.count("TORCH_TPU_INTERNAL_XLA_OPTIONS xla_tpu_test_only_option: a TPU compiler option") == 1


def test_xla_flags_set_after_xla_started_still_dump(monkeypatch, tmp_path, capsys):
    """Under `tpu-debug run` XLA starts before the script sets XLA_FLAGS; the flags then go to
    each compile as options (what `python script.py` gets from XLA reading the variable)."""
    x = torch.arange(11.0, device="tpu")  # XLA has started (and read XLA_FLAGS)
    monkeypatch.setitem(xla_options._state, "flags_at_start", None)
    monkeypatch.setitem(xla_options._state, "started", True)
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_hlo_as_text --xla_dump_to={tmp_path}")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):  # a program no other test compiles
        assert torch.equal((x * 2.5 - 1.0).cpu(), torch.arange(11.0) * 2.5 - 1.0)
    assert list(tmp_path.glob("*after_optimizations.txt"))
    # TorchTPU's examples print every file of the dump as text: the CPU backend's machine code
    # is kept apart (a TPU's dump has none), nothing deleted
    for path in tmp_path.iterdir():
        if path.is_file():
            path.read_text(encoding="utf-8")
    assert list((tmp_path / xla_options.CPU_OBJECTS).glob("*.obj-file.*.o"))
    # a flag XLA does not take per compile is named, and the others still apply
    assert xla_options._late_flags("--xla_dump_hlo_as_text --xla_no_such_flag=1") == {"xla_dump_hlo_as_text": True}
    assert "XLA_FLAGS --xla_no_such_flag: XLA read XLA_FLAGS when it started" in capsys.readouterr().err


def test_the_cache_tiers_name_the_compile_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "compile_cache_dir", None)
    monkeypatch.setattr(config, "compile_cache", True)
    monkeypatch.delenv(compile_cache.TIER3, raising=False)
    monkeypatch.setenv(compile_cache.TIER2, "tier2_name")
    assert compile_cache.cache_dir() == Path("/dev/shm/torch_tpu_cache/tier2_name")
    monkeypatch.setenv(compile_cache.TIER3, str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path
    monkeypatch.setattr(config, "compile_cache_dir", str(tmp_path / "own"))
    assert compile_cache.cache_dir() == tmp_path / "own"  # tpu_debug's own variable wins
    monkeypatch.setattr(config, "compile_cache_dir", None)
    monkeypatch.setenv(compile_cache.TIER3, "gs://bucket/cache")
    with pytest.raises(ConfigError, match=r"cannot write to a bucket; point TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"):
        compile_cache.cache_dir()


def test_libtpu_flags_on_the_command_line_pass_absl(monkeypatch):
    """The guide appends libtpu's flags to sys.argv and LIBTPU_INIT_ARGS, then runs
    absl.app.run(main): the flags are declared so absl's parse goes on; a flag of the
    script's own (not libtpu's) is left for the script to declare."""
    from absl import flags
    from tpu_debug.runtime.torchtpu.compat import declare_libtpu_flags

    libtpu = ["--xla_jf_dump_to=/tmp/llo", "--xla_jf_dump_llo_text=true"]
    monkeypatch.setattr(sys, "argv", ["script.py", *libtpu, "--xla_tpu_only_on_argv", "--xla_scripts_own=1"])
    monkeypatch.setenv("LIBTPU_INIT_ARGS", " ".join(libtpu))
    values = flags.FlagValues()  # absl's global FLAGS, as a fresh one
    with pytest.raises(flags.UnrecognizedFlagError, match="Unknown command line flag 'xla_jf_dump_to'"):
        values(sys.argv)
    declare_libtpu_flags(values)
    assert "xla_scripts_own" not in values
    flags.DEFINE_string("xla_scripts_own", None, "the script's", flag_values=values)
    assert values(sys.argv) == ["script.py"]
    assert values.xla_jf_dump_to == "/tmp/llo" and values.xla_jf_dump_llo_text is True
    assert values.xla_tpu_only_on_argv is True and values.xla_scripts_own == "1"


def test_torchtpus_eager_mode_variables(monkeypatch):
    from tpu_debug.runtime.torchtpu.compat import eager_mode_from_env

    for name in ("TPU_DEBUG_EAGER_MODE", "TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE"):
        monkeypatch.delenv(name, raising=False)
    assert eager_mode_from_env() is None
    monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "1")
    assert eager_mode_from_env() == "defer_and_fuse"
    monkeypatch.setenv("TPU_LAUNCH_BLOCKING", "1")
    assert eager_mode_from_env() == "defer_never_and_launch_blocking"
    monkeypatch.setenv("TPU_DEBUG_EAGER_MODE", "defer_never")  # tpu_debug's own variable wins
    assert eager_mode_from_env() is None
