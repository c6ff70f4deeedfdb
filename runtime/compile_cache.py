"""The persistent compile cache: local programs compiled once, read back by later runs.

Running the same script again lowers the same programs; compiling them again
costs the same seconds every run. JAX's persistent compilation cache already
keys an executable by its lowering, the compile options, the devices and the
jax, jaxlib and XLA platform versions, and turns a read-back into a
``jax.stages.Compiled`` like any compile. What it does not do is what a
debugging tool needs: its files are written in place (a process killed mid-write
leaves a truncated entry), read without a checksum, it records compile time in
whole seconds (a small op's 20 ms is 0), it serves every ``jax.jit`` of the
process, and its compile-time threshold (1 s) skips the small programs eager mode
is made of. So JAX's cache calls go through :class:`_Store`, installed as JAX's
cache backend, which:

- serves only the runtime's own compiles (inside :func:`local_compile`); any other
  compile of the process (the user's ``jax.jit``, a TPU-target compile) goes to
  the cache JAX had before (usually none);
- keeps one file per entry, named by JAX's key and ours (tpu_debug, jax,
  jaxlib and libtpu versions, XLA platform), written to a temporary file and
  renamed, so a reader sees a whole entry or none;
- checks each entry before handing it to XLA (format, both keys, length,
  SHA-256): a damaged or foreign entry is ignored with a note (logged, and kept by
  :func:`notes`), and the program is compiled again, which replaces it;
- remembers the compile time in seconds (a float) to report what a read-back saved;
- holds at most ``config.compile_cache_bytes``, least recently used entries out first;
- says why a program an earlier run compiled was not read back (:func:`why_missed`): each
  entry's header names the program (the runtime's name for it and its inputs' shapes) and
  what JAX's key hashed beside the program (XLA flags, the compile's options, the versions),
  so a miss is compared with the entries earlier runs wrote for the same program.

Where: ``config.compile_cache_dir`` (``$TPU_DEBUG_COMPILE_CACHE_DIR``), else the folder
TorchTPU's cache variables name (``$TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``, else
``$TORCH_TPU_TIER2_COMPILATION_CACHE`` under /dev/shm/torch_tpu_cache), else
``$XDG_CACHE_HOME/tpu_debug/compile``, else ``~/.cache/tpu_debug/compile``.
``config.compile_cache = False`` (``TPU_DEBUG_COMPILE_CACHE=0``,
``trace(compile_cache=False)``, ``tpu-debug run --no-compile-cache``) turns it off.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tpu_debug.core.errors import ConfigError
from tpu_debug.core.version import __version__
from tpu_debug.runtime import xla_options
from tpu_debug.runtime.config import config
from tpu_debug.runtime.distributed import xla_log

__all__ = ["CacheOutcome", "cache_dir", "local_compile", "notes", "program_identity", "torchtpu_cache_dir", "why_missed"]

_log = logging.getLogger("tpu_debug.compile_cache")
_MAGIC = b"TPUDBGXC"
_FORMAT = 1
_SUFFIX = ".xc"
_HEADER_MAX = 1 << 16  # an entry's JSON header is a few hundred bytes; more means a foreign file


@dataclasses.dataclass(slots=True)
class CacheOutcome:
    """What the persistent cache did for one compile.

    Attributes:
        from_cache: the executable was read back from the cache (nothing compiled).
        saved_seconds: for a read-back, the recorded compile time less the read-back's.
    """

    from_cache: bool = False
    saved_seconds: float = 0.0
    start: float = 0.0
    original_seconds: float = 0.0
    entry: Path | None = None  # the cache file read or written, if any
    # why the cache did not serve a program an earlier run had compiled: (cause, detail), the
    # cause "flag", "version", "path" or "program" (see ``why_missed``); None: no earlier entry
    # of the program was found, or it was served
    miss: tuple[str, str] | None = None
    program: str | None = None  # the program's identity (``program_identity``)
    # the per-compile XLA options to pass to ``lowered.compile`` (runtime/xla_options.py)
    options: dict | None = None


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is off."""
    if not config.compile_cache:
        return None
    if config.compile_cache_dir:
        return Path(config.compile_cache_dir).expanduser()
    tiered = torchtpu_cache_dir()
    if tiered is not None:
        return tiered
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpu_debug" / "compile"


# TorchTPU's cache tiers: tier 2 is a named folder in shared memory on the host, tier 3 a
# root shared between hosts; this runtime has one persistent cache, kept in the tier named
TIER2 = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TIER3 = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
_TIER2_BASE = "/dev/shm/torch_tpu_cache"


def torchtpu_cache_dir() -> Path | None:
    """The folder TorchTPU's cache variables name, when no ``TPU_DEBUG_COMPILE_CACHE_DIR`` is set.

    ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` (a local folder) wins over
    ``TORCH_TPU_TIER2_COMPILATION_CACHE`` (a name under /dev/shm/torch_tpu_cache, as
    TorchTPU places it, or an absolute path). Entries keep this cache's own format
    (``*.xc`` files), not TorchTPU's.

    Raises:
        ConfigError: the tier-3 root is a cloud bucket (``gs://...``), which this cache
            cannot write.
    """
    root = os.environ.get(TIER3)
    if root:
        if "://" in root:
            raise ConfigError(
                f"{TIER3}={root}: tpu_debug's compile cache is a local folder and cannot write to a "
                f"bucket; point {TIER3} (or TPU_DEBUG_COMPILE_CACHE_DIR) at a local folder, or unset it"
            )
        return Path(root).expanduser()
    name = os.environ.get(TIER2)
    if name:
        return Path(name) if os.path.isabs(name) else Path(_TIER2_BASE) / name
    return None


_notes: collections.deque[str] = collections.deque(maxlen=100)


def notes() -> list[str]:
    """The latest notes about entries ignored (damaged, foreign) or not written, oldest first."""
    return list(_notes)


def _note(text: str) -> None:
    _notes.append(text)
    _log.warning("tpu_debug compile cache: %s", text)


_local = threading.local()  # .scope: (root, CacheOutcome) of this thread's compile in progress


def program_identity(mode: str, name: str, arrays) -> str:
    """What names one program across runs: the runtime's mode and name for it and its inputs'
    shapes and dtypes (``"eager add.Tensor float32[4, 8] float32[4, 8]"``). Two runs that
    compile the same program give it the same identity; its key in the cache also hashes the
    program's text, flags and versions, which may differ."""
    shapes = " ".join(f"{a.dtype}{list(a.shape)}" for a in arrays if hasattr(a, "shape") and hasattr(a, "dtype"))
    return f"{mode} {name} {shapes}".strip()


@contextlib.contextmanager
def local_compile(*, enabled: bool = True, program: str | None = None) -> Iterator[CacheOutcome]:
    """Around the runtime's ``lowered.compile()`` of a local program: the cache may serve it.

    Args:
        enabled: False for a block that compiles for another target (nothing cached).
        program: the program's identity (:func:`program_identity`), written in its entry's
            header; a miss is compared with what earlier runs wrote under it (``outcome.miss``).

    Yields the :class:`CacheOutcome`, filled when the block ends; its ``options`` are the
    XLA options the compile takes (``lowered.compile(outcome.options)``), and the block
    runs at the optimization level asked for (``runtime/xla_options.py``).

    Example::

        with local_compile() as outcome:
            compiled = jax.jit(f).lower(x).compile(outcome.options)
        outcome.from_cache
        # False
    """
    options = xla_options.compiler_options()  # before the cache's scope: checking a flag compiles
    with xla_log.capture(enabled), _local_compile(enabled) as outcome, xla_options.compile_scope():
        outcome.options = options
        outcome.program = program
        yield outcome
    xla_options.tidy_dump(options)
    # XLA logs nothing for an executable read back: its warnings are kept beside the entry
    xla_log.remember(outcome.entry, outcome.from_cache)


@contextlib.contextmanager
def _local_compile(enabled: bool) -> Iterator[CacheOutcome]:
    outcome = CacheOutcome(start=time.perf_counter())
    root = cache_dir() if enabled else None
    if root is None or not _install():
        yield outcome
        return
    from jax._src import config as jax_config

    saved, _local.scope = getattr(_local, "scope", None), (root, outcome)
    try:
        # every program is worth keeping: an eager op compiles in milliseconds, many times per run
        with jax_config.persistent_cache_min_compile_time_secs(0.0):
            yield outcome
    finally:
        _local.scope = saved
    if outcome.from_cache:
        outcome.saved_seconds = max(0.0, outcome.original_seconds - (time.perf_counter() - outcome.start))


_install_lock = threading.Lock()
_store: _Store | None = None


def _install() -> bool:
    """Make :class:`_Store` JAX's cache backend (again, if something replaced it); False if
    this jax has no such hook."""
    global _store
    try:
        from jax._src import compilation_cache as jcc
    except ImportError:
        return False
    if _store is not None and jcc._cache is _store:
        return True
    with _install_lock:
        if _store is None or jcc._cache is not _store:
            previous = jcc._cache if not isinstance(jcc._cache, _Store) else jcc._cache._inner
            _store = _Store(previous)
            jcc._cache = _store
    return True


_print: str | None = None


def _fingerprint() -> str:
    """What, beyond JAX's key, an entry was written by: versions and the XLA platform."""
    global _print
    if _print is None:
        import jax
        import jaxlib

        try:
            libtpu = importlib.metadata.version("libtpu")
        except importlib.metadata.PackageNotFoundError:
            libtpu = "none"
        from jax.extend.backend import get_backend

        backend = get_backend()
        _print = (
            f"tpu_debug {__version__}; jax {jax.__version__}; jaxlib {jaxlib.__version__}; libtpu {libtpu}; "
            f"platform {backend.platform} {backend.platform_version}"
        )
    return _print


def _entry_path(root: Path, key: str) -> Path:
    digest = hashlib.sha256(f"{key}\0{_fingerprint()}".encode()).hexdigest()[:40]
    return root / f"{digest}{_SUFFIX}"


def _get_cache_interface():
    from jax._src.compilation_cache_interface import CacheInterface

    return CacheInterface


class _Store(_get_cache_interface()):
    """JAX's cache backend: checked, atomic entries for the runtime's compiles; for every other
    compile, the cache JAX had (or sets up once the user gives it a directory), else none."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._path = getattr(inner, "_path", None)

    def _others(self):
        if self._inner is None:
            # the user's own jax_compilation_cache_dir, set after this store took JAX's slot
            from jax._src import compilation_cache as jcc
            from jax._src import config as jax_config

            path = jax_config.compilation_cache_dir.value
            if path is not None:
                made = jcc.get_file_cache(path)
                if made is not None:
                    self._inner, self._path = made[0], getattr(made[0], "_path", None)
        return self._inner

    def get(self, key: str) -> bytes | None:
        scope = getattr(_local, "scope", None)
        if scope is None:
            others = self._others()
            return others.get(key) if others is not None else None
        root, outcome = scope
        outcome.entry = _entry_path(root, key)
        payload = _read(outcome.entry, key, outcome)
        if payload is None and not outcome.entry.exists():
            try:
                outcome.miss = why_missed(root, outcome.entry.name, outcome.program, outcome.options)
            except Exception as exc:  # noqa: BLE001 - explaining a miss never fails the compile
                _log.debug("tpu_debug compile cache: a miss not explained: %s", exc)
        return payload

    def put(self, key: str, value: bytes) -> None:
        scope = getattr(_local, "scope", None)
        if scope is None:
            others = self._others()
            if others is not None:
                others.put(key, value)
            return
        root, outcome = scope
        outcome.entry = _entry_path(root, key)
        if outcome.from_cache:  # the entry read back did not load (JAX warned): compiled after all
            outcome.from_cache = False
            _note(f"entry {_entry_path(root, key).name} could not be loaded by XLA; compiled again and replaced")
        _write(root, _entry_path(root, key), key, value, time.perf_counter() - outcome.start,
               outcome.program, outcome.options)

    def clear(self) -> None:
        if self._inner is not None and hasattr(self._inner, "clear"):
            self._inner.clear()


def _read(path: Path, key: str, outcome: CacheOutcome) -> bytes | None:
    """The payload of the entry at ``path`` if it is whole and ours, else None (with a note)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _note(f"entry {path.name} unreadable ({exc.strerror}); compiling instead")
        return None
    problem, header, payload = _parse(data, key)
    if problem is not None:
        _note(f"entry {path.name} ignored: {problem}; compiling again to replace it")
        return None
    outcome.from_cache = True
    outcome.original_seconds = float(header["seconds"])
    with contextlib.suppress(OSError):
        os.utime(path)  # recency for the size bound
    return payload


def _parse(data: bytes, key: str) -> tuple[str | None, dict, bytes]:
    """(problem or None, header, payload) of an entry's bytes."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        return "not a tpu_debug cache entry", {}, b""
    at = len(_MAGIC) + 4
    size = int.from_bytes(data[len(_MAGIC):at], "big")
    if size > _HEADER_MAX or at + size > len(data):
        return "truncated or damaged header", {}, b""
    try:
        header = json.loads(data[at:at + size])
    except ValueError:
        return "damaged header", {}, b""
    payload = data[at + size:]
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        return "written in another format", {}, b""
    if header.get("key") != key or header.get("by") != _fingerprint():
        return f"written for another program or version ({header.get('by')!r})", {}, b""
    if header.get("length") != len(payload):
        return f"truncated ({len(payload)} of {header.get('length')} bytes)", {}, b""
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return "checksum mismatch", {}, b""
    if not isinstance(header.get("seconds"), (int, float)):
        return "damaged header", {}, b""
    return None, header, payload


def _write(root: Path, path: Path, key: str, payload: bytes, seconds: float, program: str | None = None,
           options: dict | None = None) -> None:
    """Write the entry whole (a temporary file renamed over it), then keep the cache within its bound."""
    made = {
        "format": _FORMAT, "key": key, "by": _fingerprint(), "length": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(), "seconds": seconds,
        # what a later run's miss is compared with (why_missed)
        "program": program, "flags": _hashed_flags(), "options": _options_text(options), "run": _RUN,
    }
    header = json.dumps(made).encode()
    data = _MAGIC + len(header).to_bytes(4, "big") + header + payload
    if len(data) > config.compile_cache_bytes:
        return  # larger than the whole bound: not kept
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-", suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _note(f"could not write to {root} ({exc.strerror}); the program runs, uncached")
        return
    _remember(root, path.name, made)
    _bound(root, len(data))


_size_lock = threading.Lock()
_sizes: dict[Path, int] = {}  # bytes held per cache directory, as this process last counted


def _bound(root: Path, added: int) -> None:
    """Drop the least recently used entries once the directory holds more than the bound.

    The total is counted from the directory once and then kept up to date here; other
    processes writing to the same directory are caught at the next count (each time the
    bound is passed)."""
    limit = config.compile_cache_bytes
    with _size_lock:
        total = _sizes.get(root)
        total = _count(root) if total is None else total + added
        if total > limit:
            total = _evict(root, limit * 3 // 4)  # below the bound, so it is not passed again at once
        _sizes[root] = total


def _entries(root: Path) -> list[tuple[float, int, Path]]:
    out = []
    with contextlib.suppress(OSError), os.scandir(root) as it:
        for e in it:
            if e.name.endswith(_SUFFIX) and not e.name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    st = e.stat()
                    out.append((st.st_mtime, st.st_size, Path(e.path)))
    return out


def _count(root: Path) -> int:
    """Bytes of the entries in ``root``; temporary files an hour old (left by a process
    killed while writing) are removed."""
    stale = time.time() - 3600
    for tmp in root.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < stale:
                tmp.unlink()
    return sum(size for _, size, _ in _entries(root))


def _evict(root: Path, target: int) -> int:
    entries = sorted(_entries(root))
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= target:
            break
        # the entry and the warnings its compile logged (kept beside it by xla_log)
        for gone in (path, path.with_name(path.name + xla_log.KEPT_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                gone.unlink()
        total -= size
    return total


# -- why a program was not read back ----------------------------------------------------------

# this process's entries are told apart from those of earlier runs (a program compiled twice in
# one run under one identity is two programs, not a miss)
_RUN = uuid.uuid4().hex
# entries whose headers are read to explain misses, at most, the most recent first (read once per
# process, at its first miss: a header is a few hundred bytes)
_INDEX_MAX = 5_000
# sibling folders looked in for an entry a run kept elsewhere, at most, and the misses after
# which a process that found no entry anywhere stops looking (a first run in a new cache)
_SIBLINGS_MAX = 200
_PATH_LOOKS = 32


def _hashed_flags() -> list[str]:
    """The XLA flags JAX's cache key hashes (XLA_FLAGS and LIBTPU_INIT_ARGS, less the ones it
    leaves out: a dump folder that changes per run misses nothing), sorted."""
    from jax._src import cache_key

    unhashed = set(getattr(cache_key, "xla_flags_to_exclude_from_cache_key", ()))
    flags = (os.environ.get("XLA_FLAGS", "") + " " + os.environ.get("LIBTPU_INIT_ARGS", "")).split()
    return sorted(f for f in flags if f.split("=")[0] not in unhashed)


def _options_text(options: dict | None) -> str:
    """The compile's options as its entry's header keeps them, its optimization level with them
    (JAX's key hashes the compile options, which carry the level)."""
    level = xla_options.optimization_level()
    items = sorted({**(options or {}), **({"xla_optimization_level": level} if level else {})}.items())
    return ", ".join(f"{k}={v}" for k, v in items)


@dataclasses.dataclass(slots=True)
class _Index:
    """What earlier runs wrote to one cache directory: per program identity, their headers."""

    programs: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    names: set[str] = dataclasses.field(default_factory=set)
    looks: int = 0  # misses looked up in other folders with nothing found


_index_lock = threading.Lock()
_indexes: dict[Path, _Index] = {}
_siblings: dict[Path, list[Path]] = {}


def _header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 4)
            if not head.startswith(_MAGIC) or len(head) < len(_MAGIC) + 4:
                return None
            size = int.from_bytes(head[len(_MAGIC):], "big")
            if size > _HEADER_MAX:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _index(root: Path) -> _Index:
    """The entries of ``root`` by program identity, read once per process (its own writes added)."""
    with _index_lock:
        index = _indexes.get(root)
        if index is None:
            index = _indexes[root] = _Index()
            for _, _, path in sorted(_entries(root), reverse=True)[:_INDEX_MAX]:
                header = _header(path)
                if header is not None:
                    index.names.add(path.name)
                    if header.get("program"):
                        index.programs.setdefault(str(header["program"]), []).append(header)
        return index


def _remember(root: Path, name: str, header: dict) -> None:
    index = _indexes.get(root)
    if index is not None:
        with _index_lock:
            index.names.add(name)
            if header.get("program"):
                index.programs.setdefault(str(header["program"]), []).append(header)


def _flag_change(before: list[str], now: list[str]) -> str:
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    parts = ([f"now {' '.join(new)}"] if new else []) + ([f"before {' '.join(gone)}"] if gone else [])
    return "; ".join(parts)


def why_missed(root: Path, name: str, program: str | None, options: dict | None) -> tuple[str, str] | None:
    """Why the cache in ``root`` holds no entry ``name`` for ``program``, when an earlier run
    compiled it: (cause, detail), or None when no earlier run's entry for it was found.

    The causes, from the entries earlier runs wrote: ``"version"`` (an entry for the program
    written by other versions of tpu_debug, jax, jaxlib or libtpu, or for another XLA
    platform), ``"flag"`` (written under other XLA flags, or other compile options),
    ``"program"`` (the same flags and versions: the program's text itself differs, a value
    baked into it changed), ``"path"`` (this very entry is in a sibling folder: the cache
    directory is made anew for each run).
    """
    if program:
        earlier = [h for h in _index(root).programs.get(program, ()) if h.get("run") != _RUN]
        if earlier:
            h = earlier[-1]
            if h.get("by") != _fingerprint():
                return "version", f"an earlier run's entry was written by {h.get('by')}; this run is {_fingerprint()}"
            flags = _hashed_flags()
            if list(h.get("flags") or []) != flags:
                return "flag", f"XLA flags differ from an earlier run's: {_flag_change(list(h.get('flags') or []), flags)}"
            if h.get("options", "") != _options_text(options):
                return "flag", (f"compile options differ from an earlier run's: now {_options_text(options) or 'none'}, "
                                f"before {h.get('options') or 'none'}")
            return "program", "the program's text differs from the one an earlier run compiled for the same inputs"
    index = _index(root)
    if index.looks >= _PATH_LOOKS:
        return None
    for other in _other_folders(root):
        if (other / name).exists():
            return "path", f"{other} holds this program's entry from an earlier run; this run's cache is {root}"
    index.looks += 1
    return None


def _other_folders(root: Path) -> list[Path]:
    """Folders an earlier run of the same job may have kept its cache in: the siblings of
    ``root`` (a folder made anew for each run: ``mktemp -d``'s, a job id under TorchTPU's tier-2
    folder). Not the default folder: a cache set elsewhere on purpose is no mistake, and the
    entries a run kept there before are missed once, not at every run."""
    with _index_lock:
        found = _siblings.get(root)
        if found is None:
            candidates: list[Path] = []
            with contextlib.suppress(OSError), os.scandir(root.parent) as it:
                for n, e in enumerate(it):
                    if n >= _SIBLINGS_MAX:
                        break
                    with contextlib.suppress(OSError):
                        if e.is_dir():
                            candidates.append(Path(e.path))
            found = _siblings[root] = [c for c in dict.fromkeys(candidates) if c != root]
        return found
