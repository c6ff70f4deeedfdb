"""A small training loop for the fault-injection suite: a timestamped marker per step.

    python -m tpu_debug run --no-report --op-events train_steps.py [SECONDS]

It trains a small MLP on the ``tpu`` device for SECONDS (default 2) after its first
step, which compiles every op. Each step ends with ``.item()`` on the loss: a
device-to-host transfer the run records, the step's marker. The line
``step <i> <t>`` is printed once that transfer is done, with ``t`` =
``time.monotonic()`` taken just before it, so every printed marker is one the
traced process recorded. On Linux ``time.monotonic()`` is CLOCK_MONOTONIC, shared
by every process of the machine: the test compares it with its own clock.
"""

import sys
import time

import torch
from torch import nn

print(f"start {time.monotonic()!r}", flush=True)
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 16).to("tpu")
y = torch.randint(0, 4, (64,)).to("tpu")
i = 0
end = None
while end is None or time.monotonic() < end:
    i += 1
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    t = time.monotonic()
    loss.item()  # the marker: a recorded device-to-host transfer
    print(f"step {i} {t!r}", flush=True)
    if end is None:
        end = time.monotonic() + seconds
print(f"done {time.monotonic()!r}", flush=True)
