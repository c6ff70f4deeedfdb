"""A small CNN trained with bfloat16 autocast (float32 weights and optimizer), the usual
mixed-precision loop on a TPU; loss logged every 4 steps.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.randn(8, 4, 3, 16, 16)
labels = torch.randint(0, 10, (8, 4))
for step in range(8):
    x, y = images[step].to("tpu"), labels[step].to("tpu")
    opt.zero_grad()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step % 4 == 3:
        print(f"step {step} loss {loss.item():.4f}")
