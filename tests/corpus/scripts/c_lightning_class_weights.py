"""A LightningModule-style classifier (training_step, configure_optimizers, a small fit loop
standing in for the Trainer) whose class weights are a buffer, moved to the device with the
module once.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn


class LitClassifier(nn.Module):
    def __init__(self, class_weights=(1.0, 2.0, 0.5, 1.5)):
        super().__init__()
        self.register_buffer("class_weights", torch.tensor(class_weights))
        self.model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, len(class_weights)))

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y, weight=self.class_weights)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


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
batches = [(torch.randn(16, 20), torch.randint(0, 4, (16,))) for _ in range(8)]
print("loss", fit(LitClassifier(), batches, torch.device("tpu")).item())
