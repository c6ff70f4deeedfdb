"""Planted: a DDPM training wrapper (the GaussianDiffusion layout of the denoising-diffusion
repositories) whose p_losses draws its noise with the host's generator and uploads it at every
step, inside the model's forward. Fix: torch.randn_like(x_start).
"""
import torch
from torch import nn


class GaussianDiffusion(nn.Module):
    def __init__(self, model, timesteps=50):
        super().__init__()
        self.model = model
        self.num_timesteps = timesteps
        alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.02, timesteps), 0)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt())
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1 - alphas_cumprod).sqrt())

    def q_sample(self, x_start, t, noise):
        return (self.sqrt_alphas_cumprod[t][:, None] * x_start
                + self.sqrt_one_minus_alphas_cumprod[t][:, None] * noise)

    def p_losses(self, x_start, t):
        noise = torch.randn(x_start.shape).to(x_start.device)  # EXPECT: h2d_every_step
        x_noisy = self.q_sample(x_start, t, noise)
        return nn.functional.mse_loss(self.model(x_noisy), noise)

    def forward(self, x):
        t = torch.randint(0, self.num_timesteps, (x.shape[0],), device=x.device).long()
        return self.p_losses(x, t)


torch.manual_seed(0)
diffusion = GaussianDiffusion(nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))).to("tpu")
opt = torch.optim.Adam(diffusion.parameters(), lr=1e-3)
data = torch.randn(512, 64).to("tpu")
for step in range(10):
    loss = diffusion(data[(step % 8) * 64:(step % 8 + 1) * 64])
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
