"""A bfloat16 model and data (model.to(torch.bfloat16)), the TPU's native matmul type.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("tpu", torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(5, 32, 64, dtype=torch.bfloat16)
for i in range(5):
    x = data[i].to("tpu")
    opt.zero_grad()
    loss = (model(x).float() - x.float()).pow(2).mean()
    loss.backward()
    opt.step()
print("loss", loss.item())
