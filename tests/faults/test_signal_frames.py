"""Where a trace's SIGINT/SIGTERM handler raises and where it waits.

Raised while torch is inside a call into C++ (an op, the backward pass: torch asks for
pending handlers from there), the exception unwinds through that C++ and sometimes aborts
the process; the handler then lets the call return and acts on the signal again. In the
program's own code, and in a library's Python at a function's start or a loop's back edge
(where the interpreter itself runs handlers), it raises at once.
"""

from __future__ import annotations

import os

import torch

from tpu_debug.trace_signals import _unraisable


def _frame_in(filename: str, probe_at: str) -> object:
    """A frame of code compiled as if from ``filename``, captured while it calls out
    (``probe_at="call"``) or at a loop's back edge (``"loop"``)."""
    source = (
        "import sys\n"
        "def outer(capture):\n"
        "    return capture(sys._getframe())\n"
        "def looping(capture):\n"
        "    frames = []\n"
        "    for _ in range(2):\n"
        "        frames.append(sys._getframe())\n"
        "    return frames[0]\n"
    )
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    if probe_at == "call":
        return namespace["outer"](lambda frame: frame)
    return namespace["looping"](None)


TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "nn", "fake_module.py")
USER_FILE = os.path.join(os.getcwd(), "train.py")


def test_a_torch_frame_calling_out_waits():
    # the frame is suspended in its CALL: what torch calls there may be C++
    assert _unraisable(_frame_in(TORCH_FILE, "call"))


def test_the_programs_own_frame_raises():
    assert not _unraisable(_frame_in(USER_FILE, "call"))


def test_python_reached_from_a_tpu_debug_kernel_waits():
    # a kernel is called by the torch dispatcher (C++): anything it calls unwinds through it
    import tpu_debug.runtime

    kernel_file = os.path.join(os.path.dirname(tpu_debug.runtime.__file__), "fake_kernel.py")
    namespace: dict = {}
    exec(compile("import sys\ndef kernel(f):\n    return f()\n", kernel_file, "exec"), namespace)
    frame = namespace["kernel"](lambda: _frame_in(USER_FILE, "call"))
    assert frame.f_code.co_filename == USER_FILE  # the program's code, but called by a kernel
    assert _unraisable(frame)
