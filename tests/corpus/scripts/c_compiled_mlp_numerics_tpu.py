"""A float32 classifier compiled with torch.compile, trained under TPU numerics with the
divergence check: its matmuls differ from CPU's float32 only within bfloat16's precision.
# corpus: correct
# corpus-options: --numerics tpu --divergence
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 6)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = torch.compile(lambda x, y: nn.functional.cross_entropy(model(x), y), backend="tpu_debug")
features, labels = torch.randn(4, 32, 24), torch.randint(0, 6, (4, 32))
for step in range(4):
    x, y = features[step].to("tpu"), labels[step].to("tpu")
    opt.zero_grad()
    loss = loss_fn(x, y)
    loss.backward()
    opt.step()
print("loss", loss.item())
