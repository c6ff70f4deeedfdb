"""A sentence classifier trained in lazy fused mode on batches padded to a fixed length, the
padding masked out of the mean: one fused program for every step.
# corpus: correct
# corpus-options: --eager-mode defer_and_fuse
"""
import torch
from torch import nn

torch.manual_seed(0)
vocab, classes, width = 100, 3, 16
embed = nn.Embedding(vocab, 32, padding_idx=0).to("tpu")
head = nn.Linear(32, classes).to("tpu")
opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
lengths = [7, 12, 9, 15, 11, 14, 8, 13, 10, 6]
for step, length in enumerate(lengths):
    tokens = torch.zeros(8, width, dtype=torch.long)
    tokens[:, :length] = torch.randint(1, vocab, (8, length))
    tokens, labels = tokens.to("tpu"), torch.randint(0, classes, (8,)).to("tpu")
    mask = (tokens != 0).unsqueeze(-1).float()
    pooled = (embed(tokens) * mask).sum(1) / mask.sum(1)
    loss = nn.functional.cross_entropy(head(pooled), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
