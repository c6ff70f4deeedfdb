"""Train a small classifier and count correct predictions on the device, reading the running
accuracy every 5 steps and at the end.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
features = torch.randn(12, 32, 20)
targets = torch.randint(0, 5, (12, 32))
correct = torch.zeros((), dtype=torch.long, device="tpu")
seen = 0
for step in range(12):
    x, y = features[step].to("tpu"), targets[step].to("tpu")
    opt.zero_grad()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    opt.step()
    correct += (logits.argmax(dim=1) == y).sum()
    seen += y.numel()
    if step % 5 == 4:
        print(f"step {step} running accuracy {correct.item() / seen:.3f}")
print(f"train accuracy {correct.item() / seen:.3f}")
