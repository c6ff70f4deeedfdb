"""A tiny next-token language model (embedding, MLP, tied head) on fixed-length sequences.
# corpus: correct
"""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, SEQ = 100, 32, 16


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + self.mlp(h)
        return h @ self.emb.weight.t()


torch.manual_seed(0)
model = TinyLM().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
corpus = torch.randint(0, VOCAB, (6, 8, SEQ + 1))
for i in range(6):
    batch = corpus[i].to("tpu")
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
