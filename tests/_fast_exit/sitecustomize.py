"""Imported at the start of every Python process the tests start (tests/conftest.py puts this
folder on their PYTHONPATH).

A process that has imported torch and jax spends about half a second of CPU at its end in
the interpreter's last garbage collection, walking every object the two libraries made; the
suite starts a few hundred such processes. ``gc.freeze()`` as the process's last exit
handler (registered first, so run last: after every flush a tracer or the program does at
exit) moves those objects out of the collector's reach, and the end is the ordinary module
teardown. A cycle with a finalizer left alive at that point keeps it unrun, as after
``os._exit``; none of the tests' programs depends on one.
"""

import atexit
import gc

atexit.register(gc.freeze)
