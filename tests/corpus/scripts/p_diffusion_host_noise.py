"""A denoising diffusion training loop (DDPM's epsilon objective) that draws its noise and
timesteps on the host at every step and copies them to the device.
Fix: draw them on the device: torch.randn_like(x0), torch.randint(..., device=x0.device)."""
import torch
from torch import nn

torch.manual_seed(0)
T = 100
betas = torch.linspace(1e-4, 0.02, T)
alphas_bar = torch.cumprod(1 - betas, dim=0).to("tpu")


class Denoiser(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.time = nn.Embedding(T, 64)
        self.net = nn.Sequential(nn.Linear(dim + 64, 128), nn.SiLU(), nn.Linear(128, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, self.time(t)], dim=1))


model = Denoiser().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
data = torch.randn(256, 32)
for step in range(10):
    x0 = data[(step * 16) % 256:(step * 16) % 256 + 16].to("tpu")
    t = torch.randint(0, T, (16,)).to("tpu")  # EXPECT: h2d_every_step/timesteps
    noise = torch.randn(16, 32).to("tpu")  # EXPECT: h2d_every_step/noise
    a = alphas_bar[t].unsqueeze(1)
    xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
    loss = nn.functional.mse_loss(model(xt, t), noise)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
