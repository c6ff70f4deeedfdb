"""Planted: a projection of raw features near 1e5, run with a TPU's default matmul precision (bfloat16
inputs). bfloat16 keeps 8 bits of mantissa: the product is off by hundreds, far beyond float32
rounding, and the divergence check must find it at the projection's line.
# corpus-options: --divergence --numerics tpu
"""
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(128, 16).to("tpu")
total = torch.zeros((), device="tpu")
with torch.no_grad():
    for step in range(3):
        feats = (1e5 + 10 * torch.randn(32, 128)).to("tpu")
        out = proj(feats)  # EXPECT: divergence
        total += out.mean()
print("mean", total.item() / 3)
