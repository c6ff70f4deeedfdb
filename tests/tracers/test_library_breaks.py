"""Graph breaks and syncs pinned to the user's line: a break inside library code (an installed
package, torch's optimizer and LR scheduler) points at the user line that reached it and says
the cause is library code; PyTorch's deliberate breaks that cost nothing are not findings."""

from __future__ import annotations

import inspect

import pytest
import torch
from source_helpers import installed, line_of
from torch import nn

import tpu_debug

pytestmark = pytest.mark.usefixtures("forget_graphs")


_DEPRECATION = """
    import functools


    def deprecate_kwarg(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            print("deprecated call")  # the library's line dynamo cannot trace
            return fn(*args, **kwargs)

        return wrapped
"""


def test_a_break_in_an_installed_package_points_at_the_users_line(tmp_path):
    lib = installed(tmp_path, "fakehub_utils", _DEPRECATION)
    model = nn.Linear(16, 16).to("tpu")

    @lib.deprecate_kwarg
    def head(h):
        return h.relu()

    def step(x):
        h = model(x)
        return head(h).sum()  # reaches the library

    compiled = tpu_debug.compile(step)
    xs = [torch.randn(4, 16).to("tpu") for _ in range(6)]
    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        for x in xs:
            compiled(x)
            tpu_debug.step()
    user_line = line_of(step, "# reaches the library")
    breaks = session.recompiles.graph_breaks()
    assert breaks, "dynamo broke the graph at the library's print"
    for brk in breaks:
        assert (brk.location.file, brk.location.line) == (__file__, user_line)
        assert brk.context.startswith(lib.__file__ + ":8 in ") and not brk.deliberate
    (finding,) = [f for f in session.findings() if f.kind == "graph_break"]
    assert finding.cause == "library"
    assert (finding.evidence.location.file, finding.evidence.location.line) == (__file__, user_line)
    assert "inside library code (__init__.py:8 in " in finding.title
    assert finding.fix.startswith("the break is in library code (__init__.py:8 in ")


def test_the_optimizers_deliberate_break_is_no_finding(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    @tpu_debug.compile
    def train_step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss.detach()

    opt_step = tpu_debug.compile(opt.step)

    def loop():
        for _ in range(6):
            train_step(torch.randn(4, 8, device="tpu"), torch.randn(4, 1, device="tpu"))
            opt_step()  # the compiled optimizer step
            opt.zero_grad(set_to_none=False)

    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        loop()
    breaks = session.recompiles.graph_breaks()
    # torch/optim/optimizer.py calls torch._dynamo.graph_break() on purpose around the
    # grad-mode switch; that break is recorded, at the user's call, and is not a finding
    assert breaks and all(b.deliberate for b in breaks), [(b.context, b.reason) for b in breaks]
    assert all(b.context.split(":")[0].endswith("torch/optim/optimizer.py") for b in breaks)
    call = (__file__, line_of(loop, "# the compiled"))
    assert {(b.location.file, b.location.line) for b in breaks} == {call}
    assert [f for f in session.findings() if f.kind == "graph_break"] == []


def _scheduled_run(tmp_path, scheduler: bool):
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), capturable=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if scheduler else None

    @tpu_debug.compile
    def train_step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss.detach()

    opt_step = tpu_debug.compile(opt.step)  # with a scheduler: its counting wrapper of opt.step

    def loop():
        for _ in range(8):
            train_step(torch.randn(4, 8, device="tpu"), torch.randn(4, 1, device="tpu"))
            opt_step()  # the compiled step
            opt.zero_grad(set_to_none=False)
            if sched is not None:
                sched.step()

    with tpu_debug.trace(logdir=tmp_path / f"runs{int(scheduler)}", hlo=False) as session:
        loop()
    return session, (__file__, line_of(loop, "# the compiled step"))


def test_a_scheduler_wrapped_compiled_optimizer_step_is_still_one_program_and_no_finding(tmp_path):
    # lr_scheduler.py wraps opt.step to count calls and dynamo skips that file on purpose: the
    # break falls on the wrapper, and the optimizer's own step compiles as a frame of its own
    session, call = _scheduled_run(tmp_path, scheduler=True)
    plain, _ = _scheduled_run(tmp_path, scheduler=False)
    breaks = session.recompiles.graph_breaks()
    assert breaks and all(b.deliberate for b in breaks), [(b.context, b.reason) for b in breaks]
    assert any("lr_scheduler.py" in b.reason for b in breaks)
    assert {(b.location.file, b.location.line) for b in breaks} == {call}
    assert [f for f in session.findings() if f.severity != "info"] == []
    # the same programs per step as without the scheduler, the optimizer's one of them, run once a step
    assert [s.graph_runs for s in session.steps()] == [s.graph_runs for s in plain.steps()] == [2] * 8
    optimizer = [c.name for c in session.compiles() if "in optimizer.py:" in c.identity and c.identity.endswith(" (forward)")]
    assert len(optimizer) == 1
    assert [o.count for o in session.ops() if o.name == optimizer[0]] == [8]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        print("hidden mean", h.mean())  # the print
        return self.fc2(h)


def test_a_print_inside_a_compiled_forward_is_pinned_to_the_print(tmp_path, capsys):
    model = _Net().to("tpu")
    fast = torch.compile(model, backend="tpu_debug")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        for _ in range(6):
            fast(torch.randn(8, 16, device="tpu")).square().mean().backward()
            opt.step()
            opt.zero_grad()
    printed = (__file__, line_of(_Net.forward, "# the print"))
    # one cause, one finding: the print splits the graph, and the read it makes of h.mean() is a
    # consequence under that finding, at the same line
    (brk,) = [f for f in session.findings() if f.kind == "graph_break"]
    assert not [f for f in session.findings() if f.kind == "implicit_sync"]
    assert (brk.evidence.location.file, brk.evidence.location.line) == printed
    assert brk.cause == "graph_break"  # the user's own line: no library context
    (sync,) = [c for c in brk.consequences if c.kind == "implicit_sync"]
    assert (sync.location.file, sync.location.line) == printed and "print" in sync.text, sync


def _payload(where: str, title: str, explanation: str, frames: list[tuple[str, int, str]]) -> str:
    """Dynamo's graph-break text, in the form its structured trace logs it."""
    tb = "".join(f'  File "{f}", line {n}, in {fn}\n    code\n' for f, n, fn in frames)
    return (
        f"Graph break in user code at {where}\nGraph Break Reason: {title}\n  Explanation: {explanation}\n"
        f"  Hint: none\n\nUser code traceback:\n{tb}\nTraceback (most recent call last):\n  ...\n"
    )


def test_dynamos_traceback_gives_the_user_line_and_the_library_frame(tmp_path):
    from tpu_debug.tracers.recording.dynamo_events import _parse_graph_break

    deprecation = str(tmp_path / "venv/lib/python3.11/site-packages/transformers/utils/deprecation.py")
    user = "/home/me/train.py"
    frames = [(user, 40, "<module>"), (user, 12, "step"), (deprecation, 172, "wrapped_func")]
    brk = _parse_graph_break(
        _payload(f"{deprecation}:172", "Failed to trace builtin operator", "print", frames), None
    )
    assert (brk.location.file, brk.location.line, brk.location.function) == (user, 12, "step")
    assert (brk.context.file, brk.context.line) == (deprecation, 172) and not brk.deliberate
    assert brk.reason == "Failed to trace builtin operator: print"

    optimizer = inspect.getfile(torch.optim.Optimizer)  # torch/optim/optimizer.py
    deliberate = ("Call to `torch._dynamo.graph_break()`", "User-inserted graph break.")
    frames = [(user, 40, "<module>"), (optimizer, 79, "_use_grad")]
    brk = _parse_graph_break(
        _payload(f"{optimizer}:79", *deliberate, frames), None
    )
    assert (brk.location.file, brk.location.line) == (user, 40)
    assert brk.context.file == optimizer and brk.deliberate

    # the same call in the user's own code is the user's break, and a finding's business
    frames = [(user, 40, "<module>"), (user, 12, "step")]
    brk = _parse_graph_break(
        _payload(f"{user}:12", *deliberate, frames), None
    )
    assert (brk.location.line, brk.context, brk.deliberate) == (12, None, False)


def test_disabled_torch_code_that_runs_ops_is_not_deliberate():
    # an optimizer's math disabled for dynamo (not capturable) runs eagerly: a real cost
    from tpu_debug.tracers.recording.dynamo_events import _parse_graph_break

    adam = inspect.getfile(torch.optim.Adam)  # torch/optim/adam.py
    frames = [("/home/me/train.py", 40, "<module>"), (adam, 247, "step")]
    title = "Skip inlining `torch.compiler.disable()`d function"
    brk = _parse_graph_break(_payload(f"{adam}:247", title, "adam", frames), None)
    assert (brk.location.line, brk.context.file, brk.deliberate) == (40, adam, False)


def test_only_the_lr_schedulers_skipped_wrapper_is_deliberate():
    from tpu_debug.tracers.recording.dynamo_events import _parse_graph_break

    scheduler = inspect.getfile(torch.optim.lr_scheduler)
    other = "/home/me/venv/lib/python3.11/site-packages/somelib/hooks.py"
    title = "Attempted to call function marked as skipped"
    frames = [("/home/me/train.py", 40, "<module>")]
    for path, deliberate in ((scheduler, True), (other, False)):
        why = f"Dynamo developers have intentionally marked that the function `step` in file `{path}` should"
        brk = _parse_graph_break(_payload("/home/me/train.py:40", title, why, frames), None)
        assert brk.deliberate is deliberate, path


def test_a_library_read_the_users_argument_or_cadence_asks_for_is_a_warning_at_the_users_call(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(16, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2)
    x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 1).to("tpu")

    def loop():
        for _ in range(8):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  # the clip
            opt.step()
            plateau.step(loss)  # the plateau
            tpu_debug.step()

    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        loop()
    syncs = {f.evidence.location.line: f for f in session.findings() if f.kind == "implicit_sync"}
    clip, plateau_line = line_of(loop, "# the clip"), line_of(loop, "# the plateau")
    assert set(syncs) == {clip, plateau_line}, list(syncs)
    assert syncs[clip].severity == syncs[plateau_line].severity == "warning"
    assert (syncs[clip].cause, syncs[plateau_line].cause) == ("argument", "cadence")
    assert syncs[clip].fix.startswith("drop error_if_nonfinite=True")
    assert syncs[plateau_line].fix.startswith("call it once per epoch with a validation metric")
    assert all(f.evidence.location.file == __file__ for f in syncs.values())


def test_a_library_read_nobody_asked_for_stays_the_librarys():
    from tpu_debug.tracers.reading.transfer_causes import user_caused

    root = "/venv/lib/python3.11/site-packages/torch/"
    assert user_caused(root + "nn/utils/clip_grad.py:109 in _get_total_norm").cause == "argument"
    assert user_caused(root + "optim/lr_scheduler.py:1699 in ReduceLROnPlateau.step").cause == "cadence"
    # torch.distributions' argument checks: on by default, switched off by validate_args=False
    for frame in ("distributions/distribution.py:76 in Distribution.__init__",
                  "distributions/distribution.py:323 in Distribution._validate_sample"):
        read = user_caused(root + frame)
        assert read.cause == "validation" and "validate_args=False" in read.fix
        assert "Distribution.set_default_validate_args(False)" in read.fix
    generate = "/venv/lib/python3.11/site-packages/transformers/generation/utils.py:2500 in _sample"
    assert user_caused(generate) is None
    assert user_caused(None) is None
