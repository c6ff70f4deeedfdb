"""A contrastive encoder (MoCo-style) whose compiled forward keeps the last keys in a Python
list: the list grows by one entry per step until it holds QUEUE batches, and dynamo guards on
its length, so every step compiles the forward again until dynamo gives up compiling it.
Fix: keep the queue in a preallocated tensor buffer (register_buffer) written at an index that
wraps around: one shape at every step."""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
QUEUE = 12


class Contrast(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.queue = []

    def forward(self, q_in, k_in):
        q = F.normalize(self.encoder(q_in), dim=1)
        with torch.no_grad():
            k = F.normalize(self.encoder(k_in), dim=1)
        pos = (q * k).sum(1, keepdim=True)
        self.queue.append(k)  # EXPECT: recompile
        if len(self.queue) > QUEUE:  # EXPECT: recompile
            self.queue.pop(0)
        neg = q @ torch.cat(self.queue).T
        logits = torch.cat([pos, neg], dim=1) / 0.07
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device))


model = Contrast().to("tpu")
step_fn = torch.compile(model, backend="tpu_debug")
opt = torch.optim.SGD(model.parameters(), lr=0.03)
data = torch.randn(24, 8, 32)
for step in range(24):
    x = data[step].to("tpu")
    loss = step_fn(x + 0.1 * torch.randn_like(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
