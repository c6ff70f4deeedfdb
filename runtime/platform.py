"""Which JAX platform the runtime runs on: JAX kept off a TPU that is not attached.

Light (JAX is imported when the check runs): the multi-process launch calls it before
``jax.distributed.initialize``, and the device's first use (:mod:`.startup`) before its first op.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil

__all__ = ["leave_out_an_absent_tpu"]


def leave_out_an_absent_tpu() -> None:
    """Keep JAX from loading libtpu on a machine with no TPU attached; call it before JAX's
    first backend probe.

    With the ``libtpu`` wheel installed (the ``tpu`` extra, to compile for a TPU target),
    JAX's first backend probe loads it even where there is no TPU: libtpu prints start-up
    errors, holds /tmp/libtpu_lockfile (another process then fails to load it), and its
    failure handler can abort the process when a signal arrives. When the user chose no
    platforms (``JAX_PLATFORMS``, ``jax_platforms``), no TPU chip is on the PCI bus and no
    other accelerator plugin is installed, JAX would end up on its CPU backend anyway:
    the runtime asks for it directly. Compiling for a TPU target does not go through the
    local backends (``runtime/target`` builds its own deviceless topology).
    """
    import jax

    try:
        from jax._src import hardware_utils, xla_bridge

        if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or xla_bridge.backends_are_initialized():
            return
        if importlib.util.find_spec("libtpu") is None:
            return
        plugins = importlib.util.find_spec("jax_plugins")
        if plugins is not None and any(True for _ in pkgutil.iter_modules(plugins.submodule_search_locations)):
            return  # a GPU plugin, say: JAX's own choice stands
        if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
            return
    except (ImportError, AttributeError, OSError):  # another jax layout: leave JAX's default
        return
    jax.config.update("jax_platforms", "cpu")
