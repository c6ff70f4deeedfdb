"""A compiled optimizer step with the learning rate held in a tensor (capturable AdamW), driven by a
LambdaLR: the idiom PyTorch documents for changing lr without recompiling.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 16).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), capturable=True)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.95 ** s)


@torch.compile(backend="tpu_debug")
def opt_step():
    opt.step()


x = torch.randn(8, 16).to("tpu")
for _ in range(6):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt_step()
    sched.step()
print("done")
