"""Fine-tune a tiny BERT classifier built from a config with random weights for a few AdamW steps
with a linear-warmup lambda scheduler. A correct program."""

# corpus: correct
import torch
from transformers import BertConfig, BertForSequenceClassification

import tpu_debug  # noqa: F401

torch.manual_seed(0)
cfg = BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    num_labels=2,
)
model = BertForSequenceClassification(cfg).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
ids = torch.randint(0, 100, (4, 16)).to("tpu")
labels = torch.randint(0, 2, (4,)).to("tpu")
for step in range(4):
    opt.zero_grad()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    sched.step()
print(loss.item())
