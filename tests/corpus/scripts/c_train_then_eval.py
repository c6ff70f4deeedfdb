"""Train a few steps, then evaluate accuracy on a held-out set under no_grad, reading it once.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
train_x, train_y = torch.randn(8, 64, 10), torch.randint(0, 2, (8, 64))
for i in range(8):
    x, y = train_x[i].to("tpu"), train_y[i].to("tpu")
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

model.eval()
correct = torch.zeros((), device="tpu")
with torch.no_grad():
    for i in range(4):
        x, y = torch.randn(64, 10).to("tpu"), torch.randint(0, 2, (64,)).to("tpu")
        correct += (model(x).argmax(-1) == y).sum()
print("accuracy", correct.item() / 256)
