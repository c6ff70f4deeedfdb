"""A tiny Stable-Diffusion-shaped pipeline on `tpu` (a ``UNet2DConditionModel`` denoising
latents for 3 Euler steps, then ``AutoencoderKL`` decoding them), eagerly and with both
models under ``torch.compile(backend="tpu_debug")``, against the same pipeline on CPU.

Tolerance: float32 throughout; the UNet's convolutions, group norms and attention sum a few
hundred products each, and XLA orders those sums differently from ATen, a few ulps per layer.
The three scheduler steps and the VAE's decoder carry those differences through ~20 layers on
values of order 1: 1e-4 absolute leaves room for that reordering, far below what a wrong
lowering does (1e-2 or more).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # set before diffusers imports huggingface_hub, which reads it once

diffusers = pytest.importorskip(
    "diffusers", reason='Hugging Face Diffusers is not installed (pip install -e ".[models]")'
)

ATOL = 1e-4
STEPS = 3


def _models():
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    vae = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 32),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=32,
        sample_size=16,
    )
    return unet.eval(), vae.eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 6, 32, generator=g)


@torch.no_grad()
def _pipeline(unet, vae, latents, text, unet_call=None, decode=None):
    """Euler denoising of ``latents`` conditioned on ``text``, then the VAE's decoder: the
    image and the final latents. The scheduler is deterministic (no churn), so `tpu` and CPU
    take the same path."""
    scheduler = diffusers.EulerDiscreteScheduler(num_train_timesteps=100)
    scheduler.set_timesteps(STEPS)
    latents = latents * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        noise = (unet if unet_call is None else unet_call)(model_input, t, encoder_hidden_states=text).sample
        latents = scheduler.step(noise, t, latents).prev_sample
    image = (vae.decode if decode is None else decode)(latents / vae.config.scaling_factor).sample
    return image, latents


_reference: list = []


def _cpu_reference():
    if not _reference:
        unet, vae = _models()
        latents, text = _inputs()
        _reference.append(_pipeline(unet, vae, latents, text))
    return _reference[0]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_denoise_and_decode_match_cpu(mode):
    ref_image, ref_latents = _cpu_reference()
    unet, vae = _models()
    unet, vae = unet.to("tpu"), vae.to("tpu")
    latents, text = _inputs()
    unet_call = decode = None
    if mode == "compiled":
        unet_call = torch.compile(unet, backend="tpu_debug")
        decode = torch.compile(vae.decode, backend="tpu_debug")
    image, out_latents = _pipeline(unet, vae, latents.to("tpu"), text.to("tpu"), unet_call, decode)
    assert image.device.type == "tpu"
    latent_err = (out_latents.cpu() - ref_latents).abs().max().item()
    image_err = (image.cpu() - ref_image).abs().max().item()
    assert latent_err <= ATOL, latent_err
    assert image_err <= ATOL, image_err
