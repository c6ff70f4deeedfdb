"""Reading from the user's code whether an uploaded tensor was made on the host by a factory
(tracers/recording/host_origin.py): what it reads as host-made, and what it leaves alone."""

from __future__ import annotations

import dis
import linecache
import textwrap

import pytest
from tpu_debug.tracers.recording.host_origin import upload_origin

SOURCE = textwrap.dedent(
    """
    import numpy as np
    import torch

    def step(data, i, dev, p):
        a = torch.randn(16, 32).to(dev)
        noise = torch.randn(16, 32)
        b = noise.to(dev)
        keep = torch.rand(16) < p
        c = keep.to(dev)
        d = data[i].to(dev)
        e = torch.from_numpy(np.random.rand(16)).to(dev)
        f = (data[i] + 0.1 * torch.randn(16)).to(dev)
        g = torch.arange(16).unsqueeze(0).to(dev)
        h = torch.randn(16, device=dev).to(dev)
        out = torch.empty(16, device=dev)
        out.copy_(torch.randint(0, 10, (16,)))
        k = torch.tensor(np.random.rand(4), device=dev)
        scaled = noise * 2
        m = scaled.float().to(dev)
        return a, b, c, d, e, f, g, h, k, m
    """
)
# line (in SOURCE) -> what the upload on it reads as
EXPECTED = {
    6: "torch.randn",  # a factory's result moved at once
    8: "torch.randn",  # a name assigned from one two lines above
    10: "torch.rand",  # a mask: a comparison of a random draw with a number
    11: None,  # a slice of data made before the step: a batch, not made here
    12: "np.random.rand",  # NumPy's generator, through torch.from_numpy
    13: None,  # host data mixed with a draw: not made by the factory alone
    14: "torch.arange",  # a method chain on a factory's result
    15: None,  # made on the device already: the copy moves nothing new
    17: "torch.randint",  # copy_(src): the source is what moves
    18: "np.random.rand",  # torch.tensor(data, device=...)
    20: "torch.randn",  # through two assignments and a method
}


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    path = tmp_path_factory.mktemp("origin") / "user_step.py"
    path.write_text(SOURCE)
    linecache.checkcache(str(path))
    module = compile(SOURCE, str(path), "exec")
    return next(c for c in module.co_consts if getattr(c, "co_name", "") == "step")


def _upload_call(code, line: int) -> dis.Instruction:
    """The call instruction on ``line`` that moves data: the one spanning the most source."""
    calls = [i for i in dis.get_instructions(code) if i.opname.startswith("CALL") and i.positions.lineno == line]
    return max(calls, key=lambda i: (i.positions.end_col_offset - i.positions.col_offset))


@pytest.mark.parametrize("line", sorted(EXPECTED))
def test_the_origin_of_an_upload_is_read_from_the_users_line(code, line):
    ins = _upload_call(code, line)
    made = upload_origin(code, ins.offset, ins.positions)
    assert (made.factory if made is not None else None) == EXPECTED[line]


LOOPS = textwrap.dedent(
    """
    import torch

    def train(loader, model, dev, T):
        ids = torch.randint(0, 1000, (512, 16))
        labels = torch.randint(0, 4, (512,))
        for ids, labels in loader:
            a = ids.to(dev)
            b = labels.to(dev)
        table = torch.randn(64, 8)
        for step in range(10):
            c = table.to(dev)
            noise = torch.randn(16, 8)
            d = noise.to(dev)
            batch = {k: v.to(dev) for k, v in {"x": table}.items()}
            e = torch.randn(a.shape).to(a.device)
            t = torch.randint(0, T, (a.shape[0],))
            f = t.to(dev)
            g = torch.rand(16, 8).to(dev)
            x, y = model(a)
            h = y.to(dev)
    """
)
# line (in LOOPS) -> (factory, the tensor it follows, the line that made it)
LOOP_EXPECTED = {
    8: None,  # rebound by the loop: a DataLoader's batch, not the dataset drawn before it
    9: None,
    12: None,  # made once before the loop: the same data each step, not made in the step
    14: ("torch.randn", None, 13),  # made in the step, on the line above the upload
    15: None,  # a comprehension's own variable
    16: ("torch.randn", "a", 16),  # noise shaped like a device tensor, moved to its device
    18: ("torch.randint", "a", 17),  # timesteps, one per row of a
    19: ("torch.rand", None, 19),
    21: None,  # unpacked from a call the code does not show
}


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    path = tmp_path_factory.mktemp("origin") / "user_loop.py"
    path.write_text(LOOPS)
    linecache.checkcache(str(path))
    module = compile(LOOPS, str(path), "exec")
    return next(c for c in module.co_consts if getattr(c, "co_name", "") == "train")


@pytest.mark.parametrize("line", sorted(LOOP_EXPECTED))
def test_only_what_the_step_makes_is_host_made_and_what_it_follows_is_read(loops, line):
    calls = [i for i in dis.get_instructions(loops) if i.opname.startswith("CALL") and i.positions.lineno == line]
    if line == 15:  # the upload is inside the comprehension's own code
        inner = next(c for c in loops.co_consts if getattr(c, "co_name", "") == "<dictcomp>")
        calls = [i for i in dis.get_instructions(inner) if i.opname.startswith("CALL") and i.positions.lineno == line]
        code = inner
    else:
        code = loops
    ins = max(calls, key=lambda i: (i.positions.end_col_offset - i.positions.col_offset))
    made = upload_origin(code, ins.offset, ins.positions)
    assert (tuple(made) if made is not None else None) == LOOP_EXPECTED[line]


def test_a_file_whose_source_cannot_be_read_gives_no_verdict():
    code = compile("import torch\nx = torch.randn(3).to('cpu')\n", "/nonexistent/gone.py", "exec")
    ins = _upload_call(code, 2)
    assert upload_origin(code, ins.offset, ins.positions) is None
