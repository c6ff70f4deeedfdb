"""Planted: token classification that drops padding with a boolean mask (`logits[labels != -100]`):
the result's size depends on the data, so every step waits for the device to count the mask and
then meets a new shape. Fix: keep the shape and use ignore_index=-100 in the loss.
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 5)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    tokens = torch.randint(0, 30, (4, 12))
    labels = torch.randint(0, 5, (4, 12))
    labels[:, 12 - (step % 5) - 2:] = -100  # padding at the end, a different amount each batch
    tokens, labels = tokens.to("tpu"), labels.to("tpu")
    logits = model(tokens)
    keep = labels != -100
    loss = F.cross_entropy(logits[keep], labels[keep])  # EXPECT: implicit_sync
    opt.zero_grad()
    loss.backward()
    opt.step()
