"""A LightningModule-style model compiled as Lightning users compile it
(self.model = torch.compile(self.model)), whose forward clamps its activations unconditionally:
one graph, nothing read back.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(24, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = h.clamp(-50.0, 50.0)
        return self.fc2(h)


class LitModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.compile(Encoder(), backend="tpu_debug")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(module, batches, device):
    module.to(device).train()
    optimizer = module.configure_optimizers()
    for batch_idx, batch in enumerate(batches):
        batch = [t.to(device) for t in batch]
        loss = module.training_step(batch, batch_idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss


torch.manual_seed(0)
batches = [(torch.randn(16, 24), torch.randn(16, 8)) for _ in range(8)]
print("loss", fit(LitModel(), batches, torch.device("tpu")).item())
