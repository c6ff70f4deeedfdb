"""Planted: a denoiser trained as diffusers' train_unconditional.py / train_text_to_image.py
train it (DDPMScheduler.add_noise, noise from randn_like, the epsilon objective), but the
timesteps are drawn with the host's generator at every step; add_noise copies them to the
device. Fix: torch.randint(..., device=clean_images.device).
"""
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from torch import nn


class TinyDenoiser(nn.Module):
    def __init__(self, channels=3, hidden=16, num_train_timesteps=100):
        super().__init__()
        self.time_embedding = nn.Embedding(num_train_timesteps, hidden)
        self.conv_in = nn.Conv2d(channels, hidden, 3, padding=1)
        self.conv_out = nn.Conv2d(hidden, channels, 3, padding=1)

    def forward(self, sample, timestep):
        h = self.conv_in(sample) + self.time_embedding(timestep)[:, :, None, None]
        return self.conv_out(F.silu(h))


torch.manual_seed(0)
noise_scheduler = DDPMScheduler(num_train_timesteps=100)
device = torch.device("tpu")
model = TinyDenoiser().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-2)
dataset = torch.randn(64, 3, 8, 8)
for step in range(8):
    clean_images = dataset[step * 8:(step + 1) * 8].to(device)
    noise = torch.randn_like(clean_images)
    bsz = clean_images.shape[0]
    timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,)).long()  # EXPECT: h2d_every_step
    noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
    model_pred = model(noisy_images, timesteps.to(device))
    loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("loss", loss.item())
