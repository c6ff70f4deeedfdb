"""Train a small classifier and count correct predictions on the host at every step: each
.cpu() waits for the device to finish the step before the next one can be queued.
Fix: count on the device (correct += (pred == y).sum()) and read the count every N steps or
once per epoch."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
features = torch.randn(12, 32, 20)
targets = torch.randint(0, 5, (12, 32))
correct = total = 0
for step in range(12):
    x, y = features[step].to("tpu"), targets[step]
    opt.zero_grad()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y.to("tpu"))
    loss.backward()
    opt.step()
    pred = logits.argmax(dim=1).cpu()  # EXPECT: d2h_every_step
    correct += (pred == y).sum().item()
    total += y.numel()
print(f"train accuracy {correct / total:.3f}")
