"""Planted: a LightningModule-style regressor whose on_before_optimizer_step hook computes the
gradient norm and skips the step when it is not finite, with a Python `if` on the tensor: the
host waits for the device at every step.
Fix: clip with torch.nn.utils.clip_grad_norm_ (its norm stays on the device) and log it from
time to time; or torch.where on the device.
"""
import torch
import torch.nn.functional as F
from torch import nn


class LitRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.smooth_l1_loss(self.net(x), y)

    def on_before_optimizer_step(self, optimizer):
        norm = torch.stack([p.grad.norm() for p in self.parameters()]).norm()
        if not torch.isfinite(norm):  # EXPECT: implicit_sync
            optimizer.zero_grad()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def fit(module, batches, device):
    module.to(device).train()
    optimizer = module.configure_optimizers()
    for batch_idx, batch in enumerate(batches):
        batch = [t.to(device) for t in batch]
        loss = module.training_step(batch, batch_idx)
        optimizer.zero_grad()
        loss.backward()
        module.on_before_optimizer_step(optimizer)
        optimizer.step()
    return loss


torch.manual_seed(0)
batches = [(torch.randn(32, 12), torch.randn(32, 1)) for _ in range(8)]
print("loss", fit(LitRegressor(), batches, torch.device("tpu")).item())
