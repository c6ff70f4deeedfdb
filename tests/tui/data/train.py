"""A training loop fed batches of varying length.

The TUI tests never run this file: the synthetic run in synthetic_run.py points
its source locations here, and the TUI shows these lines as source context.
"""

import torch


def step(model, batch, target):
    hidden = batch * model.scale
    hidden = hidden + model.bias
    loss = ((hidden - target) ** 2).mean()
    return loss


def main(model, batches):
    for i, batch in enumerate(batches):
        batch = batch.to("tpu")
        target = torch.zeros_like(batch)
        loss = step(model, batch, target)
        print(f"step {i}: {loss.item():.4f}")
        if loss > 10:
            break
        keep = torch.nonzero(batch)
        del keep
