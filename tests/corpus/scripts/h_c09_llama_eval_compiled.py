"""Run a tiny Llama built from a config with random weights, compiled with the tpu_debug backend,
over a few fixed-shape batches under no_grad, collecting logits on the device. A correct program."""

# corpus: correct
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tpu_debug  # noqa: F401

torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
model = LlamaForCausalLM(cfg).to("tpu").eval()
cmodel = torch.compile(model, backend="tpu_debug")
sums = []
with torch.no_grad():
    for _ in range(4):
        ids = torch.randint(0, 64, (2, 8)).to("tpu")
        sums.append(cmodel(input_ids=ids).logits.float().sum())
print(torch.stack(sums).cpu())
