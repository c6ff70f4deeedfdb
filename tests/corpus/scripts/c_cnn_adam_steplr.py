"""A small CNN on random images with Adam and a StepLR schedule (eager: the lr is read on the host).
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


torch.manual_seed(0)
model = Net().to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
images = torch.randn(6, 4, 3, 32, 32)
labels = torch.randint(0, 10, (6, 4))
for step in range(6):
    x, y = images[step].to("tpu"), labels[step].to("tpu")
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
print(f"loss {loss.item():.3f}")
