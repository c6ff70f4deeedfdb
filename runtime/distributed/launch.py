"""Multi-process runs on one machine: ranks started by ``tpu-debug run --nproc N``.

JAX's own runtime does the work: each rank calls ``jax.distributed.initialize``
(JAX's coordination service, on the first rank) and then sees the devices of
every rank as one set; a mesh over them spans processes, and XLA's collectives
between processes go through gloo on the CPU backend. ``launch_ranks`` starts
the processes (each a ``tpu-debug run`` of the same script, told its rank
through ``TPU_DEBUG_RANK``, ``TPU_DEBUG_NPROC`` and ``TPU_DEBUG_COORDINATOR``),
forwards their output line by line with a ``[rank N]`` prefix, and stops the
others when one fails and they do not end by themselves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tpu_debug.core.options import env_var, option, read_env
from tpu_debug.core.rank_env import RankEnv, torchrun_env
from tpu_debug.runtime.distributed.errors import LaunchError
from tpu_debug.runtime.platform import leave_out_an_absent_tpu

__all__ = [
    "ENV_RANK",
    "ENV_NPROC",
    "ENV_COORDINATOR",
    "initialize",
    "is_initialized",
    "get_rank",
    "get_world_size",
    "process_info",
    "kv_client",
    "device_count_flag",
    "launch_ranks",
]

ENV_RANK = env_var("rank")
ENV_NPROC = env_var("nproc")
ENV_COORDINATOR = env_var("coordinator")
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# how long a rank waits for the others to start. At exit a rank waits for the others to
# end too (jax's shutdown barrier, 5 minutes by default): a rank that finished early must
# not declare the run failed while another one is still working or closing its run
_JOIN_SECONDS = 120

_state: dict[str, Any] = {"initialized": False, "coordinator": None}
_lock = threading.Lock()


def initialize(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Join the multi-process run this process belongs to (``jax.distributed.initialize``).

    Without arguments the run is read from ``TPU_DEBUG_COORDINATOR``, ``TPU_DEBUG_NPROC``
    and ``TPU_DEBUG_RANK`` (``tpu-debug run --nproc`` sets them); with none set this
    process is a run of its own and nothing happens. Call it before any `tpu` work
    (``tpu-debug run`` does, before the script starts). Calling it again does nothing.

    Returns:
        Whether this process is part of a multi-process run.

    Raises:
        ConfigError: a variable holds a value its option does not accept.
        LaunchError: the variables are incomplete, or JAX started before joining.

    Example::

        from tpu_debug.runtime import distributed
        distributed.initialize()      # under tpu-debug run --nproc 2: True
    """
    with _lock:
        if _state["initialized"]:
            return True
        env = read_env([option("coordinator"), option("nproc"), option("rank")])
        coordinator = coordinator or env.get("coordinator")
        if coordinator is None:
            return False
        num = num_processes if num_processes is not None else env.get("nproc")
        rank = process_id if process_id is not None else env.get("rank")
        if num is None or rank is None:
            raise LaunchError(
                f"{ENV_COORDINATOR} is set, so {ENV_NPROC} and {ENV_RANK} must be too "
                "(tpu-debug run --nproc N sets all three)"
            )
        if not 0 <= rank < num:
            raise LaunchError(f"rank {rank} is not below the number of processes {num}")
        import jax
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            raise LaunchError(
                "JAX was already in use when this process joined the multi-process run; call "
                "distributed.initialize() before any tpu tensor is made (tpu-debug run --nproc does)"
            )
        leave_out_an_absent_tpu()  # before JAX's first backend probe
        # collectives between processes on the CPU backend
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes=num, process_id=rank,
                                   initialization_timeout=_JOIN_SECONDS)
        _state["initialized"] = True
        _state["coordinator"] = coordinator
        return True


def is_initialized() -> bool:
    """Whether this process joined a multi-process run."""
    return bool(_state["initialized"])


def get_rank() -> int:
    """This process's rank (0 in a run of one process)."""
    if not _state["initialized"]:
        return 0
    import jax

    return jax.process_index()


def get_world_size() -> int:
    """The number of processes of the run (1 for a run of one process)."""
    if not _state["initialized"]:
        return 1
    import jax

    return jax.process_count()


def process_info() -> dict[str, Any] | None:
    """This rank and its run, for a run's metadata; None outside a multi-process run."""
    if not _state["initialized"]:
        return _torchrun_info()
    import jax

    return {
        "rank": jax.process_index(),
        "world_size": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "coordinator": _state["coordinator"],
    }


def _torchrun_info() -> dict[str, Any] | None:
    """A torchrun worker's rank, from the variables torchrun sets (its processes join through
    c10d, not JAX: each has its own devices)."""
    env = torchrun_env()
    if env is None:
        return None
    import jax

    return {
        "rank": env.rank,
        "world_size": env.world_size,
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "coordinator": env.coordinator,
    }


def kv_client() -> Any:
    """JAX's coordination-service client (its key-value store), or None outside a multi-process run."""
    if not _state["initialized"]:
        return None
    from jax._src import distributed

    return distributed.global_state.client


def device_count_flag(xla_flags: str, devices: int) -> str:
    """``XLA_FLAGS`` with the CPU backend's device count set to ``devices``."""
    kept = [f for f in xla_flags.split() if not f.startswith(_DEVICE_FLAG)]
    return " ".join([*kept, f"{_DEVICE_FLAG}={devices}"])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forward(stream: IO[bytes], out: Any, prefix: str) -> None:
    """Copy ``stream`` to ``out`` line by line, each line after ``prefix``."""
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace")
        try:
            out.write(prefix + text if text.endswith("\n") else prefix + text + "\n")
            out.flush()
        except (OSError, ValueError):
            pass
    stream.close()


def launch_ranks(
    nproc: int,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    devices: int | None = None,
    grace_seconds: float = 15.0,
    stdout: Any = None,
    stderr: Any = None,
) -> list[int]:
    """Run ``argv`` as ``nproc`` ranks of one multi-process run on this machine; wait for all.

    Args:
        nproc: how many processes.
        argv: each rank's command line (the same for every rank).
        env: their environment (default: this process's); the rank variables are added.
        devices: CPU devices per rank (``XLA_FLAGS``' host device count), None to keep it.
        grace_seconds: once a rank fails, how long the others may take to end on their
            own before they are sent SIGTERM (then SIGKILL after as long again).
        stdout, stderr: where their output goes, each line prefixed ``[rank N] ``
            (default: this process's).

    Returns:
        Each rank's exit status (negative: killed by that signal).

    Raises:
        LaunchError: ``nproc`` is below 1, or a rank cannot be started.
    """
    if nproc < 1:
        raise LaunchError(f"--nproc {nproc}: give at least 1 process")
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    base = dict(os.environ if env is None else env)
    base[ENV_COORDINATOR] = f"127.0.0.1:{_free_port()}"
    base[ENV_NPROC] = str(nproc)
    port = _free_port()
    if devices is not None:
        base["XLA_FLAGS"] = device_count_flag(base.get("XLA_FLAGS", ""), devices)
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    try:
        for rank in range(nproc):
            # torch.distributed's env:// rendezvous, as torchrun sets it: init_process_group() in
            # the script joins the other ranks with no argument
            torch_env = RankEnv(rank=rank, world_size=nproc, local_rank=rank, local_world_size=nproc,
                                master_addr="127.0.0.1", master_port=port)
            rank_env = dict(base, **torch_env.variables(), **{ENV_RANK: str(rank)})
            try:
                proc = subprocess.Popen(list(argv), env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except OSError as exc:
                raise LaunchError(f"cannot start rank {rank} ({argv[0]}): {exc.strerror or exc}") from None
            procs.append(proc)
            for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
                t = threading.Thread(target=_forward, args=(stream, sink, f"[rank {rank}] "), daemon=True)
                t.start()
                threads.append(t)
        codes = _wait(procs, grace_seconds)
    except KeyboardInterrupt:
        for p in procs:  # the ranks got the terminal's SIGINT too; make sure, then wait for them to close
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGINT)
        codes = _wait(procs, grace_seconds)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.kill()
                p.wait()
        for t in threads:
            t.join(timeout=5)
    return codes


def _wait(procs: list[subprocess.Popen], grace: float) -> list[int]:
    """Wait for every process; once one fails, give the rest ``grace`` seconds, then stop them."""
    failed_at: float | None = None
    stage = 0  # 1: SIGTERM sent, 2: SIGKILL sent
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes]
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace * (stage + 1) and stage < 2:
            for p, c in zip(procs, codes):
                if c is None:
                    with contextlib.suppress(OSError):
                        p.send_signal(signal.SIGTERM if stage == 0 else signal.SIGKILL)
            stage += 1
        time.sleep(0.05)
