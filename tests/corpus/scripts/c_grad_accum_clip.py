"""Gradient accumulation over 4 micro-batches with gradient clipping and AdamW.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
accum = 4
xs = torch.randn(6 * accum, 16, 32)
ys = torch.randn(6 * accum, 16, 1)
for i in range(6 * accum):
    x, y = xs[i].to("tpu"), ys[i].to("tpu")
    loss = nn.functional.mse_loss(model(x), y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
print("done")
