"""The rank variables a launcher gives each process of a multi-process job, read in one place.

torch.distributed's ``env://`` rendezvous (``init_process_group()`` with no address) reads
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; torchrun sets those, and
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RUN_ID`` and
``TORCHELASTIC_RESTART_COUNT``; ``tpu-debug run --nproc`` sets the first six for its ranks.
:func:`read_rank_env` parses them into a :class:`RankEnv`, strictly: a value that is not
what the variable holds raises :class:`~tpu_debug.core.errors.ConfigError` naming the
variable, the value and what it accepts. :func:`torchrun_env` says whether torchrun
started this process; :meth:`RankEnv.variables` writes them for a child process.

These are torch's variables, not tpu_debug's options (``TPU_DEBUG_*``,
:mod:`.options`). Standard library only.

Example:
    >>> env = read_rank_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"})
    >>> (env.rank, env.world_size, env.coordinator)
    (1, 2, ':29500')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from tpu_debug.core.errors import ConfigError

__all__ = ["RankEnv", "read_rank_env", "torchrun_env"]

_RUN_ID = "TORCHELASTIC_RUN_ID"


def _var(name: str, least: int | None = None, most: int | None = None) -> dict[str, str | int | None]:
    """A field's variable; with ``least``, an integer at least that (and at most ``most``)."""
    return {"env": name, "least": least, "most": most}


@dataclasses.dataclass(frozen=True, slots=True)
class RankEnv:
    """This process's place in a multi-process job, as its launcher's variables give it
    (None: the variable is not set).

    Attributes:
        rank: ``RANK``, this process among all of the job's (from 0).
        world_size: ``WORLD_SIZE``, the job's processes.
        local_rank: ``LOCAL_RANK``, this process among its machine's.
        local_world_size: ``LOCAL_WORLD_SIZE``, the processes on its machine.
        master_addr: ``MASTER_ADDR``, the host of rank 0's rendezvous store.
        master_port: ``MASTER_PORT``, its port.
        run_id: ``TORCHELASTIC_RUN_ID``, set by torchrun (``"none"`` unless ``--rdzv-id``
            or ``--standalone`` is given).
        restart_count: ``TORCHELASTIC_RESTART_COUNT``, how many times torchrun restarted
            the workers.
    """

    rank: int | None = dataclasses.field(default=None, metadata=_var("RANK", 0))
    world_size: int | None = dataclasses.field(default=None, metadata=_var("WORLD_SIZE", 1))
    local_rank: int | None = dataclasses.field(default=None, metadata=_var("LOCAL_RANK", 0))
    local_world_size: int | None = dataclasses.field(default=None, metadata=_var("LOCAL_WORLD_SIZE", 1))
    master_addr: str | None = dataclasses.field(default=None, metadata=_var("MASTER_ADDR"))
    master_port: int | None = dataclasses.field(default=None, metadata=_var("MASTER_PORT", 1, 65535))
    run_id: str | None = dataclasses.field(default=None, metadata=_var(_RUN_ID))
    restart_count: int | None = dataclasses.field(default=None, metadata=_var("TORCHELASTIC_RESTART_COUNT", 0))

    @property
    def torchrun(self) -> bool:
        """Whether torchrun started this process as one of its workers."""
        return self.run_id is not None and self.rank is not None and self.world_size is not None

    @property
    def coordinator(self) -> str:
        """``MASTER_ADDR:MASTER_PORT`` (each blank when unset)."""
        port = "" if self.master_port is None else str(self.master_port)
        return f"{self.master_addr or ''}:{port}"

    def variables(self) -> dict[str, str]:
        """The variables of the fields that are set, for a child process's environment."""
        return {
            f.metadata["env"]: str(value)
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }


def _parse(field: dataclasses.Field, raw: str) -> int | str:
    name, least, most = field.metadata["env"], field.metadata["least"], field.metadata["most"]
    accepts = (None if least is None else f"an integer ({least} to {most})" if most is not None
               else f"an integer ({least} or more)")
    text = raw.strip()
    if not text:
        raise ConfigError(f"{name} is set but empty; set it to {accepts or 'a value'}, or unset it")
    if accepts is None:
        return text
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least or (most is not None and value > most):
        raise ConfigError(f"{name}={raw!r} is not {accepts}; the launcher (torchrun, tpu-debug run --nproc) "
                          "sets it: start the job with one, or unset it")
    return value


def read_rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """The rank variables that are set (``environ``: default this process's environment).

    Raises:
        ConfigError: a variable holds a value it does not accept, or ``RANK`` is not below
            ``WORLD_SIZE`` (or ``LOCAL_RANK`` below ``LOCAL_WORLD_SIZE``).
    """
    env = os.environ if environ is None else environ
    found = RankEnv(**{
        f.name: _parse(f, env[f.metadata["env"]]) for f in dataclasses.fields(RankEnv) if f.metadata["env"] in env
    })
    for rank, size, rank_name, size_name in (
        (found.rank, found.world_size, "RANK", "WORLD_SIZE"),
        (found.local_rank, found.local_world_size, "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ):
        if rank is not None and size is not None and rank >= size:
            raise ConfigError(f"{rank_name}={rank} is not below {size_name}={size}; ranks count from 0 to "
                              f"{size_name} - 1")
    return found


def torchrun_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """The rank variables of a torchrun worker, or None when torchrun did not start this
    process (the variables of another launcher are not read then).

    Raises:
        ConfigError: as :func:`read_rank_env`.
    """
    env = os.environ if environ is None else environ
    if _RUN_ID not in env:
        return None
    found = read_rank_env(env)
    return found if found.torchrun else None
