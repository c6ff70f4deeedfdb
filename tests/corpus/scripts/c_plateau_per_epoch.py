"""Training with norm clipping (no finiteness check) and ReduceLROnPlateau stepped once per epoch on a
validation loss, read once per epoch: the reads are the ones the program needs.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
batches = [(torch.randn(32, 32).to("tpu"), torch.randn(32, 1).to("tpu")) for _ in range(4)]
val_x, val_y = torch.randn(64, 32).to("tpu"), torch.randn(64, 1).to("tpu")
for epoch in range(4):
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
    with torch.no_grad():
        val = nn.functional.mse_loss(model(val_x), val_y)
    plateau.step(val)
    print(f"epoch {epoch} val {val.item():.4f}")
