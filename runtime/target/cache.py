"""The on-disk cache of target compile results.

JAX's persistent compilation cache cannot serve deviceless TPU compiles (jax
0.10.2 with libtpu 0.0.42.1 or 0.0.52): it writes the executable, but reading it back needs a
TPU client ("PjRtCompiler must be constructed with a Client to call"), so every
warm compile warns and compiles again. What a target compile produces is data
(HLO text, memory, cost, or the compiler's error), so that is what is kept: one
zlib-compressed JSON file per (program text, topology, jax, jaxlib, libtpu)
key. JSON, not pickle: a cache file is read, never executed.

Where: ``$TPU_DEBUG_TARGET_CACHE`` if set (``0``/``off``/``false``/``no`` turns the
cache off; the option ``target_cache`` in ``core/options.py``),
else ``$XDG_CACHE_HOME/tpu_debug/target``, else
``~/.cache/tpu_debug/target``.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from pathlib import Path

from tpu_debug.core.options import env_var, option, read_env

__all__ = ["cache_dir", "load_record", "store_record", "load_value", "store_value", "ENV"]

ENV = env_var("target_cache")
_VERSION = 1


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is off."""
    value = read_env([option("target_cache")]).get("target_cache")
    if value is not None:
        return None if value is False else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpu_debug" / "target"


def _path(key: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / f"{key}.json.z"


def load_record(key: str) -> dict | None:
    """The fields kept with :func:`store_record` under ``key``, or None (a missing, unreadable
    or foreign file is a miss)."""
    return _read(key)


def store_record(key: str, fields: dict) -> None:
    """Keep ``fields`` (JSON data: a compile's result) under ``key``; a cache that cannot be
    written is skipped (the result stands)."""
    _write(key, fields)


def load_value(key: str):
    """A JSON value kept with ``store_value`` under ``key``, or None (a miss)."""
    data = _read(key)
    return None if data is None else data.get("value")


def store_value(key: str, value) -> None:
    """Keep a JSON value (a figure the compiler gave) under ``key``; an unwritable cache is skipped."""
    _write(key, {"value": value})


def _read(key: str) -> dict | None:
    path = _path(key)
    if path is None:
        return None
    try:
        data = json.loads(zlib.decompress(path.read_bytes()))
    except (OSError, ValueError, zlib.error):
        return None
    if not isinstance(data, dict) or data.get("version") != _VERSION or data.get("key") != key:
        return None
    return data


def _write(key: str, fields: dict) -> None:
    path = _path(key)
    if path is None:
        return
    data = {"version": _VERSION, "key": key, **fields}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json.z")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(zlib.compress(json.dumps(data).encode(), 6))
            os.replace(tmp, path)  # readers see the whole file or none
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
