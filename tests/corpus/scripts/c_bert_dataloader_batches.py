"""A BERT-style classifier trained on a synthetic dataset made once at start-up with
torch.randint, batched by a shuffling DataLoader, each batch copied with .to(device): the batch
is data, uploaded as every training loop uploads its data.
# corpus: correct
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, vocab=100, dim=32, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 2, 64, batch_first=True), 1)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids))[:, 0])


torch.manual_seed(0)
ids = torch.randint(0, 100, (96, 16))
labels = torch.randint(0, 3, (96,))
loader = DataLoader(TensorDataset(ids, labels), batch_size=16, shuffle=True, drop_last=True)
device = "tpu"
model = Classifier().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(2):
    for batch_ids, batch_labels in loader:
        batch_ids, batch_labels = batch_ids.to(device), batch_labels.to(device)
        loss = nn.functional.cross_entropy(model(batch_ids), batch_labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
print(loss.item())
