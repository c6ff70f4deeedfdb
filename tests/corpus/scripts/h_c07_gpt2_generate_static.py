"""Build a tiny GPT-2 from a config with random weights on the tpu device and generate 6 tokens
greedily with a static cache. A correct program."""

# corpus: correct
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import tpu_debug  # noqa: F401

torch.manual_seed(0)
cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(cfg).to("tpu").eval()
ids = torch.randint(0, 64, (1, 5)).to("tpu")
out = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static", pad_token_id=0)
print(out.cpu())
