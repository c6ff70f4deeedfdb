"""A small float32 CNN classifier trained under TPU numerics with the divergence check: the
convolutions and matmuls differ from CPU's float32 only within bfloat16's precision.
# corpus: correct
# corpus-options: --numerics tpu --divergence
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
images, labels = torch.randn(4, 8, 3, 16, 16), torch.randint(0, 10, (4, 8))
for step in range(4):
    x, y = images[step].to("tpu"), labels[step].to("tpu")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print("loss", loss.item())
