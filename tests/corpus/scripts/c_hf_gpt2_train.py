"""Fine-tuning a tiny GPT-2 (random weights from a config) on fixed-length batches.
# corpus: correct
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
batches = torch.randint(0, 128, (4, 4, 32))
for i in range(4):
    ids = batches[i].to("tpu")
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
print("loss", out.loss.item())
