"""Planted: a sequence-classification fine-tune laid out as Hugging Face's run_glue_no_trainer.py
(a collate that pads each batch to its longest sentence, as DataCollatorWithPadding does,
model(**batch), outputs.loss, a linear schedule from get_scheduler): each batch has another
length, and every op of the step is compiled again for each. The finding may be at the call
that feeds the model the batch or at the model's first op on it, where the size enters its work.
Fix: pad to max_length (pad_to_max_length), or to a multiple of 8/16 (pad_to_multiple_of).
"""
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_scheduler
from transformers.modeling_outputs import SequenceClassifierOutput


class TinyForSequenceClassification(nn.Module):
    def __init__(self, vocab_size=120, hidden=32, num_labels=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.embeddings(input_ids) * attention_mask[..., None]  # EXPECT: dynamic_shape
        pooled = h.sum(1) / attention_mask.sum(1, keepdim=True)
        logits = self.classifier(pooled)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def collate(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["label"] for f in features])}


torch.manual_seed(0)
lengths = [12, 7, 5, 9, 4, 17, 8, 6, 11, 3, 21, 9, 6, 14, 5, 8, 26, 10, 7, 4, 9, 5, 12, 19, 6, 8, 15, 7, 23, 11, 4, 9]
train_dataset = [{"input_ids": torch.randint(1, 120, (n,)).tolist(), "label": n % 2} for n in lengths]
train_dataloader = DataLoader(train_dataset, batch_size=4, shuffle=True, collate_fn=collate)
device = torch.device("tpu")
model = TinyForSequenceClassification().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                             num_training_steps=len(train_dataloader))
model.train()
for step, batch in enumerate(train_dataloader):
    batch = {k: v.to(device) for k, v in batch.items()}
    outputs = model(**batch)  # EXPECT: dynamic_shape
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
print("loss", loss.item())
