"""Batched inference with a tiny BERT classifier (random weights) on padded, fixed-length inputs.
# corpus: correct
"""
import torch
from transformers import BertConfig, BertForSequenceClassification

torch.manual_seed(0)
config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=3)
model = BertForSequenceClassification(config).to("tpu").eval()
predictions = []
mask = torch.ones(8, 24, dtype=torch.long, device="tpu")  # every sequence is full length
with torch.no_grad():
    for _ in range(3):
        ids = torch.randint(0, 200, (8, 24)).to("tpu")
        predictions.append(model(input_ids=ids, attention_mask=mask).logits.argmax(-1))
print(torch.cat(predictions).cpu().tolist())
