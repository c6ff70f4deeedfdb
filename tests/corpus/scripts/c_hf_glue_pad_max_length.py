"""A sequence-classification fine-tune laid out as Hugging Face's run_glue_no_trainer.py with
--pad_to_max_length: the collate pads every batch to max_length, so every step has one shape
(model(**batch), outputs.loss, a linear schedule from get_scheduler).
# corpus: correct
"""
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_scheduler
from transformers.modeling_outputs import SequenceClassifierOutput

MAX_LENGTH = 32


class TinyForSequenceClassification(nn.Module):
    def __init__(self, vocab_size=120, hidden=32, num_labels=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.embeddings(input_ids) * attention_mask[..., None]
        pooled = h.sum(1) / attention_mask.sum(1, keepdim=True)
        logits = self.classifier(pooled)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def collate(features):
    ids = torch.zeros(len(features), MAX_LENGTH, dtype=torch.long)
    mask = torch.zeros(len(features), MAX_LENGTH, dtype=torch.long)
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
    outputs = model(**batch)
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
print("loss", loss.item())
