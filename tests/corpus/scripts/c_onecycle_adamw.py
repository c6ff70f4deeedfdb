"""AdamW with a OneCycleLR schedule stepped every batch, in eager mode.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 8
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
xs, ys = torch.randn(steps, 32, 12), torch.randn(steps, 32, 1)
for i in range(steps):
    x, y = xs[i].to("tpu"), ys[i].to("tpu")
    opt.zero_grad()
    nn.functional.smooth_l1_loss(model(x), y).backward()
    opt.step()
    sched.step()
print("lr", sched.get_last_lr())
