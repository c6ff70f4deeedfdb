"""Planted: a compiled model called with a batch size that changes every step (the last partial
batches of shuffled shards): dynamo recompiles for each new size. Fix: drop_last / pad the batch.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 40), nn.ReLU(), nn.Linear(40, 2)).to("tpu")
cmodel = torch.compile(model, backend="tpu_debug", dynamic=False)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for batch in [32, 17, 25, 9, 30, 12, 21, 28]:
    x = torch.randn(batch, 20).to("tpu")
    y = torch.randint(0, 2, (batch,)).to("tpu")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(cmodel(x), y)  # EXPECT: dynamic_shape
    loss.backward()
    opt.step()
