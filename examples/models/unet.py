"""A diffusion UNet (sinusoidal time embedding, residual blocks with group norm conditioned
on the time, self-attention at the lowest resolution, down and up blocks with skip
connections) on the `tpu` device: one denoising training step (noise an image at a random
timestep of a linear beta schedule, predict the noise), eagerly or compiled, checked against CPU.

    python examples/models/unet.py [--mode eager|compiled]
    tpu-debug run examples/models/unet.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.models import _harness  # noqa: E402

CH, TIME_DIM, STEPS, GROUPS = (16, 32), 32, 1000, 4


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(TIME_DIM, cout)
        self.norm2 = nn.GroupNorm(GROUPS, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class Attention(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        att = F.scaled_dot_product_attention(q.transpose(1, 2)[:, None], k.transpose(1, 2)[:, None], v.transpose(1, 2)[:, None])
        return x + self.out(att[:, 0].transpose(1, 2).reshape(b, c, h, w))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        c0, c1 = CH
        self.time_mlp = nn.Sequential(nn.Linear(TIME_DIM, TIME_DIM), nn.SiLU(), nn.Linear(TIME_DIM, TIME_DIM))
        self.inp = nn.Conv2d(3, c0, 3, padding=1)
        self.down0 = ResBlock(c0, c0)
        self.downsample = nn.Conv2d(c0, c0, 3, stride=2, padding=1)
        self.down1 = ResBlock(c0, c1)
        self.mid = ResBlock(c1, c1)
        self.mid_attn = Attention(c1)
        self.up1 = ResBlock(2 * c1, c1)
        self.up0 = ResBlock(c1 + c0, c0)
        self.out = nn.Sequential(nn.GroupNorm(GROUPS, c0), nn.SiLU(), nn.Conv2d(c0, 3, 3, padding=1))

    def forward(self, x, t):
        temb = self.time_mlp(timestep_embedding(t, TIME_DIM))
        h0 = self.down0(self.inp(x), temb)
        h1 = self.down1(self.downsample(h0), temb)
        h = self.mid_attn(self.mid(h1, temb))
        h = self.up1(torch.cat([h, h1], 1), temb)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = self.up0(torch.cat([h, h0], 1), temb)
        return self.out(h)


def make_batch():
    g = torch.Generator().manual_seed(5)
    images = torch.randn(2, 3, 16, 16, generator=g)
    t = torch.randint(0, STEPS, (2,), generator=g)
    noise = torch.randn(images.shape, generator=g)
    return images, t, noise


def loss_of(model, batch):
    """DDPM's objective: x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise; predict the noise."""
    images, t, noise = batch
    betas = torch.linspace(1e-4, 0.02, STEPS, device=images.device)
    abar = torch.cumprod(1 - betas, 0)[t][:, None, None, None]
    noisy = abar.sqrt() * images + (1 - abar).sqrt() * noise
    pred = model(noisy, t)
    return pred, F.mse_loss(pred, noise)


def run(mode: str) -> _harness.Comparison:
    return _harness.compare(UNet, make_batch, loss_of, mode)


def main(argv: list[str] | None = None) -> int:
    return _harness.main_for(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
