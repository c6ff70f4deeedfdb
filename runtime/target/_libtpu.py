"""libtpu, loaded only when a target compile asks for it: environment, topologies, versions."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import threading

from tpu_debug.runtime.target.errors import LibtpuMissingError
from tpu_debug.runtime.target.hardware import Target

__all__ = ["LibtpuMissingError", "require_libtpu", "topology", "libtpu_version"]

INSTALL_HINT = 'pip install "tpu-debug[tpu]" (from a clone: pip install -e ".[tpu]")'


def _find_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401 - a small package: the compiler is its libtpu.so, JAX loads it
    except ImportError:
        return False
    return True


def require_libtpu() -> None:
    """Raise ``LibtpuMissingError`` (one line: what to install) unless libtpu is importable."""
    if not _find_libtpu():
        raise LibtpuMissingError(
            f"compiling for a TPU target needs libtpu, which is not installed: {INSTALL_HINT}"
        )


@functools.cache
def libtpu_version() -> str:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_env_lock = threading.Lock()


def _prepare_environment(target: Target) -> None:
    """Settings libtpu reads when it loads, set only if the user has not set them.

    TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES: without them libtpu prints start-up
    warnings about a TPU VM it cannot find (the value changes nothing a deviceless
    compile emits: the same HLO for v4, v5e and v6e targets whichever type is set).
    ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu holds /tmp/libtpu_lockfile for the process that
    loaded it first, to keep two processes off one TPU; any JAX process on a machine
    with libtpu takes it while probing for a TPU backend, so without this a second
    process (another pytest worker, another tpu_debug run) fails with "ABORTED:
    Internal error when accessing libtpu multi-process lockfile". A deviceless compile
    opens no device. TPU_SKIP_MDS_QUERY: no GCE metadata lookup (JAX sets it itself
    on a machine without TPU chips).
    """
    with _env_lock:
        accelerator = f"{target.generation.name}-{min(target.generation.slices)}"
        if target.generation.name == "v5e":
            accelerator = "v5litepod-1"
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator)
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


_topology_lock = threading.Lock()


@functools.cache
def _topology_devices(name: str, chips_per_host: tuple[int, int, int]) -> tuple:
    from jax.experimental import topologies

    # the host bounds given, not taken from the environment: JAX's own backend probe
    # may have loaded libtpu before _prepare_environment ran (the first jax call of any
    # program on a machine with libtpu), and libtpu then assumes 2x2x1 hosts, which a
    # one-chip topology is not divisible by ("Topology layout "v6e:1x1" is not divisible
    # by the given (or default) chips_per_host_bounds")
    return tuple(topologies.get_topology_desc(topology_name=name, platform="tpu",
                                              chips_per_host_bounds=list(chips_per_host)).devices)


def topology(target: Target) -> tuple:
    """The compile-only TPU devices of ``target`` (loads libtpu on first use).

    Raises:
        LibtpuMissingError: libtpu is not installed.
    """
    require_libtpu()
    _prepare_environment(target)
    with _topology_lock:  # the first call initializes the PJRT plugin
        return _topology_devices(target.topology, target.chips_per_host_bounds)
