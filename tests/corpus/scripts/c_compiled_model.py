"""A compiled model (torch.compile with the tpu_debug backend) trained on fixed-shape batches.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(24, 96), nn.SiLU(), nn.Linear(96, 24)).to("tpu")
cmodel = torch.compile(model, backend="tpu_debug")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = torch.randn(6, 16, 24)
for i in range(6):
    x = batches[i].to("tpu")
    opt.zero_grad()
    loss = (cmodel(x) - x).square().mean()
    loss.backward()
    opt.step()
print(float(loss))
