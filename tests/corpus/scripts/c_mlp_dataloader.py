"""An MLP classifier trained from a DataLoader over a TensorDataset, the usual way.
# corpus: correct
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("tpu")
data = TensorDataset(torch.randn(256, 20), torch.randint(0, 3, (256,)))
loader = DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(2):
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
print("final loss", loss.item())
