"""A LightningModule-style regressor whose on_before_optimizer_step hook clips the gradients
with clip_grad_norm_ (the norm stays on the device) and keeps the norms for the end of the run.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn


class LitRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 1))
        self.grad_norms = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.smooth_l1_loss(self.net(x), y)

    def on_before_optimizer_step(self, optimizer):
        self.grad_norms.append(torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm=1.0))

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
module = LitRegressor()
print("loss", fit(module, batches, torch.device("tpu")).item())
print("max grad norm", torch.stack(module.grad_norms).max().item())
