"""A compiled classifier and a compiled optimizer step (capturable AdamW, lr held in a tensor) under a
cosine LR schedule: the scheduler wraps opt.step to count calls, and the step stays one program.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
cmodel = torch.compile(model, backend="tpu_debug")
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(3e-4), capturable=True)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)


@torch.compile(backend="tpu_debug")
def opt_step():
    opt.step()


x = torch.randn(16, 32).to("tpu")
y = torch.randint(0, 4, (16,)).to("tpu")
for epoch in range(8):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(cmodel(x), y)
    loss.backward()
    opt_step()
    sched.step()
print("final loss", loss.item())
