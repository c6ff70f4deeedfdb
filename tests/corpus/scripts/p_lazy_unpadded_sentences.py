"""A sentence classifier trained in lazy fused mode on batches whose length is that of their
longest sentence: each new length is a new fused program, compiled again (or read back from the
compile cache, which makes it cheaper, not the same program).
Fix: pad every batch to one of a few bucket lengths (16, 32) and mask the padding.
# corpus-options: --eager-mode defer_and_fuse
"""
import torch
from torch import nn

torch.manual_seed(0)
vocab, classes = 100, 3
embed = nn.EmbeddingBag(vocab, 32, mode="mean").to("tpu")
head = nn.Linear(32, classes).to("tpu")
opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
lengths = [7, 12, 9, 15, 11, 14, 8, 13, 10, 6]
for step, length in enumerate(lengths):
    tokens = torch.randint(1, vocab, (8, length)).to("tpu")  # EXPECT: dynamic_shape
    labels = torch.randint(0, classes, (8,)).to("tpu")
    loss = nn.functional.cross_entropy(head(embed(tokens)), labels)  # EXPECT: dynamic_shape
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
