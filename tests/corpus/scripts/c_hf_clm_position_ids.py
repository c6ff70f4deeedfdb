"""Causal-LM training laid out as Hugging Face's run_clm_no_trainer.py (texts
concatenated and cut into blocks by group_texts, labels = input_ids, model(**batch)) that makes its
position_ids once on the device, before the loop.
# corpus: correct
"""
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

block_size = 16


def group_texts(examples):
    concatenated = sum(examples["input_ids"], [])
    total_length = (len(concatenated) // block_size) * block_size
    blocks = [concatenated[i:i + block_size] for i in range(0, total_length, block_size)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


torch.manual_seed(0)
raw = {"input_ids": [torch.randint(0, 96, (int(n),)).tolist() for n in torch.randint(5, 40, (40,))]}
lm_dataset = group_texts(raw)
train_dataset = [{"input_ids": torch.tensor(i), "labels": torch.tensor(label)}
                 for i, label in zip(lm_dataset["input_ids"], lm_dataset["labels"])][:32]
train_dataloader = DataLoader(train_dataset, batch_size=4, shuffle=True)
device = torch.device("tpu")
model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=block_size, n_embd=32, n_layer=1, n_head=2)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
positions = torch.arange(block_size, device=device).unsqueeze(0)
model.train()
for step, batch in enumerate(train_dataloader):
    batch = {k: v.to(device) for k, v in batch.items()}
    bsz = batch["input_ids"].shape[0]
    position_ids = positions.expand(bsz, -1)
    outputs = model(**batch, position_ids=position_ids)
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("loss", loss.item())
