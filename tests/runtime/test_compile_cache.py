"""The persistent compile cache: a program compiled in one process is read back in the next.

Each test points the cache at its own temporary directory. "Another run" is a fresh
process (a script run with ``subprocess``) or, within this process, the runtime's
in-memory executable caches cleared, so the next call of the same op must get its
executable from somewhere: the persistent cache or XLA. What a read-back gives is
checked against PyTorch on CPU, and whether XLA compiled something is counted at JAX's
own call into XLA's compiler (``jax._src.compiler.backend_compile_and_load``),
independently of the runtime's flags.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap

import pytest
import torch
import warm_python

from tpu_debug.runtime import compile_cache, eager, probes
from tpu_debug.runtime.config import RuntimeConfig, config


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache on, in a directory of this test's own."""
    root = tmp_path / "compile"
    monkeypatch.setattr(config, "compile_cache", True)
    monkeypatch.setattr(config, "compile_cache_dir", str(root))
    eager.clear_cache()
    yield root
    eager.clear_cache()


class _Compiles:
    """A probe keeping the compile infos it hears; and XLA's own compiles, from JAX."""

    def __init__(self) -> None:
        self.infos: list = []
        self.backend = 0

    def on_compile(self, info) -> None:
        self.infos.append(info)


@contextlib.contextmanager
def _listening():
    from jax._src import compiler

    log = _Compiles()
    xla_compile = compiler.backend_compile_and_load

    def counted(*args, **kwargs):
        log.backend += 1
        return xla_compile(*args, **kwargs)

    probes.subscribe(log)
    compiler.backend_compile_and_load = counted
    try:
        yield log
    finally:
        compiler.backend_compile_and_load = xla_compile
        probes.unsubscribe(log)


def _op(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 3 - x


def _fresh_process_call(x: torch.Tensor) -> torch.Tensor:
    eager.clear_cache()  # what a new process starts with: no executable in memory
    return _op(x.to("tpu")).cpu()


def test_second_call_reads_back_and_matches_cpu(cache):
    x = torch.randn(5, 7)
    with _listening() as first:
        out1 = _fresh_process_call(x)
    assert first.infos and not any(i.from_cache for i in first.infos)
    assert first.backend == len(first.infos)  # each executable was compiled by XLA
    assert any(cache.glob("*.xc"))
    with _listening() as second:
        out2 = _fresh_process_call(x)
    assert [i.name for i in second.infos] == [i.name for i in first.infos]
    assert all(i.from_cache for i in second.infos)
    assert second.backend == 0  # XLA compiled nothing
    assert all(i.saved_seconds >= 0.0 for i in second.infos)
    torch.testing.assert_close(out1, _op(x))
    torch.testing.assert_close(out2, _op(x))


def test_off_compiles_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setattr(config, "compile_cache", False)
    x = torch.randn(3, 4)
    for _ in range(2):
        with _listening() as log:
            out = _fresh_process_call(x)
        assert log.infos and not any(i.from_cache for i in log.infos)
        assert log.backend == len(log.infos)
    assert not cache.exists()
    torch.testing.assert_close(out, _op(x))


def _damage(root, how: str) -> None:
    for path in root.glob("*.xc"):
        data = path.read_bytes()
        if how == "truncated":  # a writer killed mid-write (JAX's own cache writes in place)
            path.write_bytes(data[: len(data) // 2])
        elif how == "flipped":  # a damaged disk block: same length, one byte changed
            i = len(data) - 10
            path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
        elif how == "foreign":  # not ours at all (JAX's own format: a 4-byte time, then the executable)
            path.write_bytes(b"\x00\x00\x00\x01" + data[-200:])
        elif how == "empty":
            path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "flipped", "foreign", "empty"])
def test_damaged_entries_are_ignored_with_a_note_and_replaced(cache, how):
    x = torch.randn(4, 6)
    with _listening() as first:
        _fresh_process_call(x)
    entries = sorted(cache.glob("*.xc"))
    _damage(cache, how)
    before = len(compile_cache.notes())
    with _listening() as second:
        out = _fresh_process_call(x)
    assert not any(i.from_cache for i in second.infos)
    assert second.backend == len(first.infos)  # compiled again, none of the damaged bytes loaded
    notes = compile_cache.notes()[before:]
    assert len(notes) == len(entries) and all("ignored" in n for n in notes)
    torch.testing.assert_close(out, _op(x))
    with _listening() as third:  # the recompiles replaced the damaged entries
        _fresh_process_call(x)
    assert all(i.from_cache for i in third.infos) and third.backend == 0


def test_entry_written_by_another_version_is_ignored(cache, monkeypatch):
    import json

    x = torch.randn(2, 3)
    ours = compile_cache._fingerprint()
    monkeypatch.setattr(compile_cache, "_print", ours.replace("tpu_debug ", "tpu_debug 0.0.0+other-"))
    _fresh_process_call(x)
    monkeypatch.setattr(compile_cache, "_print", ours)
    # the other version's entries, moved to the names this version looks up (a copied cache)
    for path in list(cache.glob("*.xc")):
        data = path.read_bytes()
        size = int.from_bytes(data[8:12], "big")
        key = json.loads(data[12 : 12 + size])["key"]
        path.rename(compile_cache._entry_path(cache, key))
    before = len(compile_cache.notes())
    with _listening() as log:
        out = _fresh_process_call(x)
    assert log.infos and not any(i.from_cache for i in log.infos)
    assert log.backend == len(log.infos)
    notes = compile_cache.notes()[before:]
    assert len(notes) == len(log.infos) and all("another program or version" in n for n in notes)
    torch.testing.assert_close(out, _op(x))


def test_size_bound_drops_least_recently_used(cache, monkeypatch):
    xs = [torch.randn(n, 3) for n in (2, 3, 4, 5)]
    _fresh_process_call(xs[0])
    one = sum(p.stat().st_size for p in cache.glob("*.xc"))
    # room for about two programs of this size: the first ones go as the later ones arrive
    monkeypatch.setattr(config, "compile_cache_bytes", int(one * 2.5))
    monkeypatch.setattr(compile_cache, "_sizes", {})
    # the warnings a sharded compile logged are kept beside its entry: they go with it
    for path in cache.glob("*.xc"):
        path.with_name(path.name + ".xla-log").write_text("")
    first = set(cache.glob("*.xc"))
    for x in xs[1:]:
        _fresh_process_call(x)
    held = sum(p.stat().st_size for p in cache.glob("*.xc"))
    assert held <= config.compile_cache_bytes
    gone = first - set(cache.glob("*.xc"))
    assert gone and not any(p.with_name(p.name + ".xla-log").exists() for p in gone)
    with _listening() as log:  # the newest is still there, the oldest is not
        _fresh_process_call(xs[-1])
    assert all(i.from_cache for i in log.infos)
    with _listening() as log:
        _fresh_process_call(xs[0])
    assert not any(i.from_cache for i in log.infos)


def test_users_own_jit_is_not_cached(cache):
    import jax
    import jax.numpy as jnp

    _fresh_process_call(torch.randn(2, 2))
    held = set(cache.glob("*.xc"))
    jax.jit(lambda a: jnp.sin(a) * 7).lower(jnp.ones((3, 5))).compile()
    assert set(cache.glob("*.xc")) == held


def test_environment_variables():
    assert RuntimeConfig.from_env({}).compile_cache is True
    cfg = RuntimeConfig.from_env(
        {"TPU_DEBUG_COMPILE_CACHE": "0", "TPU_DEBUG_COMPILE_CACHE_DIR": "/x/y",
         "TPU_DEBUG_COMPILE_CACHE_BYTES": "1_000"}
    )
    assert (cfg.compile_cache, cfg.compile_cache_dir, cfg.compile_cache_bytes) == (False, "/x/y", 1000)
    from tpu_debug.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"TPU_DEBUG_COMPILE_CACHE='maybe' is not a boolean"):
        RuntimeConfig.from_env({"TPU_DEBUG_COMPILE_CACHE": "maybe"})


def test_default_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "compile_cache", True)
    monkeypatch.setattr(config, "compile_cache_dir", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path / "tpu_debug" / "compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.cache_dir() == tmp_path / "home" / ".cache" / "tpu_debug" / "compile"


_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import tpu_debug

    options = {"off": {"compile_cache": False}, "guarded": {"fail_on_recompile": True}}.get(sys.argv[2], {})
    with tpu_debug.trace(logdir=sys.argv[1], **options) as s:
        for n in (3, 5):  # a second shape: each op compiles again
            x = torch.arange(4.0 * n).reshape(n, 4)
            y = (torch.relu(x.to("tpu") - 5) * 2).sum(dim=1)
            torch.testing.assert_close(y.cpu(), (torch.relu(x - 5) * 2).sum(dim=1))
    ops, groups, table = s.ops(), s.recompiles.groups(), s.compiles.groups()
    print(sum(o.compiles for o in ops), sum(o.read_back for o in ops),
          sum(1 for c in s.compiles() if c.from_cache), len(s.recompiles()))
    print(sum(g.compiles for g in groups), sum(g.recompiles for g in groups), sum(g.read_backs for g in groups),
          sum(g.compiles for g in table), sum(g.recompiles for g in table), sum(g.read_backs for g in table))
    """
)


def _traced_lines(tmp_path, root, mode: str) -> tuple[list[int], list[int]]:
    """The script's two printed lines of counts, run in a process of its own on the cache ``root``."""
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TPU_DEBUG_COMPILE_CACHE="1", TPU_DEBUG_COMPILE_CACHE_DIR=str(root))
    done = warm_python.run([sys.executable, str(script), str(tmp_path / "runs"), mode], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = ([int(v) for v in line.split()] for line in done.stdout.splitlines()[-2:])
    return first, second


def _traced_run(tmp_path, root, mode: str, line: int = -2) -> list[int]:
    return _traced_lines(tmp_path, root, mode)[line]


@pytest.fixture(scope="module")
def first_process(tmp_path_factory):
    """The script's first run, on an empty cache: (the cache's root, its two lines of counts).
    The runs after it on that root read back or leave the cache off, so write nothing to it:
    each test that starts from this run finds the cache as the run left it."""
    tmp = tmp_path_factory.mktemp("first_process")
    root = tmp / "compile"
    return (root, *_traced_lines(tmp, root, "on"))


def test_second_process_compiles_nothing_and_trace_option_turns_it_off(tmp_path, first_process):
    root, (compiles, read_back, flagged, recompiles), _ = first_process
    assert compiles > 0 and read_back == 0 and flagged == 0 and recompiles > 0
    # read back: nothing compiled, so nothing recompiled either; fail_on_recompile stays quiet
    assert _traced_run(tmp_path, root, "guarded") == [0, compiles, compiles, 0]
    assert _traced_run(tmp_path, root, "off") == [compiles, 0, 0, recompiles]


def test_second_run_says_nothing_compiled_yet_16_recompiles(tmp_path, first_process):
    # every reader counts the same: compiles and recompiles are what XLA compiled, read-backs apart
    root, _, (compiles, recompiles, read_backs, *table) = first_process
    assert compiles > 0 and recompiles > 0 and read_backs == 0 and table == [compiles, recompiles, 0]
    assert _traced_run(tmp_path, root, "on", line=-1) == [0, 0, compiles, 0, 0, compiles]


def test_stale_temporary_files_are_removed(cache, monkeypatch):
    _fresh_process_call(torch.randn(2, 5))
    stale, fresh = cache / ".tmp-killed.xc", cache / ".tmp-writing.xc"
    for path in (stale, fresh):
        path.write_bytes(b"half an entry")
    os.utime(stale, (1_000_000_000, 1_000_000_000))  # 2001: a writer long gone
    monkeypatch.setattr(compile_cache, "_sizes", {})  # the next write counts the directory again
    _fresh_process_call(torch.randn(3, 5))
    assert not stale.exists() and fresh.exists()  # another process may still be writing that one


def test_users_own_jax_cache_directory_keeps_working(cache, tmp_path):
    import jax
    import jax.numpy as jnp

    _fresh_process_call(torch.randn(2, 2))  # the runtime's store now holds JAX's cache slot
    theirs = tmp_path / "jax-cache"
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", str(theirs))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        jax.jit(lambda a: jnp.cos(a) + 3).lower(jnp.ones((4, 3))).compile()
        assert any(p.is_file() for p in theirs.rglob("*"))  # written by JAX, in its own format
    finally:
        jax.config.update("jax_compilation_cache_dir", saved[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
        compile_cache._store._inner = compile_cache._store._path = None


def test_entry_xla_cannot_load_is_compiled_again_with_a_note(cache):
    import hashlib
    import json

    x = torch.randn(3, 2)
    with _listening() as first:
        _fresh_process_call(x)
    for path in cache.glob("*.xc"):  # whole and checksummed, but not an executable
        data = path.read_bytes()
        size = int.from_bytes(data[8:12], "big")
        header = json.loads(data[12 : 12 + size])
        payload = b"not an executable"
        header.update(length=len(payload), sha256=hashlib.sha256(payload).hexdigest())
        text = json.dumps(header).encode()
        path.write_bytes(data[:8] + len(text).to_bytes(4, "big") + text + payload)
    before = len(compile_cache.notes())
    with pytest.warns(UserWarning, match="Error reading persistent compilation cache entry"), _listening() as log:
        out = _fresh_process_call(x)
    assert not any(i.from_cache for i in log.infos)
    assert log.backend == len(first.infos)
    notes = compile_cache.notes()[before:]
    assert len(notes) == len(first.infos) and all("could not be loaded by XLA" in n for n in notes)
    torch.testing.assert_close(out, _op(x))


# -- why a program an earlier run compiled was not read back ------------------------------------


def _compile_program(program: str, scale: float = 3.0) -> compile_cache.CacheOutcome:
    """One program compiled under ``program``'s identity (a new function each call: JAX keeps no
    executable of it in memory)."""
    import jax
    import jax.numpy as jnp

    def fn(x):
        return jnp.tanh(x) * scale

    with compile_cache.local_compile(program=program) as outcome:
        jax.jit(fn).lower(jnp.ones((4,), jnp.float32)).compile(outcome.options)
    return outcome


def _another_run(monkeypatch) -> None:
    """What a new process starts with: its own run token, no index of the cache read yet."""
    import uuid

    monkeypatch.setattr(compile_cache, "_RUN", uuid.uuid4().hex)
    compile_cache._indexes.clear()
    compile_cache._siblings.clear()


def test_a_program_read_back_or_compiled_first_has_no_miss_to_explain(cache, monkeypatch):
    assert _compile_program("test tanh float32[4]").miss is None  # nothing earlier: no cause
    _another_run(monkeypatch)
    again = _compile_program("test tanh float32[4]")
    assert again.from_cache and again.miss is None


def test_a_miss_under_other_xla_flags_names_the_flag(cache, monkeypatch):
    # JAX's key hashes LIBTPU_INIT_ARGS beside XLA_FLAGS; XLA's CPU client reads neither here
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_run_id=1")
    _compile_program("test tanh float32[4]")
    _another_run(monkeypatch)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_run_id=2")
    outcome = _compile_program("test tanh float32[4]")
    assert not outcome.from_cache
    cause, detail = outcome.miss
    assert cause == "flag" and "now --xla_tpu_run_id=2" in detail and "before --xla_tpu_run_id=1" in detail


def test_a_miss_at_another_optimization_level_names_the_compile_options(cache, monkeypatch):
    _compile_program("test tanh float32[4]")
    _another_run(monkeypatch)
    monkeypatch.setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", "xla_optimization_level=O1")
    cause, detail = _compile_program("test tanh float32[4]").miss
    assert cause == "flag" and "xla_optimization_level=O1" in detail


def test_a_miss_of_an_entry_written_by_another_version_names_both(cache, monkeypatch):
    monkeypatch.setattr(compile_cache, "_print", "tpu_debug 0.0.1; jax 0.0.1")
    _compile_program("test tanh float32[4]")
    _another_run(monkeypatch)
    monkeypatch.setattr(compile_cache, "_print", None)
    cause, detail = _compile_program("test tanh float32[4]").miss
    assert cause == "version" and "tpu_debug 0.0.1; jax 0.0.1" in detail and compile_cache._fingerprint() in detail


def test_a_miss_of_a_program_whose_text_changed_says_so(cache, monkeypatch):
    _compile_program("test tanh float32[4]", scale=3.0)
    _another_run(monkeypatch)
    assert _compile_program("test tanh float32[4]", scale=4.0).miss[0] == "program"
    # within one run, two programs of one identity are two programs, not a miss to explain
    assert _compile_program("test tanh float32[4]", scale=5.0).miss[0] == "program"  # the earlier run's still


def test_a_miss_in_a_new_folder_names_the_folder_that_holds_the_entry(cache, monkeypatch):
    first = cache.parent / "job-1"
    monkeypatch.setattr(config, "compile_cache_dir", str(first))
    _compile_program("test tanh float32[4]")
    _another_run(monkeypatch)
    monkeypatch.setattr(config, "compile_cache_dir", str(cache.parent / "job-2"))
    outcome = _compile_program("test tanh float32[4]")
    cause, detail = outcome.miss
    assert cause == "path" and str(first) in detail and str(cache.parent / "job-2") in detail


def test_a_miss_is_recorded_with_its_compile(cache, monkeypatch, tmp_path):
    import tpu_debug

    x = torch.randn(4, 8)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_run_id=1")
    _fresh_process_call(x)
    _another_run(monkeypatch)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_run_id=2")
    eager.clear_cache()
    with tpu_debug.trace(logdir=tmp_path / "runs", compile_cache=True) as session:
        _op(x.to("tpu")).cpu()
    missed = [c for c in session.compiles() if c.cache_miss is not None]
    assert missed and {c.cache_miss for c in missed} == {"flag"}
    assert all("--xla_tpu_run_id=2" in c.cache_miss_detail for c in missed)
    assert all(c.cache_entry and c.cache_entry.startswith(str(cache)) for c in missed)
