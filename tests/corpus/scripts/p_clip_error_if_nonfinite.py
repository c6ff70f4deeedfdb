"""Planted: gradient clipping asked to raise on a non-finite norm at every step. The check reads the
total norm back to the host inside clip_grad_norm_, so each step waits for the device there; the
argument is the user's, and dropping it (or checking the returned norm less often) is the fix.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 32).to("tpu")
y = torch.randn(64, 1).to("tpu")
for step in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  # EXPECT: implicit_sync
    opt.step()
print("done")
