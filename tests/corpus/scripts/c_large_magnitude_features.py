"""Regression on raw, uncentred features near 1e5 (a sensor reading, a timestamp), checked against CPU.
The sums and normalizations over such values differ from CPU by float32 rounding of numbers that
large, as CPU float32 itself does from the exact result: no divergence.
# corpus: correct
# corpus-options: --divergence
"""
import torch
from torch import nn

torch.manual_seed(0)
norm = nn.LayerNorm(128).to("tpu")
head = nn.Linear(128, 1).to("tpu")
opt = torch.optim.SGD([*norm.parameters(), *head.parameters()], lr=1e-3)
for step in range(4):
    feats = (1e5 + 10 * torch.randn(32, 128)).to("tpu")
    centred = feats - feats.mean(dim=0, keepdim=True)
    total = feats.sum()
    pred = head(norm(feats)) + 1e-6 * centred.mean() + 0 * total
    loss = pred.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
