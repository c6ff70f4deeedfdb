"""Train, then save a checkpoint of model and optimizer state (moved to the host once, at the end).
# corpus: correct
"""
import io

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 4).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 16).to("tpu"), torch.randn(32, 4).to("tpu")
for _ in range(5):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
buffer = io.BytesIO()
state = {"model": {k: v.cpu() for k, v in model.state_dict().items()}}
torch.save(state, buffer)
print("saved", len(buffer.getvalue()), "bytes")
