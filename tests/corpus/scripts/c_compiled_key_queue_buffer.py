"""A contrastive encoder (MoCo-style) whose compiled forward keeps the last keys in a
preallocated buffer written at a pointer that wraps around: the same shapes at every step.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
QUEUE, BATCH, DIM = 16, 8, 16


class Contrast(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, DIM))
        self.register_buffer("queue", F.normalize(torch.randn(QUEUE * BATCH, DIM), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, q_in, k_in):
        q = F.normalize(self.encoder(q_in), dim=1)
        with torch.no_grad():
            k = F.normalize(self.encoder(k_in), dim=1)
        pos = (q * k).sum(1, keepdim=True)
        neg = q @ self.queue.clone().T  # a copy: the buffer is written below, the product needs it for backward
        with torch.no_grad():
            rows = (self.ptr * BATCH + torch.arange(BATCH, device=q.device)) % (QUEUE * BATCH)
            self.queue.index_copy_(0, rows, k)
            self.ptr.copy_((self.ptr + 1) % QUEUE)
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
