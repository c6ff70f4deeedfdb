"""Planted: text generation with a tiny Llama (random weights) and the default dynamic KV cache: the
cache and the inputs grow by one token per step, so every decoding step recompiles. Fix:
cache_implementation="static" (and fixed prompt lengths).
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).to("tpu").eval()
prompt = torch.randint(0, 128, (1, 6)).to("tpu")
out = model.generate(prompt, max_new_tokens=8, do_sample=False)  # EXPECT: dynamic_shape
print(out.shape)
