"""An eager op-by-op step that updates 200 small parameter tensors one at a time in a Python loop,
thousands of tiny dispatches per step. Fix: torch.compile the step (or use a foreach optimizer)."""

import torch

import tpu_debug  # noqa: F401

torch.manual_seed(0)
params = [torch.randn(4, device="tpu", requires_grad=True) for _ in range(200)]
for step in range(3):
    loss = sum((p * p).sum() for p in params)  # EXPECT: eager_tiny_ops
    loss.backward()  # EXPECT: eager_tiny_ops
    with torch.no_grad():
        for p in params:
            p -= 0.01 * p.grad
            p.grad = None
print(loss.item())
