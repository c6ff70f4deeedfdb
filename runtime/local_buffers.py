"""The buffer assignment this machine's compiler makes of a program the runtime lowered.

XLA writes its buffer assignment and live ranges only into a dump (``xla_dump_to``): the
executable keeps neither (on the CPU, ``memory_analysis()`` carries a serialized
assignment without live ranges or instruction names; the TPU's carries none). So the
program is compiled once more from its lowering with a dump directory, off the user's
thread, and the reports are read (``core/buffers.py``). The compile options are the
program's own plus the dump's, which change what XLA writes beside the program, not the
program: the assignment is the executable's, to the byte (``tests/core/test_buffers.py``
checks it against ``memory_analysis()``).

The TPU target's compiles dump already (``runtime/target/compile.py``) and carry their
assignment in ``TargetCompile.buffers``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tpu_debug.core.buffers import BufferAssignment, read_dump

__all__ = ["DUMP_OPTIONS", "local_buffer_assignment"]

# what a dump needs to hold the buffer assignment and the optimized module as text (the
# directory is added per compile)
DUMP_OPTIONS: dict[str, Any] = {"xla_dump_hlo_as_text": True, "xla_dump_hlo_as_proto": False}


def local_buffer_assignment(lowered: Any) -> tuple[BufferAssignment | None, str | None]:
    """Compile ``lowered`` for its own platform with a dump, and read the dump.

    Args:
        lowered: a ``jax.stages.Lowered`` (the runtime's ``CompileInfo.lowered``).

    Returns:
        (the buffer assignment, the optimized module's text), each None when the compiler
        wrote none.

    Raises:
        Exception: whatever the compile raises.
    """
    from jax._src import config as jax_config

    with tempfile.TemporaryDirectory(prefix="tpu_debug-buffers-") as dump:
        # never from (or into) the persistent cache: a program read back compiles nothing and
        # dumps nothing (the dump directory, part of the key, makes every key new anyway)
        with jax_config.persistent_cache_min_compile_time_secs(float("inf")):
            lowered.compile(compiler_options={"xla_dump_to": dump, **DUMP_OPTIONS})
        texts = [p for p in sorted(Path(dump).glob("*after_optimizations.txt"))]
        return read_dump(dump), texts[-1].read_text() if texts else None
