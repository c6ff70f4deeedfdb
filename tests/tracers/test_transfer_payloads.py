"""Host->device payload fingerprints, and the findings they make possible: the same data
uploaded at every step is found at any cost, a batch that changes never is, and a read at
a chosen cadence is not an implicit-sync finding."""

from __future__ import annotations

import sys
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tpu_debug.runtime import eager
from tpu_debug.tracers.advisor import transfer_rules as rules

import tpu_debug

STEPS = 6
MASK = np.triu(np.ones((256, 256), dtype=np.float32))  # 256 KiB, the same at every step


def _line(offset: int = 0) -> int:
    return sys._getframe(1).f_lineno + offset


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(256, 256).to("tpu")
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train_step(model, opt, x, mask) -> torch.Tensor:
    loss = (model(x) @ mask).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _of_kind(findings, kind: str) -> list:
    return [f for f in findings if f.kind == kind]


# -- the fingerprint -------------------------------------------------------------------


def test_a_payload_fingerprint_is_its_size_and_crc32():
    payload = np.arange(1000, dtype=np.float32)
    assert eager.payload_digest(payload) == f"4000:{zlib.crc32(payload.tobytes()):08x}"
    changed = payload.copy()
    changed[500] += 1
    assert eager.payload_digest(changed) != eager.payload_digest(payload)
    # a bfloat16 payload (an ml_dtypes array) is read as its bytes too
    bf16 = torch.ones(8, dtype=torch.bfloat16).view(torch.uint16).numpy()
    assert eager.payload_digest(bf16.view(eager.jnp.bfloat16)) == f"16:{zlib.crc32(bf16.tobytes()):08x}"


def test_a_payload_over_the_cap_gets_no_fingerprint(monkeypatch):
    monkeypatch.setattr(eager, "DIGEST_MAX_BYTES", 1024)
    assert eager.payload_digest(np.zeros(256, np.float32)) is not None  # exactly 1024 bytes
    assert eager.payload_digest(np.zeros(257, np.float32)) is None


def test_uploads_record_their_fingerprint_and_downloads_none(logdir):
    with tpu_debug.trace(logdir=logdir) as session:
        on_device = torch.from_numpy(MASK).to("tpu")
        on_device.cpu()
    up, down = session.events("transfer")
    assert (up.direction, up.digest) == ("h2d", f"{MASK.nbytes}:{zlib.crc32(MASK.tobytes()):08x}")
    assert (down.direction, down.digest) == ("d2h", None)


# -- the same data at every step ---------------------------------------------------------


@pytest.mark.parametrize("upload", ["from_numpy", "tensor"])
def test_the_same_numpy_mask_moved_at_every_step_is_found_at_its_line(logdir, upload):
    model, opt = _model()
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for _ in range(STEPS):
            x = torch.randn(8, 256).to("tpu")
            if upload == "from_numpy":
                mask = torch.from_numpy(MASK).to("tpu")
                line = _line(-1)
            else:
                mask = torch.tensor(MASK).to("tpu")
                line = _line(-1)
            _train_step(model, opt, x, mask)
    (finding,) = _of_kind(session.findings(), "h2d_every_step")
    assert (finding.cause, finding.evidence.location.file, finding.evidence.location.line) == (
        "same_data",
        __file__,
        line,
    )
    copies = finding.evidence.count("copies")
    # one upload per step, in every steady step (with cold caches the first step or two warm up)
    assert copies == finding.evidence.count("steady steps") and STEPS - 2 <= copies <= STEPS
    assert finding.evidence.count("bytes per step") == 256 * 256 * 4
    per_step = finding.evidence.count("time per step")
    assert per_step > 0 and per_step * copies == pytest.approx(finding.evidence.count("time"))
    assert finding.title.startswith(f".to() at test_transfer_payloads.py:{line} uploads the same 256.00 KiB")
    assert "create it once on the device before the loop" in finding.fix
    # the random batch uploaded beside it changes every step: it is no finding
    assert all(f.evidence.location.line == line for f in session.findings() if f.kind == "h2d_every_step")


def test_a_dataloader_whose_batches_differ_is_no_finding(logdir):
    model, opt = _model()
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(8 * STEPS, 256), torch.randint(0, 4, (8 * STEPS,)))
    mask = torch.from_numpy(MASK).to("tpu")
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for xb, yb in DataLoader(data, batch_size=8, shuffle=True):
            xb, yb = xb.to("tpu"), yb.to("tpu")
            _train_step(model, opt, xb + yb[:, None], mask)
    uploads = [t for t in session.events("transfer") if t.direction == "h2d"]
    assert len({t.digest for t in uploads}) == len(uploads)  # every batch is new data
    assert _of_kind(session.findings(), "h2d_every_step") == []


def test_the_same_data_too_large_to_fingerprint_is_not_called_the_same(logdir, monkeypatch):
    # over the cap the rule cannot know the data is the same, and a small share of the
    # step is no reason to flag a copy that may be a new batch
    monkeypatch.setattr(eager, "DIGEST_MAX_BYTES", 1024)
    model, opt = _model()
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for _ in range(STEPS):
            _train_step(model, opt, torch.ones(8, 256).to("tpu"), torch.from_numpy(MASK).to("tpu"))
    assert all(t.digest is None for t in session.events("transfer") if t.direction == "h2d")
    assert [f for f in session.findings() if f.cause == "same_data"] == []


# -- reads at a cadence ------------------------------------------------------------------


def _logged_every(logdir, every: int) -> tuple[list, int]:
    model, opt = _model()
    mask = torch.from_numpy(MASK).to("tpu")
    x = torch.randn(8, 256).to("tpu")
    seen = []
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for step in range(20):
            loss = _train_step(model, opt, x, mask)
            if step % every == 0:
                seen.append(loss.item())
                line = _line(-1)
    assert len(seen) == -(-20 // every)
    return session.findings(), line


def test_a_read_at_every_step_is_an_implicit_sync(logdir):
    findings, line = _logged_every(logdir, 1)
    (finding,) = _of_kind(findings, "implicit_sync")
    assert (finding.cause, finding.evidence.location.line) == ("item", line)
    assert "read it once, after the loop or every N steps" in finding.fix


@pytest.mark.parametrize("every", [2, 5])
def test_a_read_every_n_steps_is_logging_not_a_finding(logdir, every):
    findings, _ = _logged_every(logdir, every)
    assert _of_kind(findings, "implicit_sync") == []


def test_a_python_list_that_changes_every_step_is_new_data_not_a_finding(logdir):
    # torch.tensor(list, device=) of new values each step uploads what the step needs; a few
    # bytes are no measurable share of the step, and hoisting it would change the program
    model, opt = _model()
    mask = torch.from_numpy(MASK).to("tpu")
    x = torch.randn(8, 256).to("tpu")
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for step in range(STEPS):
            scale = torch.tensor([1.0 + step, 2.0 + step], device="tpu")
            _train_step(model, opt, x * scale[0], mask)
    assert _of_kind(session.findings(), "h2d_every_step") == []


def _steady(*seconds: float, target=None, on_target: dict | None = None) -> SimpleNamespace:
    """The facts the upload rule weighs: steady steps of ``seconds``, and a TPU target with the
    steps' estimated time on it (``on_target``, by step index)."""
    return SimpleNamespace(steady=[SimpleNamespace(seconds=s) for s in seconds], target=target,
                           target_seconds=on_target or {})


def _upload(per_step: float, seconds: float, steps: list, payload: str, aval: str = "float32[256,1024]",
            origin: str | None = None) -> rules._Upload:
    return rules._Upload("to", None, aval, per_step, seconds, tuple(steps), payload, origin)


def test_a_large_upload_of_new_data_is_told_to_overlap_not_to_move_out_of_the_loop():
    # 3 steps of 10 ms, 4 ms of each copying a 1 MiB batch: 40 % of the step, on this machine
    facts, steps = _steady(0.01, 0.01, 0.01), [1, 2, 3]
    title, fix = rules._h2d_text(_upload(float(1 << 20), 0.012, steps, "new"), facts, True)
    assert title == (
        ".to() at an unknown line copies 1.00 MiB (float32[256,1024]) to the device in 3 steady steps, 40% of their "
        "time on this machine (no TPU target: run with --target to weigh it on a TPU)"
    )
    assert fix.startswith("the data changes at every step (a batch): overlap the copy with the step")
    assert "before the loop" not in fix
    # without fingerprints (too large to take) both causes stay possible, and the fix names both
    _title, fix = rules._h2d_text(_upload(float(1 << 20), 0.012, steps, "unknown"), facts, True)
    assert fix.startswith("if the data is the same every step, move it to the device once, before the loop")
    assert "pin_memory=True" in fix
    # the same data: hoisting is the fix, whatever the share
    title, fix = rules._h2d_text(_upload(16.0, 3e-5, steps, "same", "float32[4]"), facts, True)
    assert (
        title
        == ".to() at an unknown line uploads the same 16 B (float32[4]) to the device in 3 of 3 steady steps, 10.0 µs per step"
    )
    assert fix.startswith("the data is identical at every step: create it once on the device before the loop")


def test_a_batch_upload_is_weighed_on_the_tpu_target_when_the_run_has_one():
    from tpu_debug.runtime.target.hardware import parse_target

    v5e, steps = parse_target("v5e"), [1, 2, 3]
    batch = _upload(float(1 << 20), 0.001, steps, "new")  # 1 ms of a 10 ms step here: 10 %
    # on a v5e the 1 MiB crosses its 1.5e10 B/s host link in 70 us, and the step's programs take
    # 100 us: the copy is 70 % of the TPU's step, a finding this machine's 10 % would not make
    fast = _steady(0.01, 0.01, 0.01, target=v5e, on_target={1: 1e-4, 2: 1e-4, 3: 1e-4})
    title, _fix = rules._h2d_text(batch, fast, True)
    share = 100 * 3 * (1 << 20) / v5e.host_bandwidth_per_device / 3e-4
    assert f", {share:.0f}% of their time on a v5e (estimated: its host link" in title
    assert rules._h2d_text(batch, _steady(0.01, 0.01, 0.01), True) is None
    # a TPU step of 10 ms takes the copy in stride
    slow = _steady(0.01, 0.01, 0.01, target=v5e, on_target={1: 0.01, 2: 0.01, 3: 0.01})
    assert rules._h2d_text(batch, slow, True) is None
    # a step the target has no estimate for is weighed here, and says so
    unknown = _steady(0.0012, 0.0012, 0.0012, target=v5e, on_target={1: 1e-4})
    assert "on this machine" in rules._h2d_text(batch, unknown, True)[0]


def test_every_generation_knows_its_host_link():
    from tpu_debug.runtime.target.hardware import GENERATIONS, parse_target

    assert all(g.host_bandwidth > 0 for g in GENERATIONS.values())
    # a v4 chip's two TensorCores are two devices sharing its link
    assert parse_target("v4-8").host_bandwidth_per_device == GENERATIONS["v4"].host_bandwidth / 2


def _host_noise(logdir, with_batch: bool) -> tuple[list, int, list]:
    model, opt = _model()
    data, mask = torch.randn(STEPS, 8, 256), torch.from_numpy(MASK).to("tpu")
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for step in range(STEPS):
            x = data[step].to("tpu") if with_batch else torch.randn(8, 256).to("tpu")
            noise = torch.randn(8, 256)
            noisy = x + 0.1 * noise.to("tpu")
            line = _line(-1)
            _train_step(model, opt, noisy, mask)
    return session.findings(), line, [t for t in session.events("transfer") if t.direction == "h2d"]


def test_noise_drawn_on_the_host_beside_a_batch_is_found_with_make_it_on_the_device(logdir):
    findings, line, uploads = _host_noise(logdir, with_batch=True)
    (finding,) = _of_kind(findings, "h2d_every_step")
    # the finding stands at the line that drew the noise, the line above its upload
    made = line - 1
    assert (finding.cause, finding.evidence.location.line) == ("host_made", made)
    assert finding.title.startswith(f"torch.randn(...) at test_transfer_payloads.py:{made} draws float32[8,256] on the host")
    assert f"copied at test_transfer_payloads.py:{line}" in " ".join(finding.evidence.facts), finding.evidence.facts
    assert finding.fix.startswith("make it on the device, where it is used: torch.randn(..., device=x.device)")
    assert "made on the host by torch.randn" in finding.evidence.facts[0]
    assert {t.origin for t in uploads} == {None, "torch.randn"}  # the batch is a slice of data


def test_a_step_whose_every_upload_a_factory_made_is_a_stand_in_for_data_not_a_finding(logdir):
    # synthetic batches (x drawn on the host at every step): the program's data source, not
    # noise beside its data
    findings, _, uploads = _host_noise(logdir, with_batch=False)
    assert _of_kind(findings, "h2d_every_step") == []
    assert {t.origin for t in uploads} == {"torch.randn"}  # both lines read as made on the host


# -- copies to the host ------------------------------------------------------------------


def _copied_back_every(logdir, every: int) -> tuple[list, int]:
    model, opt = _model()
    x = torch.randn(8, 256).to("tpu")
    mask = torch.from_numpy(MASK).to("tpu")
    seen = []
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        for step in range(12):
            loss = _train_step(model, opt, x, mask)
            if step % every == 0:
                seen.append(loss.detach().cpu())
                line = _line(-1)
    return session.findings(), line


def test_a_copy_to_the_host_at_every_step_is_a_finding_with_a_fix_that_stays_on_the_device(logdir):
    findings, line = _copied_back_every(logdir, 1)
    (finding,) = _of_kind(findings, "d2h_every_step")
    assert (finding.severity, finding.cause, finding.evidence.location.line) == ("warning", "cpu", line)
    assert finding.title.startswith(f".cpu() at test_transfer_payloads.py:{line} copies 4 B (float32[]) to the host in ")
    assert "each copy waits for the device to finish the work queued before it" in finding.title
    assert finding.fix.startswith("keep the work on the device: accumulate what the host reads in a device tensor")
    assert finding.evidence.count("copies") == finding.evidence.count("steady steps") >= 2
    assert finding.cost_seconds == pytest.approx(finding.evidence.count("time"))


def test_a_copy_to_the_host_every_n_steps_is_what_the_fix_asks_for(logdir):
    findings, _ = _copied_back_every(logdir, 3)
    assert _of_kind(findings, "d2h_every_step") == []
